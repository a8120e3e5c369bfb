"""Triton fake-quantization kernels for CUDA, bit-exact with `libreyolo.quant`.

Why the kernels look the way they do:
- `x / scale` uses `tl.math.div_rn` (IEEE division). Triton's plain `/` on
  float32 is an approximate division and would differ in the last bit.
- FP8 rounding is done arithmetically (scale to the E4M3 quantum by an exact
  power of two, round half to even, scale back) instead of through a float8
  cast, so the result cannot depend on how a Triton version lowers that cast.
  The value is saturated to [-448, 448] first, so no overflow case exists.
- Backward kernels recompute the keep-mask from `x` (same arithmetic as the
  forward) instead of storing it.

This module imports without CUDA (kernels are only decorated); it is loaded
only when Triton is installed and a CUDA device is visible.
"""

from __future__ import annotations

import torch

from libreyolo.kernels.context import eager_only_ok

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on machines without Triton
    triton = None

__all__ = [
    "NAME",
    "fake_quant_fp8",
    "fake_quant_int8_affine",
    "fake_quant_int8_per_channel",
    "fp8_eligible",
    "int8_affine_eligible",
    "int8_per_channel_eligible",
    "register",
]

NAME = "triton"
BLOCK = 1024
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

if triton is not None:

    @triton.jit
    def _clamp(v, low, high):
        # NaN propagates, as in torch.clamp.
        v = tl.maximum(v, low, propagate_nan=tl.PropagateNan.ALL)
        return tl.minimum(v, high, propagate_nan=tl.PropagateNan.ALL)

    @triton.jit
    def _round_half_even(t):
        # Needs |t| < 2**22. Adding and subtracting 1.5 * 2**23 leaves an
        # integer rounded half-to-even by IEEE addition; the sign bit is put
        # back so that -0.0 stays -0.0, as with torch.round.
        r = (t + 12582912.0) - 12582912.0
        sign = t.to(tl.int32, bitcast=True) & -2147483648
        return (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)

    @triton.jit
    def _int_code(v):
        # round(v) for any v: beyond +-2**21 the int8 result and keep-mask are
        # already decided, so clamping first keeps _round_half_even exact.
        return _round_half_even(_clamp(v, -2097152.0, 2097152.0))

    @triton.jit
    def _round_to_e4m3(v):
        # v is already saturated to [-448, 448] (or NaN); both scalings are by
        # exact powers of two, so the only rounding is the one to an integer.
        exponent = ((v.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
        exponent = tl.maximum(exponent, -6)  # E4M3 subnormals share the 2**-9 quantum
        up = ((130 - exponent) << 23).to(tl.float32, bitcast=True)  # 2 ** (3 - exponent)
        down = ((exponent + 124) << 23).to(tl.float32, bitcast=True)  # 2 ** (exponent - 3)
        return _round_half_even(v * up) * down

    @triton.jit
    def _fp8_forward_kernel(x_ptr, s_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < n
        x = tl.load(x_ptr + offs, mask=inside, other=0.0).to(tl.float32)
        s = tl.load(s_ptr)
        v = _clamp(tl.math.div_rn(x, s), -448.0, 448.0)
        y = _round_to_e4m3(v) * s
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=inside)

    @triton.jit
    def _fp8_backward_kernel(x_ptr, s_ptr, g_ptr, gx_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < n
        x = tl.load(x_ptr + offs, mask=inside, other=0.0).to(tl.float32)
        s = tl.load(s_ptr)
        keep = tl.abs(tl.math.div_rn(x, s)) <= 448.0
        g = tl.load(g_ptr + offs, mask=inside, other=0.0)
        tl.store(gx_ptr + offs, tl.where(keep, g, tl.zeros_like(g)), mask=inside)

    @triton.jit
    def _int8_channel_forward_kernel(x_ptr, s_ptr, out_ptr, n, inner, channels, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < n
        channel = (offs // inner) % channels
        x = tl.load(x_ptr + offs, mask=inside, other=0.0).to(tl.float32)
        s = tl.load(s_ptr + channel, mask=inside, other=1.0)
        q = _clamp(_int_code(tl.math.div_rn(x, s)), -127.0, 127.0)
        tl.store(out_ptr + offs, (q * s).to(out_ptr.dtype.element_ty), mask=inside)

    @triton.jit
    def _int8_channel_backward_kernel(x_ptr, s_ptr, g_ptr, gx_ptr, n, inner, channels, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < n
        channel = (offs // inner) % channels
        x = tl.load(x_ptr + offs, mask=inside, other=0.0).to(tl.float32)
        s = tl.load(s_ptr + channel, mask=inside, other=1.0)
        keep = tl.abs(_int_code(tl.math.div_rn(x, s))) <= 127.0
        g = tl.load(g_ptr + offs, mask=inside, other=0.0)
        tl.store(gx_ptr + offs, tl.where(keep, g, tl.zeros_like(g)), mask=inside)

    @triton.jit
    def _int8_affine_forward_kernel(x_ptr, s_ptr, zp_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < n
        x = tl.load(x_ptr + offs, mask=inside, other=0.0).to(tl.float32)
        s = tl.load(s_ptr)
        zp = tl.load(zp_ptr)
        q = _clamp(_int_code(tl.math.div_rn(x, s)) + zp, -128.0, 127.0)
        tl.store(out_ptr + offs, ((q - zp) * s).to(out_ptr.dtype.element_ty), mask=inside)

    @triton.jit
    def _int8_affine_backward_kernel(x_ptr, s_ptr, zp_ptr, g_ptr, gx_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < n
        x = tl.load(x_ptr + offs, mask=inside, other=0.0).to(tl.float32)
        s = tl.load(s_ptr)
        zp = tl.load(zp_ptr)
        shifted = _int_code(tl.math.div_rn(x, s)) + zp
        keep = (shifted >= -128.0) & (shifted <= 127.0)
        g = tl.load(g_ptr + offs, mask=inside, other=0.0)
        tl.store(gx_ptr + offs, tl.where(keep, g, tl.zeros_like(g)), mask=inside)


def _grid(n: int) -> tuple[int]:
    return (triton.cdiv(n, BLOCK),)


def _as_float32(value: torch.Tensor | float, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(value, dtype=torch.float32, device=device).reshape(-1).contiguous()


def _channel_layout(x: torch.Tensor, axis: int) -> tuple[int, int]:
    axis %= x.dim()
    inner = 1
    for size in x.shape[axis + 1 :]:
        inner *= size
    return max(inner, 1), x.shape[axis]


class _FP8(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
        x = x.contiguous()
        s = _as_float32(scale, x.device)
        out = torch.empty_like(x)
        if x.numel():
            _fp8_forward_kernel[_grid(x.numel())](x, s, out, x.numel(), BLOCK=BLOCK)
        ctx.save_for_backward(x, s)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        x, s = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = torch.empty_like(grad)
        if x.numel():
            _fp8_backward_kernel[_grid(x.numel())](x, s, grad, grad_x, x.numel(), BLOCK=BLOCK)
        return grad_x, None


class _Int8PerChannel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: torch.Tensor, axis: int) -> torch.Tensor:
        x = x.contiguous()
        s = _as_float32(scale, x.device)
        inner, channels = _channel_layout(x, axis)
        out = torch.empty_like(x)
        if x.numel():
            _int8_channel_forward_kernel[_grid(x.numel())](x, s, out, x.numel(), inner, channels, BLOCK=BLOCK)
        ctx.save_for_backward(x, s)
        ctx.layout = (inner, channels)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        x, s = ctx.saved_tensors
        inner, channels = ctx.layout
        grad = grad.contiguous()
        grad_x = torch.empty_like(grad)
        if x.numel():
            _int8_channel_backward_kernel[_grid(x.numel())](x, s, grad, grad_x, x.numel(), inner, channels, BLOCK=BLOCK)
        return grad_x, None, None


class _Int8Affine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: torch.Tensor | float, zero_point: torch.Tensor | int) -> torch.Tensor:
        x = x.contiguous()
        s = _as_float32(scale, x.device)
        zp = _as_float32(zero_point, x.device)
        out = torch.empty_like(x)
        if x.numel():
            _int8_affine_forward_kernel[_grid(x.numel())](x, s, zp, out, x.numel(), BLOCK=BLOCK)
        ctx.save_for_backward(x, s, zp)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        x, s, zp = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = torch.empty_like(grad)
        if x.numel():
            _int8_affine_backward_kernel[_grid(x.numel())](x, s, zp, grad, grad_x, x.numel(), BLOCK=BLOCK)
        return grad_x, None, None


def fake_quant_fp8(x: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """Triton version of `libreyolo.quant.fake_quant_fp8` (same numbers, same STE)."""
    return _FP8.apply(x, scale)


def fake_quant_int8_per_channel(x: torch.Tensor, scale: torch.Tensor, axis: int = 0) -> torch.Tensor:
    """Triton version of `libreyolo.quant.fake_quant_int8_per_channel`."""
    return _Int8PerChannel.apply(x, scale, axis)


def fake_quant_int8_affine(
    x: torch.Tensor, scale: torch.Tensor | float, zero_point: torch.Tensor | int
) -> torch.Tensor:
    """Triton version of `libreyolo.quant.fake_quant_int8_affine`."""
    return _Int8Affine.apply(x, scale, zero_point)


# Predicates take the reference's parameters; called with none they answer
# "could this provider run here at all?".


def _x_ok(x: object) -> bool:
    return isinstance(x, torch.Tensor) and x.is_cuda and x.dtype in SUPPORTED_DTYPES and x.dim() > 0


def _single(value: object) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and not value.is_complex()
    return isinstance(value, (int, float))


def _available() -> bool:
    return triton is not None and torch.cuda.is_available() and eager_only_ok()


def fp8_eligible(x: object = None, scale: object = None) -> bool:
    if x is None:
        return _available()
    return _available() and _x_ok(x) and _single(scale)


def int8_per_channel_eligible(x: object = None, scale: object = None, axis: int = 0) -> bool:
    if x is None:
        return _available()
    if not (_available() and _x_ok(x) and isinstance(scale, torch.Tensor) and isinstance(axis, int)):
        return False
    return -x.dim() <= axis < x.dim() and scale.numel() == x.shape[axis]


def int8_affine_eligible(x: object = None, scale: object = None, zero_point: object = None) -> bool:
    if x is None:
        return _available()
    return _available() and _x_ok(x) and _single(scale) and _single(zero_point)


def register() -> None:
    """Register the three Triton fake-quant kernels (no-op without Triton)."""
    if triton is None:
        return
    from libreyolo.kernels import _registry

    _registry.register("fake_quant_fp8", fake_quant_fp8, name=NAME, predicate=fp8_eligible)
    _registry.register(
        "fake_quant_int8_per_channel",
        fake_quant_int8_per_channel,
        name=NAME,
        predicate=int8_per_channel_eligible,
    )
    _registry.register("fake_quant_int8_affine", fake_quant_int8_affine, name=NAME, predicate=int8_affine_eligible)
