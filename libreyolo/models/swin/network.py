"""Swin Transformer (V1) image classifiers, sizes t, s and b.

Windowed self-attention with a learned relative position bias; every second block shifts its
windows by half a window so that information crosses window borders, and an additive mask keeps
tokens that the cyclic shift brought together from attending to each other. Layout and state-dict
keys follow the reference LibreYOLO checkpoints (channels-last tokens ``(B, H, W, C)``, a patch
merging step at the start of stages 2-4, ``head.fc``).

Any input size works: the patch embedding pads to a multiple of 4, a stage pads its token map to a
multiple of the window (padding is attention context, not masked, as in the reference), and patch
merging pads odd sizes. Which blocks shift is fixed when the network is built for its input size
(224 by default): a stage whose token map fits in one window at that size never shifts.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from libreyolo.kernels.attention import attention
from libreyolo.layers.mlp import Mlp

__all__ = ["SIZES", "SwinConfig", "SwinTransformer", "WindowAttention", "shifted_window_mask"]

# score added between tokens that only the cyclic shift made neighbours (exp(-100) is 0 in float32
# after softmax, and the value survives float16)
MASK_VALUE = -100.0


@dataclass(frozen=True)
class SwinConfig:
    embed_dim: int
    depths: tuple[int, ...]
    num_heads: tuple[int, ...]
    window: int = 7
    patch: int = 4
    mlp_ratio: float = 4.0
    eps: float = 1e-5


SIZES: dict[str, SwinConfig] = {
    "t": SwinConfig(96, (2, 2, 6, 2), (3, 6, 12, 24)),
    "s": SwinConfig(96, (2, 2, 18, 2), (3, 6, 12, 24)),
    "b": SwinConfig(128, (2, 2, 18, 2), (4, 8, 16, 32)),
}


def relative_position_index(window: int) -> torch.Tensor:
    """(w*w, w*w) index into the ((2w-1)^2, heads) bias table for every (query, key) pair of a window."""
    ys, xs = torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")
    coords = torch.stack([ys.flatten(), xs.flatten()])  # (2, N)
    rel = coords[:, :, None] - coords[:, None, :] + (window - 1)  # (2, N, N), each in [0, 2w-2]
    return rel[0] * (2 * window - 1) + rel[1]


def window_partition(x: torch.Tensor, window: int) -> torch.Tensor:
    """(B, H, W, C) with H, W multiples of ``window`` -> (B * nWindows, window * window, C)."""
    _, h, w, c = x.shape
    x = x.reshape(-1, h // window, window, w // window, window, c)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, window * window, c)


def window_merge(windows: torch.Tensor, window: int, h: int, w: int) -> torch.Tensor:
    """Inverse of :func:`window_partition`: (B * nWindows, window * window, C) -> (B, H, W, C)."""
    c = windows.shape[-1]
    x = windows.reshape(-1, h // window, w // window, window, window, c)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, h, w, c)


def shifted_window_mask(h: int, w: int, window: int, shift: int, device: torch.device | None = None) -> torch.Tensor:
    """(nWindows, N, N) additive mask for a padded ``h`` x ``w`` token map rolled by ``-shift``: 0 where query
    and key share a region, ``MASK_VALUE`` where only the roll made them neighbours.

    The regions are cut from the padded size, as the reference does (with padding, the rolled-in rows
    sit before the padding, so its masks are approximate there; we reproduce them, not fix them)."""
    def bands(n: int) -> torch.Tensor:  # 0 before the last window, 1 in it before the wrap, 2 after the wrap
        i = torch.arange(n, device=device)
        return (i >= n - window).to(torch.int64) + (i >= n - shift).to(torch.int64)

    region = (bands(h)[:, None] * 3 + bands(w)[None, :]).reshape(1, h, w, 1)
    region = window_partition(region, window).squeeze(-1)  # (nW, N)
    apart = region[:, :, None] != region[:, None, :]
    return torch.where(apart, MASK_VALUE, 0.0).to(torch.float32)


class WindowAttention(nn.Module):
    """Multi-head self-attention inside one window, with a learned relative position bias.

    ``fused_attn`` (default False) sends the product through fused SDPA; the default primitive
    path is what the reference computes. The bias (plus the shift mask) reaches SDPA as an additive
    mask. Both go through :func:`libreyolo.kernels.attention.attention`, which keeps the primitive
    ops while a graph is captured for export.
    """

    def __init__(self, dim: int, num_heads: int, window: int) -> None:
        super().__init__()
        self.dim = dim
        self.num_heads = num_heads
        self.window = window
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.fused_attn = False
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window - 1) ** 2, num_heads))
        self.register_buffer("relative_position_index", relative_position_index(window), persistent=False)
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def position_bias(self) -> torch.Tensor:
        """(heads, N, N) relative position bias of one window."""
        n = self.window * self.window
        table = self.relative_position_bias_table[self.relative_position_index.reshape(-1)]
        return table.reshape(n, n, self.num_heads).permute(2, 0, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x``: (B * nW, N, C) window tokens, windows of one image consecutive; ``mask``: (nW, N, N) or None."""
        bw, n, c = x.shape
        q, k, v = self.qkv(x).reshape(bw, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        bias = self.position_bias().unsqueeze(0)  # (1, heads, N, N)
        if mask is not None:
            windows = mask.shape[0]
            bias = (bias + mask.unsqueeze(1)).unsqueeze(0)  # (1, nW, heads, N, N)
            bias = bias.expand(bw // windows, -1, -1, -1, -1).reshape(bw, self.num_heads, n, n)
        out = attention(q, k, v, mask=bias.to(q.dtype), scale=self.scale, fused=self.fused_attn)
        return self.proj(out.transpose(1, 2).reshape(bw, n, c))


class SwinBlock(nn.Module):
    """Pre-norm (shifted) window attention and MLP, each with a residual; tokens stay (B, H, W, C)."""

    def __init__(self, dim: int, num_heads: int, window: int, shift: int, mlp_ratio: float, eps: float) -> None:
        super().__init__()
        self.window = window
        self.shift = shift
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = WindowAttention(dim, num_heads, window)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self._window_attention(self.norm1(x), mask if self.shift else None)
        return x + self.mlp(self.norm2(x))

    def _window_attention(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        # the reference rolls first and pads the rolled map (so padding sits after the wrapped rows)
        _, h, w, _ = x.shape
        if self.shift:
            x = torch.roll(x, shifts=(-self.shift, -self.shift), dims=(1, 2))
        pad_h, pad_w = -h % self.window, -w % self.window
        if pad_h or pad_w:
            x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))
        x = window_merge(self.attn(window_partition(x, self.window), mask), self.window, h + pad_h, w + pad_w)
        if pad_h or pad_w:
            x = x[:, :h, :w, :]
        if self.shift:
            x = torch.roll(x, shifts=(self.shift, self.shift), dims=(1, 2))
        return x.contiguous() if pad_h or pad_w else x


class PatchMerging(nn.Module):
    """2x2 neighbouring tokens -> one token with twice the channels (halves H and W)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim, eps=eps)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape
        if h % 2 or w % 2:
            x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2))
            h, w = h + h % 2, w + w % 2
        # channel order (row offset, column offset): (0, 0), (1, 0), (0, 1), (1, 1)
        x = x.reshape(b, h // 2, 2, w // 2, 2, c).permute(0, 1, 3, 4, 2, 5).reshape(b, h // 2, w // 2, 4 * c)
        return self.reduction(self.norm(x))


class SwinStage(nn.Module):
    def __init__(self, dim_in: int, dim: int, depth: int, num_heads: int, window: int, shift: int,
                 mlp_ratio: float, eps: float, merge: bool) -> None:
        super().__init__()
        self.window = window
        self.shift = shift
        self.downsample = PatchMerging(dim_in, eps) if merge else nn.Identity()
        self.blocks = nn.ModuleList(
            SwinBlock(dim, num_heads, window, shift if i % 2 else 0, mlp_ratio, eps) for i in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.downsample(x)
        mask = None
        if self.shift and len(self.blocks) > 1:
            _, h, w, _ = x.shape
            hp, wp = h + -h % self.window, w + -w % self.window
            mask = shifted_window_mask(hp, wp, self.window, self.shift, x.device)
        for block in self.blocks:
            x = block(x, mask)
        return x


class PatchEmbed(nn.Module):
    def __init__(self, patch: int, dim: int, eps: float) -> None:
        super().__init__()
        self.patch = patch
        self.proj = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)
        self.norm = nn.LayerNorm(dim, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        pad_h, pad_w = -h % self.patch, -w % self.patch
        if pad_h or pad_w:
            x = F.pad(x, (0, pad_w, 0, pad_h))
        return self.norm(self.proj(x).permute(0, 2, 3, 1))


class SwinClassifierHead(nn.Module):
    def __init__(self, dim: int, nc: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, nc)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.mean(dim=(1, 2)))


class SwinTransformer(nn.Module):
    """Swin classifier: ``forward(images)`` maps (B, 3, H, W) normalised images to (B, nc) logits."""

    def __init__(self, size: str = "t", nc: int = 1000, imgsz: int = 224) -> None:
        super().__init__()
        if size not in SIZES:
            raise ValueError(f"unknown swin size {size!r}; known sizes: {', '.join(SIZES)}")
        cfg = SIZES[size]
        self.size = size
        self.nc = nc
        self.config = cfg
        self.patch_embed = PatchEmbed(cfg.patch, cfg.embed_dim, cfg.eps)
        stages = []
        res = imgsz // cfg.patch
        for i, (depth, heads) in enumerate(zip(cfg.depths, cfg.num_heads, strict=True)):
            dim = cfg.embed_dim * 2 ** i
            if i:
                res = (res + 1) // 2
            # a stage whose token map fits in one window has nothing to shift across
            shift = 0 if res <= cfg.window else cfg.window // 2
            stages.append(SwinStage(dim // 2 if i else dim, dim, depth, heads, cfg.window, shift,
                                    cfg.mlp_ratio, cfg.eps, merge=i > 0))
        self.layers = nn.ModuleList(stages)
        self.num_features = cfg.embed_dim * 2 ** (len(cfg.depths) - 1)
        self.norm = nn.LayerNorm(self.num_features, eps=cfg.eps)
        self.head = SwinClassifierHead(self.num_features, nc)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        for stage in self.layers:
            x = stage(x)
        return self.head(self.norm(x))
