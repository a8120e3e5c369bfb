"""RF-DETR's backbone encoder: DINOv2 (ViT-S/16 here) with windowed attention.

The patch grid is cut into ``windows x windows`` windows, each with its own copy of the class
token; most blocks attend inside a window, the blocks that produce an output feature attend over
the whole image (all windows' tokens, class-token copies included). The outputs are the
final-LayerNorm'd token maps after the selected blocks, (B, C, H / 16, W / 16) each.

Module names are the reference checkpoint's (``encoder.embeddings``, ``encoder.encoder.layer.N``
with ``attention.attention.{query,key,value}``, ``attention.output.dense``,
``layer_scale{1,2}.lambda1``, ``mlp.fc{1,2}``, ``encoder.layernorm``). The position table is
learned for ``pe_size x pe_size`` patches (the size's native resolution / 16); other input sizes
resize it (bicubic, antialiased), as the reference does.

Attention goes through :func:`libreyolo.kernels.attention.attention`; ``fused_attn`` (default
False, see docs/kernels.md) opts in to SDPA.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from libreyolo.kernels.attention import attention
from libreyolo.layers.mlp import Mlp
from libreyolo.models.detr_shared.anchors import ShapeCache

NORM_EPS = 1e-6


@functools.lru_cache(maxsize=32)
def aa_bicubic_weights(src: int, dst: int) -> np.ndarray:
    """(dst, src) float32 weights of PyTorch's antialiased bicubic resize along one axis
    (``F.interpolate(mode="bicubic", antialias=True, align_corners=False)``, which the reference
    uses): Keys' cubic with a = -0.5, its support widened by the scale when shrinking, each row
    normalised; computed with PyTorch's float32/double mix, so the weights are its own."""
    f32 = np.float32
    scale = f32(f32(src) / f32(dst))
    support = f32(2.0 * float(scale)) if scale >= 1.0 else f32(2.0)
    inv = f32(1.0 / float(scale)) if scale >= 1.0 else f32(1.0)

    def cubic(x: float) -> float:
        a, x = -0.5, abs(x)
        if x < 1.0:
            return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
        return (((x - 5.0) * x + 8.0) * x - 4.0) * a if x < 2.0 else 0.0

    out = np.zeros((dst, src), dtype=np.float32)
    for i in range(dst):
        centre = f32(float(scale) * (i + 0.5))
        lo = max(int(float(f32(centre - support)) + 0.5), 0)
        hi = min(int(float(f32(centre + support)) + 0.5), src)
        taps = [f32(cubic(float(f32((float(f32(f32(j) - centre)) + 0.5) * float(inv))))) for j in range(lo, hi)]
        total = f32(0.0)
        for t in taps:
            total = f32(total + t)
        out[i, lo:hi] = [f32(t / total) for t in taps]
    return out


class PatchEmbeddings(nn.Module):
    def __init__(self, dim: int, patch: int) -> None:
        super().__init__()
        self.projection = nn.Conv2d(3, dim, patch, patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(x).flatten(2).transpose(1, 2)


class Embeddings(nn.Module):
    """Patch embedding, class token and position table; tokens regrouped per window."""

    def __init__(self, dim: int, patch: int, pe_size: int, windows: int) -> None:
        super().__init__()
        self.patch, self.windows, self.pe_size = patch, windows, pe_size
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        # masked pretraining only: kept for checkpoints, frozen (no forward reads it, and a trainable
        # parameter without a gradient would stall DDP's gradient reduction)
        self.mask_token = nn.Parameter(torch.zeros(1, dim), requires_grad=False)
        self.patch_embeddings = PatchEmbeddings(dim, patch)
        self.position_embeddings = nn.Parameter(torch.zeros(1, pe_size * pe_size + 1, dim))
        self._weights = ShapeCache()  # resize weights per (h, w, device)

    def positions(self, h: int, w: int) -> torch.Tensor:
        """The position table for an ``h x w`` patch grid (1, 1 + h * w, C): the learned grid
        resized with antialiased bicubic weights (:func:`aa_bicubic_weights`), as two matrix
        products, so every exporter carries it (ONNX opset 17 has no antialiased resize)."""
        table = self.position_embeddings
        if h == w == self.pe_size:
            return table
        s, c = self.pe_size, table.shape[-1]
        # the weight matrices are constants of the shape: built and copied to the device once per
        # shape (a CUDA graph's warm-up does it before capture; no host copy inside a captured forward)
        wy, wx = self._weights.get((h, w, str(table.device)), lambda: (
            torch.from_numpy(aa_bicubic_weights(s, h)).to(table.device, torch.float32),
            torch.from_numpy(aa_bicubic_weights(s, w)).to(table.device, torch.float32)))
        grid = table[0, 1:].float().reshape(s, s * c)
        rows = torch.matmul(wy, grid).reshape(h, s, c).transpose(0, 1).reshape(s, h * c)
        grid = torch.matmul(wx, rows).reshape(w, h, c).transpose(0, 1).reshape(1, h * w, c).to(table.dtype)
        return torch.cat([table[:, :1], grid], dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, height, width = x.shape
        h, w = height // self.patch, width // self.patch
        tokens = self.patch_embeddings(x.to(self.patch_embeddings.projection.weight.dtype))
        tokens = torch.cat([self.cls_token.expand(b, -1, -1), tokens], dim=1) + self.positions(h, w)
        n = self.windows
        if n > 1:
            cls, pix = tokens[:, :1], tokens[:, 1:]
            pix = pix.reshape(b * n, h // n, n, w // n, -1).permute(0, 2, 1, 3, 4)
            pix = pix.reshape(b * n * n, (h // n) * (w // n), -1)
            tokens = torch.cat([cls.repeat(n * n, 1, 1), pix], dim=1)
        return tokens


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.fused_attn = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = (proj(x).view(b, n, self.heads, c // self.heads).permute(0, 2, 1, 3)
                   for proj in (self.query, self.key, self.value))
        out = attention(q, k, v, fused=self.fused_attn)
        return out.permute(0, 2, 1, 3).reshape(b, n, c)


class Dense(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dense = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense(x)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attention = SelfAttention(dim, heads)
        self.output = Dense(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.attention(x))


class LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.lambda1 = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.lambda1


class Layer(nn.Module):
    """Pre-norm block with layer scale; ``full`` attends over every window of an image at once."""

    def __init__(self, dim: int, heads: int, windows: int, full: bool) -> None:
        super().__init__()
        self.windows, self.full = windows, full
        self.norm1 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.attention = Attention(dim, heads)
        self.layer_scale1 = LayerScale(dim)
        self.norm2 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.mlp = Mlp(dim, 4 * dim)
        self.layer_scale2 = LayerScale(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        bw, t, c = x.shape
        n2 = self.windows ** 2
        y = self.norm1(x)
        if self.full:
            y = y.view(bw // n2, n2 * t, c)
        y = self.attention(y)
        if self.full:
            y = y.view(bw, t, c)
        x = self.layer_scale1(y) + shortcut
        return self.layer_scale2(self.mlp(self.norm2(x))) + x


class Blocks(nn.Module):
    def __init__(self, layers: Sequence[Layer]) -> None:
        super().__init__()
        self.layer = nn.ModuleList(layers)


class WindowedDinov2(nn.Module):
    def __init__(self, dim: int, depth: int, heads: int, patch: int, pe_size: int, windows: int,
                 out_indices: Sequence[int]) -> None:
        super().__init__()
        self.patch, self.windows = patch, windows
        self.out_indices = tuple(out_indices)  # stage i = the tokens after block i (1-based)
        self.embeddings = Embeddings(dim, patch, pe_size, windows)
        self.encoder = Blocks([Layer(dim, heads, windows, i in self.out_indices) for i in range(depth)])
        self.layernorm = nn.LayerNorm(dim, eps=NORM_EPS)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        b, _, height, width = x.shape
        block = self.patch * self.windows
        if height % block or width % block:
            raise ValueError(f"RF-DETR's backbone needs input sides divisible by {block} (patch {self.patch} x "
                             f"{self.windows} windows), got {height}x{width}")
        h, w, n = height // self.patch, width // self.patch, self.windows
        tokens = self.embeddings(x)
        out = []
        for i, layer in enumerate(self.encoder.layer, start=1):
            tokens = layer(tokens)
            if i in self.out_indices:
                pix = self.layernorm(tokens)[:, 1:]
                c = pix.shape[-1]
                if n > 1:
                    pix = pix.reshape(b * n, n, h // n, w // n, c).permute(0, 2, 1, 3, 4)
                out.append(pix.reshape(b, h, w, c).permute(0, 3, 1, 2).contiguous())
        return out


class DinoV2Encoder(nn.Module):
    """``backbone.0.encoder``: holds the DINOv2 under ``encoder`` (the reference's nesting)."""

    def __init__(self, **kw) -> None:
        super().__init__()
        self.encoder = WindowedDinov2(**kw)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self.encoder(x)
