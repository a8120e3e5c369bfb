"""model.quantize() on a GPU: simulated INT8 predict on CUDA, and CUDA graphs after quantize and
dequantize (a quantize retires the captured graphs like a weight change; the next graphed call
recaptures and returns the quantized eager bits).

    PYTHONPATH=. python3 -m pytest -m gpu tests/test_quantize_gpu.py
"""
from __future__ import annotations

import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.train.shapes import make_shapes_dataset, sample_image

pytestmark = [pytest.mark.gpu]

IMGSZ = 160


def _dets(r) -> torch.Tensor:
    b = r.boxes
    return torch.cat([b.xyxy, b.conf[:, None], b.cls[:, None].float()], 1)


@pytest.mark.parametrize("recipe", ["int8", "fp8"])
def test_graphed_predict_after_quantize_and_dequantize_is_eager(tmp_path, recipe):
    data = make_shapes_dataset(tmp_path / "calib", n_train=8, n_val=2, imgsz=IMGSZ, seed=3)
    image = sample_image(seed=1, imgsz=IMGSZ)
    model = LibreYOLO("LibreYOLO9t-shapes.pt", device="cuda")
    model.imgsz = IMGSZ
    try:
        float_eager = _dets(model.predict(image, conf=0.1))
        assert torch.equal(_dets(model.predict(image, conf=0.1, cuda_graph=True)), float_eager)
        captures = model.graph_info()["captures"]
        model.quantize(recipe=recipe, data=str(data), samples=8)
        q_eager = _dets(model.predict(image, conf=0.1))
        assert len(q_eager) and not torch.equal(q_eager, float_eager)  # the simulation is in effect on CUDA
        q_graph = _dets(model.predict(image, conf=0.1, cuda_graph=True))
        assert torch.equal(q_graph, q_eager)  # recaptured on the quantized network, not the stale float graph
        assert model.graph_info()["captures"] > captures
        model.dequantize()
        assert torch.equal(_dets(model.predict(image, conf=0.1)), float_eager)
        assert torch.equal(_dets(model.predict(image, conf=0.1, cuda_graph=True)), float_eager)
    finally:
        model.release_graphs()
