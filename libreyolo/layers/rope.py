"""Axial 2-D rotary position embedding (RoPE) of DINOv3-style vision transformers.

Each patch at grid cell (row, col) gets coordinates in [-1, 1] (cell centres, each axis
normalised by its own length); a head of width D rotates its channel pairs (i, i + D/2) by
angles ``2 pi * coord / period``, the first D/4 periods for the row coordinate and the next D/4
for the column. Prefix tokens (class, storage) are not rotated. The numerics follow the reference
operation for operation, in float32 whatever the activations' dtype.
"""
from __future__ import annotations

import math

import torch
from torch import nn


class RopePositionEmbedding(nn.Module):
    """``periods`` (D/4,) is the state-dict buffer; ``forward(h, w)`` -> ``(sin, cos)``, each (h*w, D).

    ``rescale`` (training only, DINOv3's ``rescale_coords``): coordinates are multiplied by one
    log-uniform factor in [1/rescale, rescale] per call.
    """

    def __init__(self, dim: int, heads: int, base: float = 100.0, rescale: float | None = None) -> None:
        super().__init__()
        head = dim // heads
        if dim % heads or head % 4:
            raise ValueError(f"RoPE needs a head width divisible by 4, got {dim} / {heads} heads")
        self.head, self.base, self.rescale = head, base, rescale
        self.register_buffer("periods", self.default_periods())

    def default_periods(self) -> torch.Tensor:
        exps = 2 * torch.arange(self.head // 4, dtype=torch.float32) / (self.head // 2)
        return self.base ** exps

    def forward(self, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        dd = {"device": self.periods.device, "dtype": torch.float32}
        ch = torch.arange(0.5, h, **dd) / h
        cw = torch.arange(0.5, w, **dd) / w
        coords = torch.stack(torch.meshgrid(ch, cw, indexing="ij"), dim=-1).flatten(0, 1)
        coords = 2.0 * coords - 1.0
        if self.training and self.rescale is not None:
            lim = math.log(self.rescale)
            coords = coords * torch.empty(1, **dd).uniform_(-lim, lim).exp()
        angles = 2 * math.pi * coords[:, :, None] / self.periods.float()[None, None, :]
        angles = angles.flatten(1, 2).tile(2)
        return torch.sin(angles), torch.cos(angles)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def apply_rope(q: torch.Tensor, k: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the last ``len(sin)`` tokens of ``q`` and ``k`` (B, heads, N, D); the rest (prefix
    tokens) pass unchanged. Computed in the rope's dtype (float32), returned in the inputs'."""
    sin, cos = rope
    out = []
    for t in (q, k):
        prefix = t.shape[-2] - sin.shape[-2]
        x = t.to(sin.dtype)
        patch = x[..., prefix:, :]
        patch = patch * cos + _rotate_half(patch) * sin
        out.append(torch.cat((x[..., :prefix, :], patch), dim=-2).to(t.dtype))
    return out[0], out[1]
