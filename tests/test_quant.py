"""Reference fake-quantization numerics (they define the meaning) and their registry slots."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from libreyolo import kernels
from libreyolo.kernels.quant import triton_provider
from libreyolo.quant import fake_quant_fp8, fake_quant_int8_affine, fake_quant_int8_per_channel

REPO_ROOT = Path(__file__).resolve().parents[1]


def ste_grad(fn, x, *args):
    x = x.detach().clone().requires_grad_()
    fn(x, *args).backward(torch.ones_like(x))
    return x.grad


# --- FP8 E4M3 ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.0, 1.0),
        (1.0625, 1.0),  # halfway between 1.0 and 1.125: ties to the even mantissa
        (1.1875, 1.25),  # halfway between 1.125 and 1.25: ties to the even mantissa
        (-3.3, -3.25),
        (448.0, 448.0),
        (1000.0, 448.0),  # saturates instead of overflowing
        (-1e30, -448.0),
        (2.0**-9, 2.0**-9),  # smallest subnormal survives
        (2.0**-10, 0.0),  # halfway to zero: ties to even (zero)
        (3 * 2.0**-10, 2.0**-8),  # halfway between 2**-9 and 2**-8: even is 2**-8
    ],
)
def test_fp8_rounds_to_nearest_e4m3_value_ties_to_even_and_saturates(value, expected):
    out = fake_quant_fp8(torch.tensor([value]), 1.0)
    assert out.item() == expected


def test_fp8_scale_divides_before_rounding_and_multiplies_after():
    x = torch.tensor([0.25 * 1.0625, 0.25 * 1000.0])
    assert fake_quant_fp8(x, torch.tensor(0.25)).tolist() == [0.25, 0.25 * 448.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_fp8_keeps_the_input_dtype_and_shape(dtype):
    x = torch.randn(3, 4, 5).to(dtype)
    out = fake_quant_fp8(x, 0.5)
    assert out.dtype == dtype and out.shape == x.shape


def test_fp8_values_are_exactly_representable_in_float8():
    x = torch.randn(4096) * 50
    out = fake_quant_fp8(x, 1.0)
    assert torch.equal(out, out.to(torch.float8_e4m3fn).float())


def test_fp8_ste_passes_gradient_where_not_saturated_inclusive_of_448():
    x = torch.tensor([0.0, -447.9, 448.0, -448.0, 448.1, -900.0])
    assert ste_grad(fake_quant_fp8, x, 1.0).tolist() == [1, 1, 1, 1, 0, 0]


def test_fp8_scale_gets_no_gradient():
    scale = torch.tensor(0.5, requires_grad=True)
    fake_quant_fp8(torch.randn(5, requires_grad=True), scale).sum().backward()
    assert scale.grad is None


def test_fp8_rejects_a_per_channel_scale_with_a_pointer_to_the_right_function():
    with pytest.raises(ValueError, match="fake_quant_int8_per_channel"):
        fake_quant_fp8(torch.randn(2, 3), torch.ones(2))


def test_fake_quant_rejects_integer_tensors():
    with pytest.raises(TypeError, match="floating-point"):
        fake_quant_fp8(torch.arange(4), 1.0)


# --- INT8 per channel ------------------------------------------------------


def test_int8_per_channel_rounds_half_to_even_and_clamps_to_127():
    x = torch.tensor([[0.5, 1.5, 2.5, -0.5, -2.5, 126.5, 127.4, 200.0, -500.0]])
    out = fake_quant_int8_per_channel(x, torch.tensor([1.0]), axis=0)
    assert out.tolist() == [[0.0, 2.0, 2.0, -0.0, -2.0, 126.0, 127.0, 127.0, -127.0]]


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_int8_per_channel_applies_one_scale_per_channel_along_axis(axis):
    x = torch.randn(3, 4, 5)
    scale = torch.rand(x.shape[axis]) + 0.01
    view = [1, 1, 1]
    view[axis] = -1
    expected = torch.round(x / scale.reshape(view)).clamp(-127, 127) * scale.reshape(view)
    assert torch.equal(fake_quant_int8_per_channel(x, scale, axis=axis), expected)


def test_int8_per_channel_ste_uses_the_rounded_code():
    x = torch.tensor([[127.4, 127.6, -127.5, -126.6, 0.2]])  # rounded: 127, 128, -128, -127, 0
    assert ste_grad(fake_quant_int8_per_channel, x, torch.tensor([1.0]), 0).tolist() == [[1, 0, 0, 1, 1]]


def test_int8_per_channel_explains_a_scale_of_the_wrong_length():
    with pytest.raises(ValueError, match="3 values but x has 4 channels along axis 1"):
        fake_quant_int8_per_channel(torch.randn(2, 4), torch.ones(3), axis=1)


def test_int8_per_channel_rejects_an_axis_out_of_range():
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        fake_quant_int8_per_channel(torch.randn(2, 4), torch.ones(2), axis=2)


# --- INT8 affine -------------------------------------------------------------


def test_int8_affine_shifts_by_the_zero_point_and_clamps_to_int8():
    x = torch.tensor([0.0, 1.0, -10.0, 100.0, 300.0, -300.0])
    out = fake_quant_int8_affine(x, torch.tensor(1.0), torch.tensor(10))
    # codes: 10, 11, 0, 110, 127 (clamped), -128 (clamped); value = code - 10
    assert out.tolist() == [0.0, 1.0, -10.0, 100.0, 117.0, -138.0]


def test_int8_affine_ste_passes_where_the_shifted_code_fits():
    x = torch.tensor([117.0, 117.6, -138.0, -138.6])  # codes: 127, 128, -128, -129
    assert ste_grad(fake_quant_int8_affine, x, 1.0, 10).tolist() == [1, 0, 1, 0]


def test_int8_affine_needs_a_single_zero_point():
    with pytest.raises(ValueError, match="zero_point must be a single value"):
        fake_quant_int8_affine(torch.randn(3), 1.0, torch.tensor([1, 2]))


# --- registry slots ----------------------------------------------------------


def test_quant_slots_select_the_reference_on_cpu():
    table = kernels.active()
    for slot in ("fake_quant_fp8", "fake_quant_int8_per_channel", "fake_quant_int8_affine"):
        assert table[slot] in (kernels.REFERENCE, "triton")
    x = torch.randn(6)
    assert kernels.selected("fake_quant_fp8", x, 1.0).name == kernels.REFERENCE
    assert torch.equal(kernels.call("fake_quant_fp8", x, 0.5), fake_quant_fp8(x, 0.5))
    assert torch.equal(kernels.call("fake_quant_int8_affine", x, 0.1, 3), fake_quant_int8_affine(x, 0.1, 3))


def test_triton_quant_provider_declines_cpu_tensors_and_imports_without_triton():
    x = torch.randn(4)
    assert not triton_provider.fp8_eligible(x, 1.0)
    assert not triton_provider.int8_per_channel_eligible(x[None], torch.ones(1), 0)
    assert not triton_provider.int8_affine_eligible(x, 1.0, 0)


@pytest.mark.gpu
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton not installed")
def test_triton_quant_provider_is_selected_for_cuda_tensors():
    x = torch.randn(8, device="cuda")
    assert kernels.selected("fake_quant_fp8", x, 1.0).name == "triton"


INTERPRETER_PROBE = """
import json, torch
from libreyolo.kernels.quant import triton_provider as tp
from libreyolo.quant import fake_quant_fp8, fake_quant_int8_affine, fake_quant_int8_per_channel
torch.manual_seed(0)
x = torch.randn(3000) * 10 ** torch.empty(3000).uniform_(-4, 3)
x = torch.cat([x, torch.tensor([0.5, 1.5, -2.5, 127.5, -128.5, 448.0, 449.0, 1e30, -0.0])])
results = {}
for dtype in (torch.float32, torch.float16):  # the interpreter truncates bf16 casts
    xd = x.to(dtype)
    results[f"fp8 {dtype}"] = torch.equal(tp.fake_quant_fp8(xd, 0.37), fake_quant_fp8(xd, 0.37))
    s = torch.tensor([0.05])
    results[f"channel {dtype}"] = torch.equal(
        tp.fake_quant_int8_per_channel(xd[None], s, 0), fake_quant_int8_per_channel(xd[None], s, 0))
    results[f"affine {dtype}"] = torch.equal(
        tp.fake_quant_int8_affine(xd, 0.05, 7), fake_quant_int8_affine(xd, 0.05, 7))
xa = x.clone().requires_grad_()
xb = x.clone().requires_grad_()
tp.fake_quant_fp8(xa, 0.05).sum().backward()
fake_quant_fp8(xb, 0.05).sum().backward()
results["fp8 grad"] = torch.equal(xa.grad, xb.grad)
print(json.dumps(results))
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton not installed")
def test_triton_quant_kernels_match_the_reference_under_the_triton_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(INTERPRETER_PROBE)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(results.values()), results
