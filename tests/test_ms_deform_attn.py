"""Multi-scale deformable attention: portable numerics, provider eligibility, Hub decline and fallback."""

from __future__ import annotations

import contextlib
import math
import sys
import types
import warnings

import pytest
import torch

from libreyolo import kernels
from libreyolo.kernels import _providers, _registry
from libreyolo.kernels.attention import deformable_hub as hub
from libreyolo.kernels.attention import deformable_triton
from libreyolo.kernels.attention.deformable import (
    accelerated_inputs_ok,
    level_start_index,
    ms_deform_attn,
    ms_deform_attn_portable,
)

SLOT = "ms_deform_attn"
SHAPES = [(4, 5), (2, 3), (1, 1)]


@pytest.fixture(autouse=True)
def isolated_registry(monkeypatch):
    for name in ("LIBREYOLO_KERNELS", "LIBREYOLO_QUANT_KERNELS", "LIBREYOLO_HUB_KERNELS"):
        monkeypatch.delenv(name, raising=False)
    _providers.load_once()  # so the snapshot keeps whatever this machine's providers register
    state = _registry._snapshot()
    yield
    _registry._restore(state)


def make_inputs(batch=2, queries=3, heads=2, channels=4, shapes=SHAPES, points=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    length = sum(h * w for h, w in shapes)
    value = torch.randn(batch, length, heads, channels, generator=gen)
    # Locations reach a little outside [0, 1] to exercise zero padding.
    locs = torch.rand(batch, queries, heads, len(shapes), points, 2, generator=gen) * 1.3 - 0.15
    weights = torch.rand(batch, queries, heads, len(shapes), points, generator=gen)
    return value, shapes, locs, weights


def naive_bilinear(value_l, x, y):
    """value_l (H, W, C) sampled at normalised (x, y) like grid_sample(align_corners=False, zeros)."""
    height, width, channels = value_l.shape
    px, py = x * width - 0.5, y * height - 0.5
    x0, y0 = math.floor(px), math.floor(py)
    out = torch.zeros(channels, dtype=torch.float64)
    for yi, wy in ((y0, 1 - (py - y0)), (y0 + 1, py - y0)):
        for xi, wx in ((x0, 1 - (px - x0)), (x0 + 1, px - x0)):
            if 0 <= xi < width and 0 <= yi < height:
                out += wx * wy * value_l[yi, xi].double()
    return out


def naive_nearest(value_l, x, y):
    height, width, _ = value_l.shape
    xi = min(max(int(x * width + 0.5), 0), width - 1)
    yi = min(max(int(y * height + 0.5), 0), height - 1)
    return value_l[yi, xi].double()


def naive(value, shapes, locs, weights, points, sample=naive_bilinear):
    """Loop-by-loop oracle over the flattened (B, Q, heads, sum P, 2) layout."""
    batch, _, heads, channels = value.shape
    queries = locs.shape[1]
    out = torch.zeros(batch, queries, heads, channels, dtype=torch.float64)
    starts = [0]
    for h, w in shapes:
        starts.append(starts[-1] + h * w)
    for b in range(batch):
        for q in range(queries):
            for head in range(heads):
                j = 0
                for level, (h, w) in enumerate(shapes):
                    value_l = value[b, starts[level] : starts[level + 1], head].reshape(h, w, channels)
                    for _ in range(points[level]):
                        x, y = locs[b, q, head, j].tolist()
                        out[b, q, head] += weights[b, q, head, j].double() * sample(value_l, x, y)
                        j += 1
    return out.reshape(batch, queries, heads * channels).float()


def test_portable_matches_a_loop_by_loop_bilinear_oracle():
    value, shapes, locs, weights = make_inputs()
    out = ms_deform_attn_portable(value, shapes, locs, weights)
    flat_locs = locs.flatten(3, 4)
    expected = naive(value, shapes, flat_locs, weights.flatten(3), [2, 2, 2])
    assert out.shape == (2, 3, 2 * 4)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_spatial_shapes_may_be_a_tensor():
    value, shapes, locs, weights = make_inputs()
    torch.testing.assert_close(
        ms_deform_attn_portable(value, torch.tensor(shapes), locs, weights),
        ms_deform_attn_portable(value, shapes, locs, weights),
    )


def test_equal_points_per_level_in_the_flat_layout_equal_the_6d_layout():
    value, shapes, locs, weights = make_inputs(points=3)
    flat = ms_deform_attn_portable(value, shapes, locs.flatten(3, 4), weights.flatten(3), points_per_level=[3] * 3)
    torch.testing.assert_close(flat, ms_deform_attn_portable(value, shapes, locs, weights))


def test_points_that_differ_between_levels_match_the_oracle():
    value, shapes, _, _ = make_inputs()
    points = [3, 1, 2]
    locs = torch.rand(2, 3, 2, sum(points), 2)
    weights = torch.rand(2, 3, 2, sum(points))
    out = ms_deform_attn_portable(value, shapes, locs, weights, points_per_level=points)
    torch.testing.assert_close(out, naive(value, shapes, locs, weights, points), rtol=1e-5, atol=1e-5)


def test_discrete_sampling_picks_the_nearest_pixel_per_axis():
    value, shapes, locs, weights = make_inputs(shapes=[(3, 5), (2, 2)], points=2)
    out = ms_deform_attn_portable(value, [(3, 5), (2, 2)], locs, weights, discrete=True)
    expected = naive(value, [(3, 5), (2, 2)], locs.flatten(3, 4), weights.flatten(3), [2, 2], naive_nearest)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_portable_gradients_flow_to_value_locations_and_weights():
    value, shapes, locs, weights = make_inputs()
    for t in (value, locs, weights):
        t.requires_grad_()
    ms_deform_attn_portable(value, shapes, locs, weights).square().sum().backward()
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in (value, locs, weights))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"shapes": [(4, 5), (2, 3)]}, "cover 26 positions but value has S=27"),
        ({"points_per_level": [2, 2]}, "needs 3 positive counts"),
        ({"weights": torch.rand(2, 3, 2, 3, 1)}, "attention_weights"),
    ],
)
def test_portable_explains_inconsistent_inputs(change, message):
    value, shapes, locs, weights = make_inputs()
    with pytest.raises(ValueError, match=message):
        ms_deform_attn_portable(
            value,
            change.get("shapes", shapes),
            locs,
            change.get("weights", weights),
            points_per_level=change.get("points_per_level"),
        )


def test_level_start_index_is_the_running_sum_of_level_sizes():
    assert level_start_index(torch.tensor(SHAPES)).tolist() == [0, 20, 26]


# --- the slot helper and provider eligibility ---------------------------------


def test_helper_runs_the_portable_path_when_no_provider_is_eligible():
    value, shapes, locs, weights = make_inputs()
    if not torch.cuda.is_available():
        assert kernels.active()[SLOT] == kernels.UNAVAILABLE
    assert kernels.resolve(SLOT, value, shapes, locs, weights) is None  # CPU inputs
    torch.testing.assert_close(
        ms_deform_attn(value, shapes, locs, weights), ms_deform_attn_portable(value, shapes, locs, weights)
    )


def test_helper_uses_an_eligible_provider_with_the_same_arguments():
    seen = []

    def provider(value, spatial_shapes, sampling_locations, attention_weights, **options):
        seen.append(options)
        return torch.zeros(1)

    kernels.register(SLOT, provider, name="fake", predicate=lambda *a, **k: not k.get("discrete"))
    value, shapes, locs, weights = make_inputs()
    assert ms_deform_attn(value, shapes, locs, weights).tolist() == [0.0]
    assert seen == [{"points_per_level": None, "discrete": False}]
    assert ms_deform_attn(value, shapes, locs, weights, discrete=True).shape == (2, 3, 8)


def test_provider_failing_mid_run_is_disabled_warned_once_and_portable_answers():
    calls = []

    def crashing(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("illegal memory access")

    kernels.register(SLOT, crashing, name="crashing")
    value, shapes, locs, weights = make_inputs()
    expected = ms_deform_attn_portable(value, shapes, locs, weights)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = ms_deform_attn(value, shapes, locs, weights)
        second = ms_deform_attn(value, shapes, locs, weights)
    torch.testing.assert_close(first, expected)
    torch.testing.assert_close(second, expected)
    assert calls == [1]
    messages = [str(w.message) for w in caught if issubclass(w.category, kernels.KernelWarning)]
    assert len(messages) == 1 and "crashing" in messages[0]


def eligible_cpu(**changes):
    value, shapes, locs, weights = make_inputs()
    args = {"value": value, "locs": locs, "weights": weights, "points_per_level": None, "discrete": False}
    args.update(changes)
    return accelerated_inputs_ok(
        args["value"],
        shapes,
        args["locs"],
        args["weights"],
        args["points_per_level"],
        args["discrete"],
        allow_grad=args.get("allow_grad", False),
        device_type="cpu",
    )


def test_eligibility_accepts_float32_eager_inputs_on_the_expected_device():
    assert eligible_cpu()
    assert eligible_cpu(points_per_level=[2, 2, 2])


@pytest.mark.parametrize(
    "changes",
    [
        {"discrete": True},
        {"points_per_level": [2, 1, 3]},
        {"value": make_inputs()[0].double()},
        {"weights": make_inputs()[3].half()},
        {"value": make_inputs()[0].requires_grad_()},
    ],
    ids=["discrete", "uneven-points", "float64", "float16", "needs-grad"],
)
def test_eligibility_declines_layouts_dtypes_and_training(changes):
    assert not eligible_cpu(**changes)


def test_eligibility_allows_grad_for_providers_with_a_backward():
    assert eligible_cpu(value=make_inputs()[0].requires_grad_(), allow_grad=True)
    with torch.no_grad():
        assert eligible_cpu(value=make_inputs()[0].requires_grad_())


@pytest.mark.parametrize(
    ("namespace", "flag"),
    [
        (torch.compiler, "is_compiling"),
        (torch.compiler, "is_exporting"),
        (torch.onnx, "is_in_onnx_export"),
        (torch.jit, "is_tracing"),
    ],
)
def test_eligibility_declines_while_compiling_exporting_or_tracing(monkeypatch, namespace, flag):
    monkeypatch.setattr(namespace, flag, lambda: True)
    assert not eligible_cpu()


def test_triton_provider_imports_without_cuda_and_declines_here():
    value, shapes, locs, weights = make_inputs()
    if not torch.cuda.is_available():
        assert not deformable_triton.eligible()
    assert not deformable_triton.eligible(value, shapes, locs, weights)


# --- Hub provider: decline and fallback (the Hub itself is not reachable here) ---


@contextlib.contextmanager
def fake_kernels_package(get_kernel):
    module = types.ModuleType("kernels")
    module.get_kernel = get_kernel
    previous = sys.modules.get("kernels")
    sys.modules["kernels"] = module
    try:
        yield module
    finally:
        if previous is None:
            sys.modules.pop("kernels", None)
        else:
            sys.modules["kernels"] = previous


def cpu_hub_provider():
    provider = hub.HubMsDeformAttn(device_type="cpu")
    kernels.register(SLOT, provider, name=hub.NAME, predicate=provider.eligible)
    return provider


def test_hub_provider_declines_without_the_kernels_package():
    if "kernels" in sys.modules or hub._package_present("kernels"):
        pytest.skip("the optional `kernels` package is installed here")
    provider = cpu_hub_provider()
    value, shapes, locs, weights = make_inputs()
    assert not provider.eligible(value, shapes, locs, weights)
    torch.testing.assert_close(
        ms_deform_attn(value, shapes, locs, weights), ms_deform_attn_portable(value, shapes, locs, weights)
    )
    assert "kernels" not in sys.modules


def test_hub_provider_pins_a_full_commit_revision():
    assert len(hub.HUB_REVISION) == 40 and all(c in "0123456789abcdef" for c in hub.HUB_REVISION)


def test_hub_kernel_failing_to_load_disables_itself_warns_once_and_falls_back():
    attempts = []

    def get_kernel(repo, revision=None):
        attempts.append((repo, revision))
        raise ConnectionError("no route to huggingface.co")

    value, shapes, locs, weights = make_inputs()
    expected = ms_deform_attn_portable(value, shapes, locs, weights)
    with fake_kernels_package(get_kernel):
        provider = cpu_hub_provider()
        assert attempts == []  # registering loads nothing
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            first = ms_deform_attn(value, shapes, locs, weights)
            second = ms_deform_attn(value, shapes, locs, weights)
    torch.testing.assert_close(first, expected)
    torch.testing.assert_close(second, expected)
    assert attempts == [(hub.HUB_REPO, hub.HUB_REVISION)]
    assert provider.failed and not provider.eligible()
    messages = [str(w.message) for w in caught if issubclass(w.category, kernels.KernelWarning)]
    assert len(messages) == 1 and "no route to huggingface.co" in messages[0]


def test_hub_kernel_failing_to_run_disables_itself_and_falls_back():
    def forward(*args):
        raise RuntimeError("no kernel image is available for execution on the device")

    broken = types.SimpleNamespace(ms_deform_attn_forward=forward, ms_deform_attn_backward=forward)
    value, shapes, locs, weights = make_inputs()
    with fake_kernels_package(lambda repo, revision=None: broken):
        cpu_hub_provider()
        with pytest.warns(kernels.KernelWarning, match="no kernel image"):
            out = ms_deform_attn(value, shapes, locs, weights)
    torch.testing.assert_close(out, ms_deform_attn_portable(value, shapes, locs, weights))
    assert kernels.active()[SLOT] != hub.NAME


def fake_hub_forward(value, shapes, starts, locs, weights, step):
    assert starts.tolist() == level_start_index(shapes).tolist() and step == value.shape[0]
    return ms_deform_attn_portable(value, shapes, locs, weights)


def test_hub_kernel_that_loads_is_used_with_its_backward():
    backward_calls = []

    def backward(value, shapes, starts, locs, weights, grad, step):
        backward_calls.append(grad.shape)
        return torch.ones_like(value), torch.zeros_like(locs), torch.zeros_like(weights)

    fake = types.SimpleNamespace(ms_deform_attn_forward=fake_hub_forward, ms_deform_attn_backward=backward)
    value, shapes, locs, weights = make_inputs()
    value.requires_grad_()
    with fake_kernels_package(lambda repo, revision=None: fake):
        cpu_hub_provider()
        out = ms_deform_attn(value, shapes, locs, weights)
    out.sum().backward()
    assert backward_calls == [out.shape]
    assert torch.equal(value.grad, torch.ones_like(value))  # the Hub's backward, not autograd's


def test_hub_env_switch_makes_the_provider_decline(monkeypatch):
    value, shapes, locs, weights = make_inputs()
    with fake_kernels_package(lambda repo, revision=None: pytest.fail("must not load")):
        provider = cpu_hub_provider()
        assert provider.eligible(value, shapes, locs, weights)
        monkeypatch.setenv("LIBREYOLO_HUB_KERNELS", "0")
        assert not provider.eligible(value, shapes, locs, weights)
        out = ms_deform_attn(value, shapes, locs, weights)
    torch.testing.assert_close(out, ms_deform_attn_portable(value, shapes, locs, weights))


def test_hub_provider_declines_uneven_points_and_discrete_sampling():
    value, shapes, locs, weights = make_inputs()
    with fake_kernels_package(lambda repo, revision=None: pytest.fail("must not load")):
        provider = cpu_hub_provider()
        assert not provider.eligible(value, shapes, locs, weights, discrete=True)
        flat_locs, flat_weights = locs.flatten(3, 4), weights.flatten(3)
        assert not provider.eligible(value, shapes, flat_locs, flat_weights, points_per_level=[1, 2, 3])
        ms_deform_attn(value, shapes, locs, weights, discrete=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present: the device check passes here")
def test_the_real_hub_provider_requires_cuda():
    value, shapes, locs, weights = make_inputs()
    with fake_kernels_package(lambda repo, revision=None: pytest.fail("must not load")):
        assert not hub.HubMsDeformAttn().eligible(value, shapes, locs, weights)


class DeformableBlock(torch.nn.Module):
    def forward(self, value, locs, weights):
        return ms_deform_attn(value, SHAPES, locs, weights)


def test_exported_graph_carries_the_portable_ops_even_with_a_provider_registered():
    calls = []
    kernels.register(SLOT, lambda *a, **k: calls.append(1), name="eager_only")
    value, shapes, locs, weights = make_inputs()
    exported = torch.export.export(DeformableBlock(), (value, locs, weights))
    targets = {str(node.target) for node in exported.graph.nodes}
    assert calls == [] and any("grid_sampler" in t for t in targets)
    torch.testing.assert_close(
        exported.module()(value, locs, weights), ms_deform_attn_portable(value, shapes, locs, weights)
    )
