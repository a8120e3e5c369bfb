"""Reference fake-quantization numerics. These functions *define* the meaning.

Every accelerated provider in `libreyolo.kernels.quant` must match them
exactly in the forward pass and within 1e-6 in the backward pass.

Common rules
------------
- Arithmetic runs in float32 (float64 inputs stay float64); the result is
  cast back to the input dtype with round-to-nearest-even.
- `x / scale` is an IEEE division (not a multiplication by 1/scale).
- Rounding is round-half-to-even (`torch.round`).
- Scales must be positive and finite; this is not checked, because checking
  would synchronise the device on every call.
- Backward is the clipped straight-through estimator (STE): the incoming
  gradient passes unchanged where the value was representable and is exactly
  zero where it was clipped. The precise "not clipped" condition is given per
  function. Scales and zero points receive no gradient (they are calibrated,
  not learned).
"""

from __future__ import annotations

import torch

__all__ = [
    "FP8_E4M3_MAX",
    "INT8_AFFINE_RANGE",
    "INT8_SYMMETRIC_MAX",
    "fake_quant_fp8",
    "fake_quant_int8_affine",
    "fake_quant_int8_per_channel",
]

FP8_E4M3_MAX = 448.0
INT8_SYMMETRIC_MAX = 127.0
INT8_AFFINE_RANGE = (-128.0, 127.0)


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    if not x.is_floating_point():
        raise TypeError(f"fake quantization needs a floating-point tensor, got dtype {x.dtype}")
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _per_tensor(value: torch.Tensor | float, like: torch.Tensor, what: str) -> torch.Tensor:
    tensor = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    if tensor.numel() != 1:
        raise ValueError(
            f"{what} must be a single value (per-tensor), got shape {tuple(tensor.shape)}; "
            "use fake_quant_int8_per_channel for one scale per channel"
        )
    return tensor.reshape(())


def _where_kept(grad: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    return torch.where(kept, grad, torch.zeros((), dtype=grad.dtype, device=grad.device))


class _FakeQuantFP8(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
        work = x.to(_work_dtype(x))
        s = _per_tensor(scale, work, "scale")
        v = work / s
        kept = v.abs() <= FP8_E4M3_MAX
        coded = v.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).to(work.dtype)
        ctx.save_for_backward(kept)
        return (coded * s).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (kept,) = ctx.saved_tensors
        return _where_kept(grad, kept), None


class _FakeQuantInt8PerChannel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: torch.Tensor, axis: int) -> torch.Tensor:
        work = x.to(_work_dtype(x))
        s = _channel_scale(scale, work, axis)
        rounded = torch.round(work / s)
        kept = rounded.abs() <= INT8_SYMMETRIC_MAX
        coded = rounded.clamp(-INT8_SYMMETRIC_MAX, INT8_SYMMETRIC_MAX)
        ctx.save_for_backward(kept)
        return (coded * s).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (kept,) = ctx.saved_tensors
        return _where_kept(grad, kept), None, None


class _FakeQuantInt8Affine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: torch.Tensor | float, zero_point: torch.Tensor | int) -> torch.Tensor:
        work = x.to(_work_dtype(x))
        s = _per_tensor(scale, work, "scale")
        zp = _per_tensor(zero_point, work, "zero_point")
        low, high = INT8_AFFINE_RANGE
        shifted = torch.round(work / s) + zp
        kept = (shifted >= low) & (shifted <= high)
        coded = shifted.clamp(low, high)
        ctx.save_for_backward(kept)
        return ((coded - zp) * s).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (kept,) = ctx.saved_tensors
        return _where_kept(grad, kept), None, None


def _channel_scale(scale: torch.Tensor, work: torch.Tensor, axis: int) -> torch.Tensor:
    if work.dim() == 0:
        raise ValueError("per-channel fake quantization needs a tensor with at least one dimension")
    if not -work.dim() <= axis < work.dim():
        raise ValueError(f"axis {axis} is out of range for a tensor with {work.dim()} dimensions")
    axis %= work.dim()
    s = torch.as_tensor(scale, dtype=work.dtype, device=work.device).reshape(-1)
    channels = work.shape[axis]
    if s.numel() != channels:
        raise ValueError(
            f"scale has {s.numel()} values but x has {channels} channels along axis {axis} "
            f"(x shape {tuple(work.shape)}); pass one scale per channel or change axis"
        )
    view = [1] * work.dim()
    view[axis] = channels
    return s.reshape(view)


def fake_quant_fp8(x: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """Round `x` to FP8 E4M3 (`torch.float8_e4m3fn`) with one per-tensor scale, and back.

    Forward: `v = x / scale`, saturated to [-448, 448], rounded to the nearest
    E4M3 value (ties to even, subnormals kept), times `scale`, in x's dtype.
    Backward (STE): the gradient passes where `|x / scale| <= 448` and is 0
    where the value saturated.
    """
    return _FakeQuantFP8.apply(x, scale)


def fake_quant_int8_per_channel(x: torch.Tensor, scale: torch.Tensor, axis: int = 0) -> torch.Tensor:
    """Symmetric INT8 with one scale per channel along `axis` (narrow range [-127, 127]).

    Forward: `q = clamp(round(x / scale[c]), -127, 127)`, result `q * scale[c]`.
    Backward (STE): the gradient passes where `|round(x / scale[c])| <= 127`
    (the rounded code was not clipped) and is 0 elsewhere.
    """
    return _FakeQuantInt8PerChannel.apply(x, scale, axis)


def fake_quant_int8_affine(
    x: torch.Tensor, scale: torch.Tensor | float, zero_point: torch.Tensor | int
) -> torch.Tensor:
    """Asymmetric (affine) INT8 with a per-tensor scale and integer zero point, range [-128, 127].

    Forward: `q = clamp(round(x / scale) + zero_point, -128, 127)`, result
    `(q - zero_point) * scale`. Backward (STE): the gradient passes where
    `-128 <= round(x / scale) + zero_point <= 127` and is 0 elsewhere.
    """
    return _FakeQuantInt8Affine.apply(x, scale, zero_point)
