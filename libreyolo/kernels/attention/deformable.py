"""Multi-scale deformable attention (Deformable DETR): the portable path and the slot helper.

Shapes (B batch, S = sum of H_l * W_l, heads, C channels per head, Q queries,
L levels, P points per level):

- value:               (B, S, heads, C), levels concatenated along S
- spatial_shapes:      (L, 2) rows of (H_l, W_l), a list/tuple or an integer tensor
- sampling_locations:  (B, Q, heads, L, P, 2), (x, y) normalised to [0, 1]
- attention_weights:   (B, Q, heads, L, P)
- result:              (B, Q, heads * C)

Two extra layouts stay on the portable path:
- `points_per_level=[P_0, P_1, ...]` (counts that may differ between levels);
  then locations are (B, Q, heads, sum(P_l), 2) or, rank 4, (B, Q, heads, 2 * sum(P_l))
  (the same values, (x, y) pairs level by level), and weights (B, Q, heads, sum(P_l)).
  The portable path builds no tensor above rank 4 from these (NCNN's limit), so a layer
  that passes the rank-4 layout exports to NCNN.
- `discrete=True`: nearest-pixel sampling by integer index (D-FINE's
  "discrete" method) instead of bilinear interpolation.

The `ms_deform_attn` slot has no reference in the registry: `ms_deform_attn()`
tries eligible providers and falls back to `ms_deform_attn_portable()`, which
is also what every export graph contains.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from libreyolo.kernels import _registry
from libreyolo.kernels.context import eager_only_ok

__all__ = [
    "SLOT",
    "SpatialShapes",
    "accelerated_inputs_ok",
    "level_shapes",
    "level_start_index",
    "ms_deform_attn",
    "ms_deform_attn_portable",
    "shapes_tensor",
    "uniform_layout",
]

SLOT = "ms_deform_attn"
SpatialShapes = torch.Tensor | Sequence[Sequence[int]]


def level_shapes(spatial_shapes: SpatialShapes) -> list[tuple[int, int]]:
    """(H, W) per level as Python ints (a CUDA tensor costs one device sync)."""
    rows = spatial_shapes.tolist() if isinstance(spatial_shapes, torch.Tensor) else spatial_shapes
    shapes = [tuple(int(n) for n in row) for row in rows]
    if not shapes or any(len(s) != 2 or s[0] <= 0 or s[1] <= 0 for s in shapes):
        raise ValueError(f"spatial_shapes must be non-empty rows of positive (H, W), got {rows!r}")
    return shapes  # type: ignore[return-value]


def shapes_tensor(spatial_shapes: SpatialShapes, device: torch.device) -> torch.Tensor:
    """spatial_shapes as a contiguous int64 (L, 2) tensor on `device`.

    A sequence of Python ints may carry its own device copy (an ``as_tensor(device)`` method,
    e.g. the DETR families' per-shape cache): then no host tensor is built and copied here,
    which a CUDA graph capture would refuse.
    """
    as_tensor = getattr(spatial_shapes, "as_tensor", None)
    if callable(as_tensor):
        return as_tensor(device)
    if isinstance(spatial_shapes, torch.Tensor):
        return spatial_shapes.to(device=device, dtype=torch.int64).reshape(-1, 2).contiguous()
    return torch.tensor(level_shapes(spatial_shapes), dtype=torch.int64, device=device)


def level_start_index(shapes: torch.Tensor) -> torch.Tensor:
    """Offset of each level along S, from an (L, 2) int64 tensor."""
    return torch.cat([shapes.new_zeros(1), shapes.prod(1).cumsum(0)[:-1]])


def _flat_layout(
    value: torch.Tensor,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
    levels: int,
    points_per_level: Sequence[int] | None,
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Locations as (B, Q, heads, 2 * sum P) ((x, y) pairs level by level), weights as (B, Q, heads, sum P),
    points per level."""
    batch, _, heads, _ = value.shape
    if points_per_level is None:
        if sampling_locations.dim() != 6 or sampling_locations.shape[3] != levels:
            raise ValueError(
                f"sampling_locations must be (B, Q, heads, L={levels}, P, 2), got "
                f"{tuple(sampling_locations.shape)}; pass points_per_level for the flattened layout"
            )
        points = [sampling_locations.shape[4]] * levels
    else:
        points = [int(p) for p in points_per_level]
        if len(points) != levels or min(points) <= 0:
            raise ValueError(f"points_per_level needs {levels} positive counts (one per level), got {points}")
    total = sum(points)
    queries = sampling_locations.shape[1]
    expected_locs = batch * queries * heads * total * 2
    if sampling_locations.shape[:3] != (batch, queries, heads) or sampling_locations.numel() != expected_locs:
        raise ValueError(
            f"sampling_locations {tuple(sampling_locations.shape)} do not fit value {tuple(value.shape)} "
            f"with {points} points per level: expected (B={batch}, Q, heads={heads}, ..., 2) "
            f"holding {total} points"
        )
    if attention_weights.numel() != expected_locs // 2 or attention_weights.shape[:3] != (
        batch,
        queries,
        heads,
    ):
        raise ValueError(
            f"attention_weights {tuple(attention_weights.shape)} must be (B={batch}, Q={queries}, "
            f"heads={heads}, ...) holding {total} weights per head"
        )
    locs = sampling_locations.reshape(batch, queries, heads, total * 2)
    weights = attention_weights.reshape(batch, queries, heads, total)
    return locs, weights, points


def _sample_nearest(value_l: torch.Tensor, locs: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Integer-index sampling: pixel trunc(loc * size + 0.5), clamped per axis to the level."""
    n, channels = value_l.shape[:2]
    queries, points = locs.shape[1:3]
    x = (locs[..., 0] * width + 0.5).to(torch.int64).clamp(0, width - 1)
    y = (locs[..., 1] * height + 0.5).to(torch.int64).clamp(0, height - 1)
    index = (y * width + x).reshape(n, 1, queries * points).expand(n, channels, queries * points)
    picked = value_l.reshape(n, channels, height * width).gather(2, index)
    return picked.reshape(n, channels, queries, points)


def ms_deform_attn_portable(
    value: torch.Tensor,
    spatial_shapes: SpatialShapes,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
    *,
    points_per_level: Sequence[int] | None = None,
    discrete: bool = False,
) -> torch.Tensor:
    """Deformable attention with `F.grid_sample` (bilinear, zero padding, align_corners=False).

    Runs on every device and dtype and exports cleanly; pass `spatial_shapes`
    as Python ints when exporting so the level sizes are constants.
    """
    if value.dim() != 4:
        raise ValueError(f"value must be (B, S, heads, C), got {tuple(value.shape)}")
    batch, length, heads, channels = value.shape
    shapes = level_shapes(spatial_shapes)
    sizes = [h * w for h, w in shapes]
    if sum(sizes) != length:
        raise ValueError(
            f"spatial_shapes {shapes} cover {sum(sizes)} positions but value has S={length}; "
            "the levels must be concatenated along dim 1 of value"
        )
    locs, weights, points = _flat_layout(value, sampling_locations, attention_weights, len(shapes), points_per_level)
    queries = locs.shape[1]
    per_head = batch * heads
    sampled = []
    for (height, width), value_l, locs_l, count in zip(
        shapes, value.split(sizes, dim=1), locs.split([2 * p for p in points], dim=3), points, strict=True
    ):
        # (B, HW, heads, C) -> (B*heads, C, H, W); (B, Q, heads, 2p) -> (B*heads, Q, p, 2)
        value_l = value_l.flatten(2).transpose(1, 2).reshape(per_head, channels, height, width)
        locs_l = locs_l.transpose(1, 2).reshape(per_head, queries, count, 2)
        if discrete:
            sampled.append(_sample_nearest(value_l, locs_l, height, width))
        else:
            sampled.append(
                F.grid_sample(value_l, 2 * locs_l - 1, mode="bilinear", padding_mode="zeros", align_corners=False)
            )
    weights = weights.transpose(1, 2).reshape(per_head, 1, queries, sum(points))
    out = (torch.cat(sampled, dim=-1) * weights).sum(-1)  # (B*heads, C, Q)
    return out.reshape(batch, heads * channels, queries).transpose(1, 2).contiguous()


def accelerated_inputs_ok(
    value: object,
    spatial_shapes: object,
    sampling_locations: object,
    attention_weights: object,
    points_per_level: Sequence[int] | None,
    discrete: bool,
    *,
    allow_grad: bool,
    device_type: str = "cuda",
) -> bool:
    """The narrow eligibility every compiled provider shares: CUDA, float32, eager, uniform points.

    Declines under tracing, compiling, exporting and ONNX export; for point
    counts that differ between levels; for discrete sampling; and, unless
    `allow_grad`, when autograd would need a backward pass. `device_type`
    exists so tests can exercise a provider's plumbing on CPU.
    """
    if discrete or not eager_only_ok():
        return False
    if points_per_level is not None and len({int(p) for p in points_per_level}) > 1:
        return False
    tensors = (value, sampling_locations, attention_weights)
    if not all(
        isinstance(t, torch.Tensor) and t.device.type == device_type and t.dtype == torch.float32 for t in tensors
    ):
        return False
    if len({t.device for t in tensors}) != 1 or value.dim() != 4:  # type: ignore[union-attr]
        return False
    if not allow_grad and torch.is_grad_enabled() and any(t.requires_grad for t in tensors):  # type: ignore[union-attr]
        return False
    if isinstance(spatial_shapes, torch.Tensor):
        return spatial_shapes.dim() == 2 and spatial_shapes.shape[-1] == 2
    try:
        sizes = sum(h * w for h, w in level_shapes(spatial_shapes))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return sizes == value.shape[1]  # type: ignore[union-attr]


def uniform_layout(
    value: torch.Tensor,
    spatial_shapes: SpatialShapes,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
    points_per_level: Sequence[int] | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Provider inputs: int64 shapes on the device, contiguous (B,Q,h,L,P,2) locations and weights."""
    shapes = shapes_tensor(spatial_shapes, value.device)
    levels = shapes.shape[0]
    batch, queries, heads = sampling_locations.shape[:3]
    points = sampling_locations.numel() // (batch * queries * heads * levels * 2)
    if points_per_level is not None and points * levels != sum(points_per_level):
        raise ValueError(f"points_per_level {list(points_per_level)} do not match the locations' size")
    locs = sampling_locations.reshape(batch, queries, heads, levels, points, 2).contiguous()
    weights = attention_weights.reshape(batch, queries, heads, levels, points).contiguous()
    return shapes, locs, weights


def ms_deform_attn(
    value: torch.Tensor,
    spatial_shapes: SpatialShapes,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
    *,
    points_per_level: Sequence[int] | None = None,
    discrete: bool = False,
) -> torch.Tensor:
    """Deformable attention through the fastest eligible provider, else the portable path.

    A provider that fails is disabled for the process (warned once) and the
    portable path gives the answer. While tracing, compiling or exporting the
    registry is not consulted at all: graphs always carry the portable ops.
    """
    if not eager_only_ok():
        return ms_deform_attn_portable(
            value,
            spatial_shapes,
            sampling_locations,
            attention_weights,
            points_per_level=points_per_level,
            discrete=discrete,
        )
    return _registry.call_or(
        SLOT,
        ms_deform_attn_portable,
        value,
        spatial_shapes,
        sampling_locations,
        attention_weights,
        points_per_level=points_per_level,
        discrete=discrete,
    )
