"""Multi-scale deformable attention around box references (Deformable DETR), as RT-DETR and the
LW-DETR line (LW-DETR, RF-DETR) run it: ``points`` sampling points per head and level, offsets
scaled by the reference box's half size, one softmax over every level's points. Sampling goes
through the ``ms_deform_attn`` kernel slot (registry providers when eligible, portable
``grid_sample`` otherwise, and always portable while exporting). Parameter names are the
reference checkpoints' (``sampling_offsets``, ``attention_weights``, ``value_proj``, ``output_proj``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from libreyolo.kernels.attention import ms_deform_attn

Shapes = list[tuple[int, int]]


class MSDeformableAttention(nn.Module):
    """Deformable attention with ``points`` sampling points per head and level, around box references."""

    def __init__(self, dim: int, heads: int, levels: int, points: int) -> None:
        super().__init__()
        self.dim, self.heads, self.levels, self.points = dim, heads, levels, points
        self.sampling_offsets = nn.Linear(dim, heads * levels * points * 2)
        self.attention_weights = nn.Linear(dim, heads * levels * points)
        self.value_proj = nn.Linear(dim, dim)
        self.output_proj = nn.Linear(dim, dim)

    def forward(self, query: torch.Tensor, reference: torch.Tensor, value: torch.Tensor,
                shapes: Shapes) -> torch.Tensor:
        """``query`` (B, Q, C); ``reference`` (B, Q, 1, 4) boxes (cx, cy, w, h) in [0, 1]; ``value`` (B, S, C)."""
        b, q = query.shape[:2]
        value = self.value_proj(value).reshape(b, value.shape[1], self.heads, self.dim // self.heads)
        offsets = self.sampling_offsets(query).reshape(b, q, self.heads, self.levels, self.points, 2)
        weights = self.attention_weights(query).reshape(b, q, self.heads, self.levels * self.points)
        weights = F.softmax(weights, dim=-1).reshape(b, q, self.heads, self.levels, self.points)
        ref = reference[:, :, None, :, None]
        locations = ref[..., :2] + offsets / self.points * ref[..., 2:] * 0.5
        return self.output_proj(ms_deform_attn(value, shapes, locations, weights))
