"""Vision Transformer (ViT, and DeiT which shares it), key-for-key compatible with the
checkpoints written by the reference LibreYOLO library 1.6.0.

Patch embedding (16x16 convolution), a learnt class token and position embedding for a fixed
224x224 input, pre-norm transformer blocks (LayerNorm eps 1e-6, exact GELU, MLP ratio 4), a
final LayerNorm and a linear head on the class token. The forward returns logits and never
reads a value back to the host, so it can be captured in a CUDA graph.

Attention goes through :func:`libreyolo.kernels.attention.attention`: fused SDPA when the
module's ``fused_attn`` flag is on (the default, as upstream) and the call is not being
captured for an export; the primitive matmul-softmax-matmul expression otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from libreyolo.kernels.attention import attention
from libreyolo.layers.mlp import Mlp
from libreyolo.layers.rope import apply_rope

PATCH_SIZE = 16
IMG_SIZE = 224
MLP_RATIO = 4
NORM_EPS = 1e-6


@dataclass(frozen=True)
class ViTSize:
    embed_dim: int
    depth: int
    num_heads: int


VIT_SIZES = {
    "ti": ViTSize(192, 12, 3),
    "s": ViTSize(384, 12, 6),
    "b": ViTSize(768, 12, 12),
    "l": ViTSize(1024, 24, 16),
}


class Attention(nn.Module):
    """Multi-head self-attention; ``fused_attn`` picks SDPA (True) or primitive ops (False).

    ``rope`` (optional, DEIMv2's ViT backbones): the ``(sin, cos)`` of
    :class:`~libreyolo.layers.rope.RopePositionEmbedding`, applied to the queries and keys of the
    patch tokens; without it (the ViT family) nothing changes."""

    def __init__(self, dim: int, num_heads: int, fused_attn: bool = True) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"embedding dim {dim} is not divisible by {num_heads} heads")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.fused_attn = fused_attn
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        b, n, c = x.shape
        # q, k and v are thirds of the channel axis, each (B, N, heads, d) -> (B, heads, N, d): views of the
        # same values a (B, N, 3, heads, d) split gives, with no tensor above rank 4 (NCNN holds 4 axes)
        q, k, v = (t.reshape(b, n, self.num_heads, self.head_dim).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        if rope is not None:
            q, k = apply_rope(q, k, rope)
        x = attention(q, k, v, scale=self.scale, fused=self.fused_attn)
        return self.proj(x.transpose(1, 2).reshape(b, n, c))


class Block(nn.Module):
    def __init__(self, dim: int, num_heads: int, fused_attn: bool = True) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.attn = Attention(dim, num_heads, fused_attn)
        self.norm2 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.mlp = Mlp(dim, dim * MLP_RATIO)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rope)
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    def __init__(self, dim: int, patch: int = PATCH_SIZE) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # (B, tokens, dim)


class VisionTransformer(nn.Module):
    """``images`` (B, 3, 224, 224), normalised -> logits (B, nc)."""

    def __init__(self, spec: ViTSize, nc: int, img_size: int = IMG_SIZE, patch: int = PATCH_SIZE) -> None:
        super().__init__()
        self.img_size = img_size
        self.patch_embed = PatchEmbed(spec.embed_dim, patch)
        tokens = (img_size // patch) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, spec.embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens + 1, spec.embed_dim))
        self.blocks = nn.Sequential(*(Block(spec.embed_dim, spec.num_heads) for _ in range(spec.depth)))
        self.norm = nn.LayerNorm(spec.embed_dim, eps=NORM_EPS)
        self.head = nn.Linear(spec.embed_dim, nc)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Token features after the final norm, (B, 1 + patches, dim)."""
        if not torch.jit.is_tracing() and tuple(x.shape[-2:]) != (self.img_size, self.img_size):
            raise ValueError(f"this network takes {self.img_size}x{self.img_size} inputs (fixed position "
                             f"embedding), got {tuple(x.shape[-2:])}")
        x = self.patch_embed(x)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos_embed
        return self.norm(self.blocks(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x)[:, 0])
