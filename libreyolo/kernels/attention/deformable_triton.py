"""Triton forward kernel for the `ms_deform_attn` slot (CUDA, float32, inference only).

One program computes one (batch, query, head) output row: it walks the levels
and points, gathers the four bilinear neighbours of each sampling location
for all C channels at once, and accumulates `weight * bilinear` in float32.
Sampling follows `F.grid_sample(mode="bilinear", padding_mode="zeros",
align_corners=False)`: pixel coordinate `loc * size - 0.5`, neighbours outside
the level contribute zero. Level and point counts are compile-time constants
(a model uses one or two combinations, each compiled once).

There is no backward kernel (its parity is not proven), so the provider
declines whenever autograd would need one; training stays on the portable
path. This module imports without CUDA; kernels are only decorated here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from libreyolo.kernels.attention.deformable import (
    SLOT,
    SpatialShapes,
    accelerated_inputs_ok,
    level_start_index,
    uniform_layout,
)

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on machines without Triton
    triton = None

__all__ = ["MAX_CHANNELS", "NAME", "eligible", "ms_deform_attn_triton", "register"]

NAME = "triton"
MAX_CHANNELS = 256

if triton is not None:

    @triton.jit
    def _corner(level_ptr, xi, yi, width, height, stride, c, c_mask):
        # One neighbour's C channels; zero outside the level (padding_mode="zeros").
        valid = (xi >= 0) & (xi < width) & (yi >= 0) & (yi < height)
        position = (yi * width + xi).to(tl.int64)
        return tl.load(level_ptr + position * stride + c, mask=c_mask & valid, other=0.0)

    @triton.jit
    def _ms_deform_attn_forward_kernel(
        value_ptr,
        shapes_ptr,
        starts_ptr,
        locs_ptr,
        weights_ptr,
        out_ptr,
        length,
        queries,
        heads,
        channels,
        LEVELS: tl.constexpr,
        POINTS: tl.constexpr,
        BLOCK_C: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)  # row = (b * queries + q) * heads + h
        h = row % heads
        b = row // (queries * heads)
        c = tl.arange(0, BLOCK_C)
        c_mask = c < channels
        # value[b, s, h, c] lives at ((b * length + s) * heads + h) * channels + c
        stride = heads * channels
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
        for level in range(LEVELS):
            height = tl.load(shapes_ptr + 2 * level)
            width = tl.load(shapes_ptr + 2 * level + 1)
            level_ptr = value_ptr + (b * length + tl.load(starts_ptr + level)) * stride + h * channels
            height_f = height.to(tl.float32)
            width_f = width.to(tl.float32)
            for p in range(POINTS):
                sample = (row * LEVELS + level) * POINTS + p
                weight = tl.load(weights_ptr + sample)
                # Clamping far-away points keeps the int conversion defined; no
                # neighbour of a clamped point lies inside the level either way.
                x = tl.load(locs_ptr + 2 * sample) * width_f - 0.5
                y = tl.load(locs_ptr + 2 * sample + 1) * height_f - 0.5
                x = tl.minimum(tl.maximum(x, -2.0), width_f + 1.0)
                y = tl.minimum(tl.maximum(y, -2.0), height_f + 1.0)
                x0f = tl.floor(x)
                y0f = tl.floor(y)
                fx = x - x0f
                fy = y - y0f
                x0 = x0f.to(tl.int32)
                y0 = y0f.to(tl.int32)
                top = (1.0 - fx) * _corner(level_ptr, x0, y0, width, height, stride, c, c_mask)
                top += fx * _corner(level_ptr, x0 + 1, y0, width, height, stride, c, c_mask)
                bottom = (1.0 - fx) * _corner(level_ptr, x0, y0 + 1, width, height, stride, c, c_mask)
                bottom += fx * _corner(level_ptr, x0 + 1, y0 + 1, width, height, stride, c, c_mask)
                acc += weight * ((1.0 - fy) * top + fy * bottom)
        tl.store(out_ptr + row * channels + c, acc, mask=c_mask)


def ms_deform_attn_triton(
    value: torch.Tensor,
    spatial_shapes: SpatialShapes,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
    *,
    points_per_level: Sequence[int] | None = None,
    discrete: bool = False,
) -> torch.Tensor:
    """Forward-only Triton deformable attention; same contract as `ms_deform_attn_portable`."""
    if triton is None:
        raise RuntimeError("Triton is not installed; install it or use ms_deform_attn_portable")
    if discrete:
        raise ValueError("the Triton provider has no discrete sampling; use ms_deform_attn_portable")
    value = value.contiguous()
    shapes, locs, weights = uniform_layout(
        value, spatial_shapes, sampling_locations, attention_weights, points_per_level
    )
    batch, length, heads, channels = value.shape
    queries, levels, points = locs.shape[1], locs.shape[3], locs.shape[4]
    starts = level_start_index(shapes)
    out = torch.empty(batch, queries, heads, channels, device=value.device, dtype=torch.float32)
    rows = batch * queries * heads
    if rows:
        _ms_deform_attn_forward_kernel[(rows,)](
            value,
            shapes,
            starts,
            locs,
            weights,
            out,
            length,
            queries,
            heads,
            channels,
            LEVELS=levels,
            POINTS=points,
            BLOCK_C=max(triton.next_power_of_2(channels), 16),
        )
    return out.reshape(batch, queries, heads * channels)


def eligible(
    value: object = None,
    spatial_shapes: object = None,
    sampling_locations: object = None,
    attention_weights: object = None,
    *,
    points_per_level: Sequence[int] | None = None,
    discrete: bool = False,
) -> bool:
    """CUDA float32 eager inference with uniform points and at most MAX_CHANNELS per head."""
    if triton is None or not torch.cuda.is_available():
        return False
    if value is None:
        return True
    if not accelerated_inputs_ok(
        value,
        spatial_shapes,
        sampling_locations,
        attention_weights,
        points_per_level,
        discrete,
        allow_grad=False,
    ):
        return False
    return value.shape[-1] <= MAX_CHANNELS  # type: ignore[union-attr]


def register() -> None:
    """Register the Triton forward provider for `ms_deform_attn` (no-op without Triton)."""
    if triton is None:
        return
    from libreyolo.kernels import _registry

    _registry.register(SLOT, ms_deform_attn_triton, name=NAME, predicate=eligible)
