"""Multi-scale deformable cross-attention around box references (Deformable DETR), in the layouts the
DETR line runs it. Sampling always goes through the ``ms_deform_attn`` kernel slot (registry
providers when eligible, portable ``grid_sample`` otherwise, and always portable while exporting);
parameter names are the reference checkpoints' (``sampling_offsets``, ``attention_weights``,
``value_proj``, ``output_proj``, ``num_points_scale``).

- :class:`MSDeformableAttention`: ``points`` sampling points per head and level, one softmax over
  every level's points (RT-DETR, LW-DETR, RF-DETR).
- :class:`PointsDeformableAttention`: its own point count per level, laid out flat over
  ``sum(points)`` per head, each level's offsets scaled by ``1 / points[level]`` and by half the
  reference box's size; counts that differ between levels stay on the portable path (SPEC section 4)
  (D-FINE and its line, on a pre-projected memory); :class:`ProjectedDeformableAttention` adds the
  value and output projections (RT-DETRv2).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from libreyolo.kernels.attention import ms_deform_attn

Shapes = list[tuple[int, int]]


class PointsDeformableAttention(nn.Module):
    """Deformable attention with its own point count per level, sampling a pre-projected memory
    ``value`` (B, S, heads, C / heads) (D-FINE projects the memory once for all layers)."""

    def __init__(self, dim: int, heads: int, points: tuple[int, ...], offset_scale: float = 0.5) -> None:
        super().__init__()
        self.dim, self.heads, self.points = dim, heads, tuple(points)
        self.offset_scale = offset_scale
        total = sum(self.points)
        scale = [1.0 / n for n in self.points for _ in range(n)]
        self.register_buffer("num_points_scale", torch.tensor(scale, dtype=torch.float32))
        self.sampling_offsets = nn.Linear(dim, heads * total * 2)
        self.attention_weights = nn.Linear(dim, heads * total)

    def forward(self, query: torch.Tensor, reference: torch.Tensor, value: torch.Tensor,
                shapes: Shapes) -> torch.Tensor:
        """``query`` (B, Q, C), ``reference`` (B, Q, 1, 4) boxes (cx, cy, w, h) in [0, 1],
        ``value`` (B, S, heads, C / heads)."""
        b, q = query.shape[:2]
        total = sum(self.points)
        # no tensor above rank 4 (NCNN holds 4 axes): offsets (B*Q, heads, sum P, 2) around each query's box
        # (B*Q, 1, 1, 4); locations handed over as (B, Q, heads, sum P * 2), weights (B, Q, heads, sum P)
        offsets = self.sampling_offsets(query).reshape(b * q, self.heads, total, 2)
        weights = F.softmax(self.attention_weights(query).reshape(b, q, self.heads, total), dim=-1)
        scale = self.num_points_scale.to(dtype=query.dtype).unsqueeze(-1)
        ref = reference.reshape(b * q, 1, 1, 4)
        offset = offsets * scale * ref[..., 2:] * self.offset_scale
        locations = (ref[..., :2] + offset).reshape(b, q, self.heads, total * 2)
        return ms_deform_attn(value, shapes, locations, weights, points_per_level=self.points)


class ProjectedDeformableAttention(PointsDeformableAttention):
    """:class:`PointsDeformableAttention` with its own value and output projections (RT-DETRv2): takes
    the memory ``value`` (B, S, C) as it is."""

    def __init__(self, dim: int, heads: int, points: tuple[int, ...], offset_scale: float = 0.5) -> None:
        super().__init__(dim, heads, points, offset_scale)
        self.value_proj = nn.Linear(dim, dim)
        self.output_proj = nn.Linear(dim, dim)

    def forward(self, query: torch.Tensor, reference: torch.Tensor, value: torch.Tensor,
                shapes: Shapes) -> torch.Tensor:
        b, s = value.shape[:2]
        value = self.value_proj(value).reshape(b, s, self.heads, self.dim // self.heads)
        return self.output_proj(super().forward(query, reference, value, shapes))


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
        # the flat layout, no tensor above rank 4 (NCNN holds 4 axes): offsets (B*Q, heads*L*P, 2) around
        # each query's box (B*Q, 1, 4); locations handed over as (B, Q, heads, L*P*2), weights (B, Q, heads, L*P)
        offsets = self.sampling_offsets(query).reshape(b * q, self.heads * self.levels * self.points, 2)
        weights = F.softmax(self.attention_weights(query).reshape(b, q, self.heads, self.levels * self.points), dim=-1)
        ref = reference.reshape(b * q, 1, 4)
        locations = ref[..., :2] + offsets / self.points * ref[..., 2:] * 0.5
        locations = locations.reshape(b, q, self.heads, self.levels * self.points * 2)
        return self.output_proj(ms_deform_attn(value, shapes, locations, weights,
                                               points_per_level=(self.points,) * self.levels))
