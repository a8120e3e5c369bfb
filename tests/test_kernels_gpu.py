"""GPU parity of the in-tree Triton providers with the references (run on a CUDA machine).

    PYTHONPATH=. python3 -m pytest -m gpu tests/test_kernels_gpu.py

Parity rule: fake quantization matches the reference exactly in the forward
pass and within 1e-6 in the gradient; deformable attention matches the
portable path within float32 noise (tests/numerics.py: as close to the portable path run in
float64 as the float32 portable path is, times NOISE_MULTIPLE).
"""

from __future__ import annotations

import pytest
import torch

from libreyolo import kernels
from libreyolo.kernels.attention.deformable import ms_deform_attn, ms_deform_attn_portable
from libreyolo.quant import fake_quant_fp8, fake_quant_int8_affine, fake_quant_int8_per_channel
from tests.numerics import assert_within_float32_noise, float64_run

pytestmark = [
    pytest.mark.gpu,
]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(7,), (3, 5, 11), (1024,), (4097,), (2, 64, 33, 17)]
GRAD_TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def triton_quant():
    pytest.importorskip("triton", reason="Triton not installed")
    from libreyolo.kernels.quant import triton_provider

    return triton_provider


@pytest.fixture(scope="module")
def triton_msda():
    pytest.importorskip("triton", reason="Triton not installed")
    from libreyolo.kernels.attention import deformable_triton

    return deformable_triton


def spread(shape, dtype, seed=0):
    """Values over many binades, plus the edge cases of the formats."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(shape, device="cuda", generator=gen)
    x = x * torch.pow(10.0, torch.empty(shape, device="cuda").uniform_(-4, 3, generator=gen))
    edges = torch.tensor(
        [0.0, -0.0, 0.5, 1.5, -2.5, 127.5, -128.5, 448.0, -449.0, 1e30, 2.0**-9, 3 * 2.0**-10], device="cuda"
    )
    flat = x.reshape(-1)
    flat[: min(flat.numel(), edges.numel())] = edges[: flat.numel()]
    return x.to(dtype)


def check_parity(provider, reference, x, *args):
    xa = x.clone().requires_grad_()
    xb = x.clone().requires_grad_()
    out_provider, out_reference = provider(xa, *args), reference(xb, *args)
    assert out_provider.dtype == out_reference.dtype and out_provider.shape == out_reference.shape
    assert torch.equal(out_provider, out_reference), (out_provider - out_reference).abs().max()
    grad = torch.randn_like(out_reference)
    out_provider.backward(grad)
    out_reference.backward(grad)
    assert (xa.grad.float() - xb.grad.float()).abs().max().item() <= GRAD_TOLERANCE


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1.0, 0.37, 1e-3])
def test_triton_fp8_matches_the_reference(triton_quant, shape, dtype, scale):
    x = spread(shape, dtype)
    check_parity(triton_quant.fake_quant_fp8, fake_quant_fp8, x, torch.tensor(scale, device="cuda"))


@pytest.mark.parametrize(("shape", "axis"), [((64, 3, 3, 3), 0), ((5, 7, 9), 1), ((33, 130), -1), ((4097,), 0)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_int8_per_channel_matches_the_reference(triton_quant, shape, axis, dtype):
    x = spread(shape, dtype, seed=1)
    scale = torch.rand(shape[axis], device="cuda") * 0.5 + 1e-3
    check_parity(triton_quant.fake_quant_int8_per_channel, fake_quant_int8_per_channel, x, scale, axis)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("zero_point", [-128, 0, 17, 127])
def test_triton_int8_affine_matches_the_reference(triton_quant, shape, dtype, zero_point):
    x = spread(shape, dtype, seed=2)
    scale = torch.tensor(0.05, device="cuda")
    check_parity(
        triton_quant.fake_quant_int8_affine,
        fake_quant_int8_affine,
        x,
        scale,
        torch.tensor(zero_point, device="cuda"),
    )


def test_triton_quant_handles_non_contiguous_inputs(triton_quant):
    x = spread((64, 48), torch.float32).t()
    assert torch.equal(triton_quant.fake_quant_fp8(x, 0.1), fake_quant_fp8(x, 0.1))


def test_registry_selects_triton_for_cuda_quant_calls(triton_quant):
    x = spread((8, 8), torch.float16)
    assert kernels.selected("fake_quant_fp8", x, 0.5).name == "triton"
    assert kernels.selected("fake_quant_fp8", x.cpu(), 0.5).name == kernels.REFERENCE
    assert torch.equal(kernels.call("fake_quant_fp8", x, 0.5), fake_quant_fp8(x, 0.5))
    assert kernels.active()["fake_quant_int8_affine"] == "triton"


MSDA_CASES = [
    # batch, queries, heads, channels, level shapes, points
    (1, 300, 8, 32, [(64, 64), (32, 32), (16, 16), (8, 8)], 4),
    (2, 50, 8, 32, [(20, 25), (10, 13), (5, 7)], 4),
    (3, 17, 4, 16, [(7, 5)], 3),
    (1, 5, 2, 48, [(3, 4), (2, 2)], 2),
    (2, 9, 1, 8, [(1, 1), (2, 9)], 1),
]


def msda_inputs(batch, queries, heads, channels, shapes, points, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    length = sum(h * w for h, w in shapes)
    value = torch.randn(batch, length, heads, channels, device="cuda", generator=gen)
    locs = torch.rand(batch, queries, heads, len(shapes), points, 2, device="cuda", generator=gen) * 1.3 - 0.15
    weights = torch.rand(batch, queries, heads, len(shapes), points, device="cuda", generator=gen)
    return value, shapes, locs, weights


@pytest.mark.parametrize("case", MSDA_CASES, ids=lambda c: f"B{c[0]}Q{c[1]}H{c[2]}C{c[3]}L{len(c[4])}P{c[5]}")
def test_triton_ms_deform_attn_matches_the_portable_path(triton_msda, case):
    value, shapes, locs, weights = msda_inputs(*case)
    expected = ms_deform_attn_portable(value, shapes, locs, weights)
    exact = float64_run(ms_deform_attn_portable, value, shapes, locs, weights)
    for spatial in (shapes, torch.tensor(shapes, device="cuda")):
        out = triton_msda.ms_deform_attn_triton(value, spatial, locs, weights)
        assert_within_float32_noise(out, expected, exact)


def test_triton_ms_deform_attn_accepts_the_flat_layout_with_equal_points(triton_msda):
    value, shapes, locs, weights = msda_inputs(*MSDA_CASES[1])
    expected = ms_deform_attn_portable(value, shapes, locs, weights)
    out = triton_msda.ms_deform_attn_triton(
        value, shapes, locs.flatten(3, 4), weights.flatten(3), points_per_level=[4, 4, 4]
    )
    assert_within_float32_noise(out, expected, float64_run(ms_deform_attn_portable, value, shapes, locs, weights))


def test_ms_deform_attn_helper_uses_triton_for_inference_and_portable_for_training(triton_msda):
    value, shapes, locs, weights = msda_inputs(*MSDA_CASES[1])
    if kernels.active()["ms_deform_attn"] == "hub":
        pytest.skip("the `kernels` package is installed: the Hub provider wins")
    with torch.no_grad():
        assert kernels.selected("ms_deform_attn", value, shapes, locs, weights).name == "triton"
        assert_within_float32_noise(
            ms_deform_attn(value, shapes, locs, weights),
            ms_deform_attn_portable(value, shapes, locs, weights),
            float64_run(ms_deform_attn_portable, value, shapes, locs, weights),
        )
    value.requires_grad_()
    assert kernels.selected("ms_deform_attn", value, shapes, locs, weights) is None
    ms_deform_attn(value, shapes, locs, weights).sum().backward()
    assert value.grad is not None


def test_triton_ms_deform_attn_declines_layouts_it_does_not_cover(triton_msda):
    value, shapes, locs, weights = msda_inputs(*MSDA_CASES[1])
    with torch.no_grad():
        assert not triton_msda.eligible(value, shapes, locs, weights, discrete=True)
        assert not triton_msda.eligible(value.double(), shapes, locs.double(), weights.double())
        flat_locs = torch.rand(2, 50, 8, 9, 2, device="cuda")
        flat_weights = torch.rand(2, 50, 8, 9, device="cuda")
        assert not triton_msda.eligible(value, shapes, flat_locs, flat_weights, points_per_level=[4, 3, 2])
