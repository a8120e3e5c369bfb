"""LW-DETR's backbone encoder: a plain ViT (CAE-v2 layout) on a 4 x 4 window grid.

The patch grid is cut into 4 x 4 windows (no class token); blocks listed as windowed attend
inside a window, the others over the whole image. The position table was learned for 224 px
(14 x 14 patches, plus a class-token row that is dropped) and is resized bicubically to the input's
grid. The blocks named in ``out_indices`` (0-based) give the output maps, (B, C, H / 16, W / 16).

Module names are the reference checkpoint's (``pos_embed``, ``patch_embed.proj``,
``blocks.N.{norm1,attn,gamma_1,norm2,mlp,gamma_2}``, ``attn.{qkv,q_bias,v_bias,proj}``: the key
projection has no bias). Attention is the manual matmul-softmax-matmul by default, with a
``fused_attn`` flag (docs/kernels.md).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from libreyolo.kernels.attention import attention
from libreyolo.layers.mlp import Mlp

GRID = 4            # windows per side
PATCH = 16
PRETRAIN_GRID = 14  # 224 px / 16


class PatchEmbed(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, dim, PATCH, PATCH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).permute(0, 2, 3, 1)  # (B, H, W, C)


class Attention(nn.Module):
    """Self-attention with a bias-free packed ``qkv`` and separate query and value biases."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.q_bias = nn.Parameter(torch.zeros(dim))
        self.v_bias = nn.Parameter(torch.zeros(dim))
        self.proj = nn.Linear(dim, dim)
        self.fused_attn = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        bias = torch.cat((self.q_bias, torch.zeros_like(self.q_bias), self.v_bias))
        qkv = F.linear(x, self.qkv.weight, bias).reshape(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        # the reference scales the query before the product: keep its rounding on the manual path
        out = attention(q, k, v, scale=self.scale, fused=True) if self.fused_attn else \
            attention(q * self.scale, k, v, scale=1.0, fused=False)
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, window: bool) -> None:
        super().__init__()
        self.window = window
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, 4 * dim)
        self.gamma_1 = nn.Parameter(0.1 * torch.ones(dim))
        self.gamma_2 = nn.Parameter(0.1 * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bw, t, c = x.shape
        y = self.norm1(x)
        if not self.window:
            y = y.reshape(bw // GRID ** 2, GRID ** 2 * t, c)
        y = self.gamma_1 * self.attn(y)
        if not self.window:
            y = y.reshape(bw, t, c)
        x = x + y
        return x + self.gamma_2 * self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(self, dim: int, heads: int, depth: int, window_blocks: Sequence[int],
                 out_indices: Sequence[int]) -> None:
        super().__init__()
        if depth - 1 not in out_indices:
            raise ValueError("the last ViT block must be an output feature")
        self.out_indices = tuple(out_indices)
        self.patch_embed = PatchEmbed(dim)
        self.pos_embed = nn.Parameter(torch.zeros(1, PRETRAIN_GRID ** 2 + 1, dim))
        self.blocks = nn.ModuleList(Block(dim, heads, i in window_blocks) for i in range(depth))
        nn.init.trunc_normal_(self.pos_embed, std=0.02)

    def positions(self, h: int, w: int) -> torch.Tensor:
        table = self.pos_embed[:, 1:].reshape(1, PRETRAIN_GRID, PRETRAIN_GRID, -1)
        if (h, w) == (PRETRAIN_GRID, PRETRAIN_GRID):
            return table
        table = F.interpolate(table.permute(0, 3, 1, 2), size=(h, w), mode="bicubic", align_corners=False)
        return table.permute(0, 2, 3, 1)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.patch_embed(x)
        b, h, w, c = x.shape
        if h % GRID or w % GRID:
            raise ValueError(f"LW-DETR's patch grid {h}x{w} must split into {GRID}x{GRID} windows: input sides "
                             f"must be multiples of {GRID * PATCH}")
        x = x + self.positions(h, w)
        wh, ww = h // GRID, w // GRID
        x = x.reshape(b, GRID, wh, GRID, ww, c).permute(0, 1, 3, 2, 4, 5).reshape(b * GRID ** 2, wh * ww, c)
        out = []
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i in self.out_indices:
                out.append(x.reshape(b, GRID, GRID, wh, ww, c).permute(0, 5, 1, 3, 2, 4).reshape(b, c, h, w))
        return out
