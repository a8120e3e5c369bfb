"""YOLOX preprocessing (Pillow-exact letterbox, BGR 0..255) and decoding (one label per box)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from libreyolo.models.registry import get_family
from libreyolo.models.yolox import decode

FAMILY = get_family("yolox")


def _pillow_letterbox(rgb: np.ndarray, size: int) -> np.ndarray:
    """What the reference feeds its YOLOX network: Pillow bilinear to int(side * ratio), BGR 0..255,
    top-left on grey 114 (measured on its predict(); see libreyolo/models/yolox/family.py)."""
    h, w = rgb.shape[:2]
    r = min(size / h, size / w)
    nw, nh = int(w * r), int(h * r)
    img = Image.fromarray(rgb)
    resized = np.asarray(img.resize((nw, nh), Image.BILINEAR) if (nw, nh) != (w, h) else img)
    out = np.full((3, size, size), 114.0, dtype=np.float32)
    out[:, :nh, :nw] = resized[..., ::-1].transpose(2, 0, 1)
    return out


@pytest.mark.parametrize("hw, size", [
    ((480, 640), 416),   # the fixtures' sample: both sides shrink
    ((900, 300), 320),   # taller than 2:1: Pillow 13 runs the vertical pass first
    ((50, 71), 320),     # enlarged
    ((333, 1000), 416),
    ((320, 320), 320),   # no resize at all
])
def test_letterbox_is_the_reference_pillow_pipeline_byte_for_byte(hw, size):
    rng = np.random.default_rng(sum(hw))
    rgb = rng.integers(0, 256, (*hw, 3), dtype=np.uint8)
    rgb = np.ascontiguousarray(np.cumsum(rgb, axis=0, dtype=np.int64) % 256).astype(np.uint8)  # some structure
    batch, metas = FAMILY.letterbox(size)([torch.from_numpy(rgb).permute(2, 0, 1)])
    want = _pillow_letterbox(rgb, size)
    assert batch.shape == (1, 3, size, size)
    assert torch.equal(batch[0], torch.from_numpy(want))
    assert metas[0].pad == (0.0, 0.0) and metas[0].ratio == min(size / hw[0], size / hw[1])


def test_float_inputs_are_quantised_to_8_bit_first():
    rgb = np.random.default_rng(0).integers(0, 256, (120, 90, 3), dtype=np.uint8)
    u8 = torch.from_numpy(rgb).permute(2, 0, 1)
    a, _ = FAMILY.letterbox(64)([u8])
    b, _ = FAMILY.letterbox(64)([u8.float() / 255.0])
    assert torch.equal(a, b)


def test_letterbox_declares_what_it_feeds_the_network():
    box = FAMILY.letterbox(416)
    assert box.neutral_input == 114.0  # 0..255 input, not [0, 1]
    d = box.describe()
    assert d["channels"] == "BGR" and d["divisor"] == 1.0 and d["size_rounding"] == "floor"
    assert d["resize"].startswith("pil-bilinear")
    assert FAMILY.export.input_color == "BGR" and FAMILY.export.input_scale == 1.0
    assert not FAMILY.export.image_input  # CoreML gets a float tensor, not an RGB [0, 1] image


def _levels(nc: int = 3) -> list[torch.Tensor]:
    return [torch.zeros(1, 5 + nc, s, s) for s in (4, 2, 1)]  # a 32 x 32 input


def test_decode_places_boxes_on_the_grid_in_input_pixels():
    levels = _levels()
    lv = levels[1]  # stride 16
    lv[0, 0:4, 1, 0] = torch.tensor([0.25, 0.5, float(np.log(2.0)), 0.0])  # cell x=0, y=1
    lv[0, 4, 1, 0] = 0.5
    lv[0, 5:, 1, 0] = torch.tensor([0.2, 0.8, 0.4])
    pred = decode(levels)
    assert pred.shape == (1, 4 + 3, 16 + 4 + 1)
    col = 16 + 1 * 2 + 0  # level offset + y * W + x
    cx, cy, w, h = (0.25 + 0) * 16, (0.5 + 1) * 16, 2.0 * 16, 1.0 * 16
    assert torch.allclose(pred[0, :4, col], torch.tensor([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]))
    # score = objectness x class probability, for the best class only
    assert torch.allclose(pred[0, 4:, col], torch.tensor([0.0, 0.4, 0.0]))


def test_decode_keeps_the_first_class_on_an_exact_tie():
    levels = _levels()
    levels[0][0, 4] = 1.0
    levels[0][0, 5:] = torch.tensor([0.3, 0.7, 0.7]).view(3, 1, 1)
    scores = decode(levels)[0, 4:, :16]
    assert torch.equal(scores[1], torch.full((16,), 0.7)) and not scores[0].any() and not scores[2].any()


def test_predict_labels_each_box_once():
    from libreyolo import SAMPLE_IMAGE
    from tests.test_export_yolox import seeded_yolox

    r = seeded_yolox().predict(SAMPLE_IMAGE, conf=0.05, imgsz=320)
    assert len(r) > 10
    boxes = [tuple(round(v, 3) for v in b) for b in r.boxes.xyxy.tolist()]
    assert len(set(boxes)) == len(boxes)  # multi-label would repeat a box with another class


@pytest.mark.gpu
@pytest.mark.parametrize("size", ["n", "t", "s", "m", "l", "x"])
def test_graph_replay_is_bit_for_bit_eager_for_every_size(size):
    """The parity matrix rows for yolox (run on the GPU before SUPPORTS_CUDA_GRAPH is switched on)."""
    from libreyolo.graphs.parity import check_family_size

    rows = check_family_size("yolox", size, device="cuda", imgszs=(640, 320))
    failed = [f"{r['check']}: {r['detail']}" for r in rows if r["result"] == "fail"]
    assert not failed, failed
    assert {r["check"] for r in rows if r["result"] == "pass"} >= {
        "probe_uniform", "probe_normal", "probe_ramps", "probe_image", "second_replay", "interleaved", "fp16"}
