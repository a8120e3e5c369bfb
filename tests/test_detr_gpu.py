"""DETR families on CUDA: graph capture parity and the ms_deform_attn providers inside the models.

Run on the GPU machine: ``PYTHONPATH=. python3 -m pytest -m gpu tests/test_detr_gpu.py``. The
families keep ``SUPPORTS_CUDA_GRAPH = False`` until this (and the parity matrix,
``python -m libreyolo.graphs.parity --family rtdetr`` / ``--family dfine``) passes on a GPU.
"""
from __future__ import annotations

import pytest
import torch

from libreyolo import kernels
from libreyolo.kernels import _registry
from tests.test_compat_detr import rows_match

pytestmark = pytest.mark.gpu
CASES = [("rtdetr", "r18"), ("dfine", "n"), ("dfine", "s")]
SLOT = "ms_deform_attn"


@pytest.mark.parametrize(("family", "size"), CASES[:2])
def test_detr_forward_replays_bit_for_bit_in_the_parity_harness(family, size):
    from libreyolo.graphs.parity import check_family_size

    rows = check_family_size(family, size, imgszs=(640, 320))
    failed = [r for r in rows if r["result"] == "fail"]
    assert rows and not failed, failed


@pytest.mark.parametrize(("family", "size"), CASES)
def test_detr_capture_needs_no_host_tensor(family, size):
    """Capture in CUDA's strict mode: a host-to-device copy or a sync inside the forward raises."""
    from libreyolo.graphs.parity import seeded_model

    model = seeded_model(family, size, device="cuda")
    net = model.inference_module()
    x = torch.rand(1, 3, 640, 640, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.inference_mode(), torch.cuda.stream(side):
        for _ in range(2):  # warm-up builds the per-shape anchors, masks and level shapes
            eager = net(x)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side, capture_error_mode="global"):
            static = net(x)
    torch.cuda.current_stream().wait_stream(side)
    graph.replay()
    torch.cuda.synchronize()
    for k in ("pred_logits", "pred_boxes"):
        assert torch.equal(static[k], eager[k]), k


def _providers() -> list[str]:
    kernels.active()  # registers the lazy providers
    return [impl.name for impl in _registry._selection(SLOT).ordered]


@pytest.mark.parametrize(("family", "size"), CASES)
def test_deformable_providers_match_the_portable_path_inside_the_model(family, size):
    """Triton/Hub against grid_sample on the whole network: within 1e-4 per query row (different
    summation order of the bilinear taps; outputs are identical up to float rounding)."""
    from libreyolo.graphs.parity import seeded_model

    names = _providers()
    if not names:
        pytest.skip("no ms_deform_attn provider is available here (Triton or the kernels package)")
    model = seeded_model(family, size, device="cuda")
    net = model.inference_module()
    x = torch.rand(2, 3, 640, 640, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    state = _registry._snapshot()
    try:
        for n in names:
            kernels.disable(SLOT, n, "test: portable reference")
        with torch.inference_mode():
            portable = net(x)
        _registry._restore(state)
        for name in names:
            for other in names:
                if other != name:
                    kernels.disable(SLOT, other, "test: one provider at a time")
            with torch.inference_mode():
                got = net(x)
            _registry._restore(state)
            for b in range(x.shape[0]):
                ours = torch.cat([got["pred_logits"][b], got["pred_boxes"][b]], -1).cpu().numpy()
                ref = torch.cat([portable["pred_logits"][b], portable["pred_boxes"][b]], -1).cpu().numpy()
                ok, moved, err = rows_match(ours, ref, 1e-4)
                assert ok, f"{family}-{size} provider {name}: {moved} rows differ, max error {err:.3g}"
    finally:
        _registry._restore(state)
