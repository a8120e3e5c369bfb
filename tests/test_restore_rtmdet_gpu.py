"""CUDA graphs of SwinIR and RTMDet on a real GPU: the parity rows of every size, and predict()
with ``cuda_graph=True`` returning eager's bits (SwinIR: one capture per padded size).

    PYTHONPATH=. python3 -m pytest -m gpu tests/test_restore_rtmdet_gpu.py
"""
from __future__ import annotations

import pytest
import torch

from libreyolo.graphs.parity import check_family_size, seeded_model

pytestmark = [pytest.mark.gpu]


@pytest.mark.parametrize(("family", "size", "imgszs"), [
    *[("rtmdet", s, (640, 320)) for s in ("t", "s", "m", "l", "x")],
    *[("swinir", s, (64, 32)) for s in ("s", "m", "l")],
])
def test_graph_parity_rows(family, size, imgszs):
    rows = check_family_size(family, size, device="cuda", imgszs=imgszs)
    failed = [f"{r['check']}: {r['detail']}" for r in rows if r["result"] == "fail"]
    assert not failed, failed
    passed = {r["check"] for r in rows if r["result"] == "pass"}
    assert passed >= {"probe_uniform", "probe_normal", "probe_ramps", "probe_image", "second_replay", "interleaved",
                      "batch2", "fp16"}


def test_swinir_graphed_predict_is_eager_for_odd_sizes():
    model = seeded_model("swinir", "s", device="cuda")
    g = torch.Generator().manual_seed(0)
    try:
        for h, w in ((97, 131), (40, 72), (97, 131)):
            img = (torch.rand(3, h, w, generator=g) * 255).to(torch.uint8)
            eager = model.predict(img).restored.data
            graphed = model.predict(img, cuda_graph=True).restored.data
            assert tuple(graphed.shape) == (4 * h, 4 * w, 3)
            assert torch.equal(graphed, eager)
        info = model.graph_info()
        assert info["captures"] == 2, info  # one per padded size (104x136 and 40x72), the repeat replays
        img = (torch.rand(3, 97, 131, generator=g) * 255).to(torch.uint8)
        tiled = model.predict(img, tile=48, tile_pad=16).restored.data
        assert torch.equal(model.predict(img, tile=48, tile_pad=16, cuda_graph=True).restored.data, tiled)
    finally:
        model.release_graphs()


def test_rtmdet_graphed_predict_is_eager():
    from libreyolo import SAMPLE_IMAGE

    model = seeded_model("rtmdet", "t", device="cuda")
    try:
        eager = model.predict(SAMPLE_IMAGE, conf=0.05)
        graphed = model.predict(SAMPLE_IMAGE, conf=0.05, cuda_graph=True)
        assert len(eager) > 0
        assert torch.equal(graphed.boxes.xyxy, eager.boxes.xyxy)
        assert torch.equal(graphed.boxes.conf, eager.boxes.conf)
        assert torch.equal(graphed.boxes.cls, eager.boxes.cls)
    finally:
        model.release_graphs()
