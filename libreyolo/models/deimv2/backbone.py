"""DEIMv2's ViT backbones (sizes s, m, l, x) with the spatial tuning adapter (STA).

A plain ViT (s: ``vit_tiny``, m: ``vit_tinyplus``; the ViT family's blocks plus RoPE) or a
DINOv3 ViT-S/16 (l: ``dinov3_vits16``, x: ``dinov3_vits16plus``; layer scale, four storage
tokens, a masked key bias, a final norm) runs at stride 16; three of its blocks
(``interaction_indexes``) are taken, resized bilinearly to strides 8, 16 and 32, concatenated with
the STA's detail maps (a small strided conv stem at the same strides), and projected by 1x1
convs + BatchNorms. Key names are the reference checkpoints' (``backbone.dinov3.*``,
``backbone.sta.*``, ``backbone.convs.*``, ``backbone.norms.*``).

Attention is the ViT family's :class:`~libreyolo.models.vit.network.Attention`; it keeps the
manual path by default here (``fused_attn=False``, docs/kernels.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from libreyolo.layers.rope import RopePositionEmbedding
from libreyolo.models.vit.network import Attention, Block, PatchEmbed

PATCH = 16


@dataclass(frozen=True)
class ViTSpec:
    dim: int
    heads: int
    depth: int = 12
    dino: bool = False          # the DINOv3 variant (layer scale, storage tokens, masked k bias, final norm)
    ffn: str = "mlp"            # "mlp" (GELU MLP, ratio 4) or "swiglu" (ratio 6)
    storage_tokens: int = 0


VITS: dict[str, ViTSpec] = {
    "vit_tiny": ViTSpec(192, 3),
    "vit_tinyplus": ViTSpec(256, 4),
    "dinov3_vits16": ViTSpec(384, 6, dino=True, storage_tokens=4),
    "dinov3_vits16plus": ViTSpec(384, 6, dino=True, ffn="swiglu", storage_tokens=4),
}


class ViT(nn.Module):
    """The plain ViT of sizes s and m; the reference nests its weights under ``_model``."""

    def __init__(self, spec: ViTSpec, take: tuple[int, ...]) -> None:
        super().__init__()
        self.take = tuple(take)
        self._model = nn.Module()
        self._model.patch_embed = PatchEmbed(spec.dim, PATCH)
        self._model.cls_token = nn.Parameter(torch.zeros(1, 1, spec.dim))
        self._model.blocks = nn.ModuleList(Block(spec.dim, spec.heads, fused_attn=False) for _ in range(spec.depth))
        self._model.rope_embed = RopePositionEmbedding(spec.dim, spec.heads)
        nn.init.trunc_normal_(self._model.cls_token, std=0.02)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Patch tokens (B, h*w, dim) of the blocks in ``take``."""
        m = self._model
        h, w = x.shape[2] // PATCH, x.shape[3] // PATCH
        x = m.patch_embed(x)
        x = torch.cat((m.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        rope = m.rope_embed(h, w)
        outs = []
        for i, blk in enumerate(m.blocks):
            x = blk(x, rope)
            if i in self.take:
                outs.append(x[:, 1:])
        return outs


class MaskedKBiasLinear(nn.Linear):
    """The qkv projection of DINOv3: its bias is multiplied by ``bias_mask`` (a buffer in the
    checkpoint: 1 for queries and values, 0 for keys). The reference leaves the mask NaN until a
    pretrained checkpoint fills it (its untrained models output NaN); here it starts as the
    trained pattern."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__(c_in, c_out)
        mask = torch.ones(c_out)
        mask[c_out // 3: 2 * c_out // 3] = 0.0
        self.register_buffer("bias_mask", mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias * self.bias_mask.to(self.bias.dtype))


class DinoAttention(Attention):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__(dim, heads, fused_attn=False)
        self.qkv = MaskedKBiasLinear(dim, 3 * dim)


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float = 1e-5) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class DinoMlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class SwiGLU(nn.Module):
    """``w3(silu(w1 x) * w2 x)``; the hidden width is 2/3 of ``hidden`` rounded up to a multiple of 8."""

    def __init__(self, dim: int, hidden: int, align: int = 8) -> None:
        super().__init__()
        d = int(hidden * 2 / 3)
        d += -d % align
        self.w1 = nn.Linear(dim, d)
        self.w2 = nn.Linear(dim, d)
        self.w3 = nn.Linear(d, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w3(F.silu(self.w1(x)) * self.w2(x))


class DinoBlock(nn.Module):
    def __init__(self, spec: ViTSpec) -> None:
        super().__init__()
        dim = spec.dim
        self.norm1 = nn.LayerNorm(dim, eps=1e-5)
        self.attn = DinoAttention(dim, spec.heads)
        self.ls1 = LayerScale(dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-5)
        self.mlp = SwiGLU(dim, 6 * dim) if spec.ffn == "swiglu" else DinoMlp(dim, 4 * dim)
        self.ls2 = LayerScale(dim)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x = x + self.ls1(self.attn(self.norm1(x), rope))
        return x + self.ls2(self.mlp(self.norm2(x)))


class DinoViT(nn.Module):
    """The DINOv3 ViT of sizes l and x; outputs are the taken blocks' patch tokens after ``norm``."""

    def __init__(self, spec: ViTSpec, take: tuple[int, ...]) -> None:
        super().__init__()
        self.take = tuple(take)
        self.storage = spec.storage_tokens
        self.cls_token = nn.Parameter(torch.zeros(1, 1, spec.dim))
        self.storage_tokens = nn.Parameter(torch.zeros(1, spec.storage_tokens, spec.dim))
        self.mask_token = nn.Parameter(torch.zeros(1, spec.dim))
        self.rope_embed = RopePositionEmbedding(spec.dim, spec.heads, rescale=2.0)
        self.patch_embed = PatchEmbed(spec.dim, PATCH)
        self.blocks = nn.ModuleList(DinoBlock(spec) for _ in range(spec.depth))
        self.norm = nn.LayerNorm(spec.dim, eps=1e-5)
        nn.init.normal_(self.cls_token, std=0.02)
        nn.init.normal_(self.storage_tokens, std=0.02)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h, w = x.shape[2] // PATCH, x.shape[3] // PATCH
        x = self.patch_embed(x)
        b = x.shape[0]
        cls = self.cls_token + 0 * self.mask_token  # as the reference builds it (keeps mask_token in the graph)
        x = torch.cat([cls.expand(b, -1, -1), self.storage_tokens.expand(b, -1, -1), x], dim=1)
        # the reference draws the training-time rope rescale anew for every block; in eval it is one table
        shared = None if self.training else self.rope_embed(h, w)
        outs = []
        for i, blk in enumerate(self.blocks):
            x = blk(x, shared if shared is not None else self.rope_embed(h, w))
            if i in self.take:
                outs.append(self.norm(x)[:, 1 + self.storage:])
        return outs


def _bn(c: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(c)  # SyncBatchNorm in the reference: the same state and eval numerics


class SpatialPrior(nn.Module):
    """The STA's detail branch: a conv stem to stride 4, then strided convs to strides 8, 16, 32."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, 2, 1, bias=False), _bn(c), nn.GELU(), nn.MaxPool2d(3, 2, 1))
        self.conv2 = nn.Sequential(nn.Conv2d(c, 2 * c, 3, 2, 1, bias=False), _bn(2 * c))
        self.conv3 = nn.Sequential(nn.GELU(), nn.Conv2d(2 * c, 4 * c, 3, 2, 1, bias=False), _bn(4 * c))
        self.conv4 = nn.Sequential(nn.GELU(), nn.Conv2d(4 * c, 4 * c, 3, 2, 1, bias=False), _bn(4 * c))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c2 = self.conv2(self.stem(x))
        c3 = self.conv3(c2)
        return c2, c3, self.conv4(c3)


class ViTAdapter(nn.Module):
    """ViT + STA -> three maps of ``hidden`` channels at strides 8, 16, 32."""

    def __init__(self, vit: str, take: tuple[int, ...], sta_channels: int, hidden: int | None = None) -> None:
        super().__init__()
        spec = VITS[vit]
        self.dinov3 = DinoViT(spec, take) if spec.dino else ViT(spec, take)
        self.sta = SpatialPrior(sta_channels)
        hidden = spec.dim if hidden is None else hidden
        c = sta_channels
        self.convs = nn.ModuleList(nn.Conv2d(spec.dim + k * c, hidden, 1, bias=False) for k in (2, 4, 4))
        self.norms = nn.ModuleList(_bn(hidden) for _ in range(3))
        self.out_channels = [hidden] * 3

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        b = x.shape[0]
        h, w = x.shape[2] // PATCH, x.shape[3] // PATCH
        layers = self.dinov3(x)
        if len(layers) == 1:
            layers = layers * 3
        extra = len(layers) - 2
        details = self.sta(x)
        outs = []
        for i, (tokens, detail) in enumerate(zip(layers, details, strict=True)):
            feat = tokens.transpose(1, 2).reshape(b, -1, h, w).contiguous()
            size = [int(h * 2 ** (extra - i)), int(w * 2 ** (extra - i))]
            feat = F.interpolate(feat, size=size, mode="bilinear", align_corners=False)
            outs.append(self.norms[i](self.convs[i](torch.cat([feat, detail], dim=1))))
        return outs
