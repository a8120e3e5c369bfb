"""SegFormer (Xie et al., NeurIPS 2021): a Mix Transformer (MiT) encoder and an all-MLP decode head,
key-for-key compatible with the checkpoints written by the reference LibreYOLO library 1.6.0.

Encoder: four stages, each an overlapping patch embedding (a strided convolution whose kernel is
wider than its stride, then LayerNorm), pre-norm transformer blocks and a closing LayerNorm. A
block's attention shrinks its keys and values by ``sr`` in each direction with a strided
convolution (plus LayerNorm), so stage 1 attends over 1/64 of its tokens; its feed-forward mixes
in position through a depthwise 3x3 convolution between the two linears (Mix-FFN), which is why
the network needs no position embedding and takes any input that is a multiple of 32.

Decode head: every stage is projected to one width by a linear, resized to the stage-1 grid (1/4
of the input), concatenated deepest first, fused by a 1x1 convolution with BatchNorm and ReLU,
and classified per pixel by another 1x1 convolution.

The network takes RGB in [0, 1] and applies the ImageNet mean/std itself (buffers that are not
part of the state dict), so every pipeline feeds it the same tensor. :meth:`SegFormer.forward_logits`
returns the head's logits at 1/4 resolution (what training uses); :meth:`SegFormer.forward`
resizes them bilinearly to the input size (what inference and export return).

Every LayerNorm uses eps 1e-5: the published configs carry 1e-6, but the reference builds its
norms with PyTorch's default and its checkpoints reproduce only with that.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from libreyolo.kernels.attention import attention
from libreyolo.ops.classify import IMAGENET_MEAN, IMAGENET_STD

NORM_EPS = 1e-5
INIT_STD = 0.02
DROP_PATH_RATE = 0.1      # stochastic depth, rising linearly over all blocks (training only)
HEAD_DROPOUT = 0.1        # before the classifier (training only)
PATCH_KERNELS = (7, 3, 3, 3)
PATCH_STRIDES = (4, 2, 2, 2)
HEADS = (1, 2, 5, 8)
SR_RATIOS = (8, 4, 2, 1)
MLP_RATIO = 4


@dataclass(frozen=True)
class SegFormerSize:
    depths: tuple[int, int, int, int]
    dims: tuple[int, int, int, int]
    decoder_dim: int


_WIDE = (64, 128, 320, 512)
SIZES: dict[str, SegFormerSize] = {
    "b0": SegFormerSize((2, 2, 2, 2), (32, 64, 160, 256), 256),
    "b1": SegFormerSize((2, 2, 2, 2), _WIDE, 256),
    "b2": SegFormerSize((3, 4, 6, 3), _WIDE, 768),
    "b3": SegFormerSize((3, 4, 18, 3), _WIDE, 768),
    "b4": SegFormerSize((3, 8, 27, 3), _WIDE, 768),
    "b5": SegFormerSize((3, 6, 40, 3), _WIDE, 768),
}


def tokens_to_map(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """(B, h*w, C) tokens -> (B, C, h, w) feature map."""
    return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], h, w)


def drop_path(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Stochastic depth: drop the whole residual branch of a sample with probability ``p``."""
    if p == 0.0 or not training:
        return x
    keep = 1.0 - p
    mask = torch.empty((x.shape[0],) + (1,) * (x.ndim - 1), dtype=x.dtype, device=x.device).bernoulli_(keep)
    return x * mask / keep


class PatchEmbed(nn.Module):
    """Overlapping patches: a convolution with kernel > stride and half-kernel padding, then LayerNorm."""

    def __init__(self, cin: int, dim: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(cin, dim, kernel, stride=stride, padding=kernel // 2)
        self.layer_norm = nn.LayerNorm(dim, eps=NORM_EPS)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
        x = self.proj(x)
        h, w = x.shape[-2:]
        return self.layer_norm(x.flatten(2).transpose(1, 2)), h, w


class SequenceReduction(nn.Module):
    """Keys and values from an ``sr`` x ``sr`` strided convolution of the token map, then LayerNorm."""

    def __init__(self, dim: int, sr: int) -> None:
        super().__init__()
        self.sequence_reduction = nn.Conv2d(dim, dim, sr, stride=sr)
        self.layer_norm = nn.LayerNorm(dim, eps=NORM_EPS)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        x = self.sequence_reduction(tokens_to_map(x, h, w))
        return self.layer_norm(x.flatten(2).transpose(1, 2))


class EfficientAttention(nn.Module):
    """Multi-head attention of every token over the spatially reduced tokens.

    ``fused_attn`` (default False) sends the product through fused SDPA; the default primitive
    path is what the reference computes, and on the CPU SDPA differs from it in the last bits
    (docs/kernels.md). Both go through :func:`libreyolo.kernels.attention.attention`, which keeps
    the primitive ops while a graph is captured for export.
    """

    def __init__(self, dim: int, heads: int, sr: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"embedding dim {dim} is not divisible by {heads} heads")
        self.heads = heads
        self.head_dim = dim // heads
        self.scale = self.head_dim ** -0.5
        self.fused_attn = False
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.o_proj = nn.Linear(dim, dim)
        self.sequence_reduction = SequenceReduction(dim, sr) if sr > 1 else None

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], x.shape[1], self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        b, n, c = x.shape
        kv = x if self.sequence_reduction is None else self.sequence_reduction(x, h, w)
        q, k, v = self._split(self.q_proj(x)), self._split(self.k_proj(kv)), self._split(self.v_proj(kv))
        out = attention(q, k, v, scale=self.scale, fused=self.fused_attn)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, c))


class DepthwiseConv(nn.Module):
    """The Mix-FFN's 3x3 depthwise convolution over the token map (its only source of position)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        return self.dwconv(tokens_to_map(x, h, w)).flatten(2).transpose(1, 2)


class MixFFN(nn.Module):
    """fc1 -> depthwise 3x3 -> GELU (exact) -> fc2."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.dwconv = DepthwiseConv(hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        return self.fc2(F.gelu(self.dwconv(self.fc1(x), h, w)))


class Block(nn.Module):
    """Pre-norm attention and Mix-FFN, each a residual branch with stochastic depth."""

    def __init__(self, dim: int, heads: int, sr: int, drop: float) -> None:
        super().__init__()
        self.drop = drop
        self.layernorm_before = nn.LayerNorm(dim, eps=NORM_EPS)
        self.attention = EfficientAttention(dim, heads, sr)
        self.layernorm_after = nn.LayerNorm(dim, eps=NORM_EPS)
        self.mlp = MixFFN(dim, dim * MLP_RATIO)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        x = x + drop_path(self.attention(self.layernorm_before(x), h, w), self.drop, self.training)
        return x + drop_path(self.mlp(self.layernorm_after(x), h, w), self.drop, self.training)


class Stage(nn.Module):
    """Patch embedding, blocks and a LayerNorm; returns the (B, C, h, w) feature map."""

    def __init__(self, cin: int, dim: int, index: int, drops: list[float]) -> None:
        super().__init__()
        self.patch_embeddings = PatchEmbed(cin, dim, PATCH_KERNELS[index], PATCH_STRIDES[index])
        self.blocks = nn.ModuleList(Block(dim, HEADS[index], SR_RATIOS[index], p) for p in drops)
        self.layer_norm = nn.LayerNorm(dim, eps=NORM_EPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, h, w = self.patch_embeddings(x)
        for block in self.blocks:
            x = block(x, h, w)
        return tokens_to_map(self.layer_norm(x), h, w)


class MixTransformer(nn.Module):
    """The MiT encoder: four feature maps at strides 4, 8, 16 and 32."""

    def __init__(self, spec: SegFormerSize) -> None:
        super().__init__()
        total = sum(spec.depths)
        rates = [DROP_PATH_RATE * i / max(total - 1, 1) for i in range(total)]
        stages, cin, first = [], 3, 0
        for i, (depth, dim) in enumerate(zip(spec.depths, spec.dims, strict=True)):
            stages.append(Stage(cin, dim, i, rates[first:first + depth]))
            cin, first = dim, first + depth
        self.stages = nn.ModuleList(stages)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        features = []
        for stage in self.stages:
            x = stage(x)
            features.append(x)
        return features


class StageProjection(nn.Module):
    """One stage's channels to the decoder width (a linear over each pixel's feature)."""

    def __init__(self, cin: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(cin, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        return tokens_to_map(self.proj(x.flatten(2).transpose(1, 2)), h, w)


class DecodeHead(nn.Module):
    """All-MLP head: project, resize to the stage-1 grid, concatenate deepest first, fuse, classify."""

    def __init__(self, dims: tuple[int, ...], width: int, nc: int) -> None:
        super().__init__()
        self.linear_projections = nn.ModuleList(StageProjection(d, width) for d in dims)
        self.linear_fuse = nn.Conv2d(width * len(dims), width, 1, bias=False)
        self.batch_norm = nn.BatchNorm2d(width)
        self.dropout = nn.Dropout(HEAD_DROPOUT)
        self.classifier = nn.Conv2d(width, nc, 1)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        size = features[0].shape[-2:]
        maps = [F.interpolate(proj(f), size=size, mode="bilinear", align_corners=False)
                for f, proj in zip(features, self.linear_projections, strict=True)]
        x = torch.relu(self.batch_norm(self.linear_fuse(torch.cat(maps[::-1], dim=1))))
        return self.classifier(self.dropout(x))


def init_weights(module: nn.Module) -> None:
    """The reference initialisation: normal(0, 0.02) weights and zero biases for linears and
    convolutions, identity norms. PyTorch's defaults are far wider at the narrow stages, and this
    family is meant to train from scratch too."""
    if isinstance(module, (nn.Linear, nn.Conv2d)):
        nn.init.normal_(module.weight, std=INIT_STD)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, (nn.LayerNorm, nn.BatchNorm2d)):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class SegFormer(nn.Module):
    """``images`` (B, 3, H, W) RGB in [0, 1], H and W multiples of 32 -> logits (B, nc, H, W)."""

    def __init__(self, size: str, nc: int) -> None:
        super().__init__()
        if size not in SIZES:
            raise ValueError(f"unknown SegFormer size {size!r}; known sizes: {', '.join(SIZES)}")
        spec = SIZES[size]
        self.size = size
        self.nc = int(nc)
        self.encoder = MixTransformer(spec)
        self.decode_head = DecodeHead(spec.dims, spec.decoder_dim, self.nc)
        self.apply(init_weights)
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def forward_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits at the head's native resolution, (B, nc, H/4, W/4): what training uses."""
        x = (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)
        return self.decode_head(self.encoder(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits resized bilinearly to the input, (B, nc, H, W): what inference and export return."""
        return F.interpolate(self.forward_logits(x), size=x.shape[-2:], mode="bilinear", align_corners=False)
