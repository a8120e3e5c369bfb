"""predict(): inputs, arguments, Results, and clear errors for bad input."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from libreyolo import SAMPLE_IMAGE
from libreyolo.errors import ArgumentError, ImageError
from libreyolo.results import Results

from .conftest import seeded_model

IMGSZ = 320


@pytest.fixture(scope="module")
def model():
    return seeded_model("t", seed=0)


@pytest.fixture(scope="module")
def sample_rgb():
    return np.asarray(Image.open(SAMPLE_IMAGE).convert("RGB"))


def _same(a: Results, b: Results, exact: bool = True) -> None:
    if not exact:  # another batch size changes float rounding: same detections, as sets
        from tests.compat_utils import set_match

        dets = [{"xyxy": r.boxes.xyxy, "conf": r.boxes.conf, "cls": r.boxes.cls} for r in (a, b)]
        assert len(a) == len(b) and set_match(*dets) == (1.0, 1.0), (len(a), len(b), set_match(*dets))
        return
    assert len(a) == len(b)  # the same pixels through the same program: the same bits
    assert torch.equal(a.boxes.xyxy, b.boxes.xyxy)
    assert torch.equal(a.boxes.conf, b.boxes.conf)
    assert torch.equal(a.boxes.cls, b.boxes.cls)


def test_seeded_detections_survive_float_noise(model):
    """The test model's detections do not hinge on float rounding (so the suite is machine-independent):
    perturbing every weight by a relative 1e-6 (far more than reduction-order noise) changes nothing."""
    from tests.compat_utils import set_match

    ref = model(SAMPLE_IMAGE, imgsz=IMGSZ, conf=0.25)
    assert 50 <= len(ref) <= 300 and len(set(ref.boxes.cls.tolist())) >= 10
    for seed in range(2):
        noisy = seeded_model("t", seed=0)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for t in noisy.net.state_dict().values():
                if t.is_floating_point():
                    t.mul_(1 + 1e-6 * torch.randn(t.shape, generator=g))
        got = noisy(SAMPLE_IMAGE, imgsz=IMGSZ, conf=0.25)
        dets = [{"xyxy": r.boxes.xyxy, "conf": r.boxes.conf, "cls": r.boxes.cls} for r in (ref, got)]
        assert len(got) == len(ref) and set_match(*dets) == (1.0, 1.0)


def test_sample_image_ships_with_the_package():
    img = Image.open(SAMPLE_IMAGE)
    assert img.size == (640, 480)


def test_path_pil_numpy_and_tensor_inputs_agree(model, sample_rgb):
    by_path = model(SAMPLE_IMAGE, imgsz=IMGSZ, conf=0.3)
    assert isinstance(by_path, Results) and len(by_path) > 0
    _same(by_path, model(Image.open(SAMPLE_IMAGE), imgsz=IMGSZ, conf=0.3))
    _same(by_path, model(sample_rgb[:, :, ::-1].copy(), imgsz=IMGSZ, conf=0.3))  # BGR default
    _same(by_path, model(sample_rgb, imgsz=IMGSZ, conf=0.3, color_format="rgb"))
    as_uint8 = torch.from_numpy(sample_rgb).permute(2, 0, 1)
    _same(by_path, model(as_uint8, imgsz=IMGSZ, conf=0.3))
    # float tensors skip 8-bit rounding of the resize, so compare loosely
    as_float = model(as_uint8.float() / 255, imgsz=IMGSZ, conf=0.3)
    assert abs(len(as_float) - len(by_path)) <= max(3, len(by_path) // 10)


def test_lists_directories_and_batches_return_lists(model, sample_rgb, tmp_path):
    for i in range(3):
        Image.fromarray(sample_rgb).save(tmp_path / f"im{i}.png")
    out = model(str(tmp_path), imgsz=IMGSZ)
    assert isinstance(out, list) and len(out) == 3
    batched = model([sample_rgb] * 3, imgsz=IMGSZ, batch=2, color_format="rgb")
    assert len(batched) == 3
    _same(out[0], batched[2], exact=False)
    assert out[0].path.endswith("im0.png")


def test_results_attributes_and_serialisation(model, tmp_path):
    r = model(SAMPLE_IMAGE, imgsz=IMGSZ, conf=0.3)
    assert r.orig_shape == (480, 640)
    assert r.boxes.xyxy.shape == (len(r), 4) and r.boxes.data.shape == (len(r), 6)
    xywh = r.boxes.xywh
    assert torch.allclose(xywh[:, 2], r.boxes.xyxy[:, 2] - r.boxes.xyxy[:, 0])
    assert (r.boxes.xyxyn <= 1).all() and (r.boxes.xyxy[:, 2:] <= torch.tensor([640.0, 480.0])).all()
    assert set(r.speed) == {"preprocess", "inference", "postprocess"}
    rows = json.loads(r.to_json())
    assert len(rows) == len(r) and {"name", "class", "confidence", "box"} <= set(rows[0])
    assert rows[0]["name"] == r.names[rows[0]["class"]]
    plotted = np.asarray(r.plot())
    assert plotted.shape == (480, 640, 3)
    assert not np.array_equal(plotted, np.asarray(Image.open(SAMPLE_IMAGE).convert("RGB")))
    out = r.save(tmp_path / "annotated.jpg")
    assert Image.open(out).size == (640, 480)
    assert [p.name for p in tmp_path.iterdir()] == ["annotated.jpg"]  # no temp files left


def test_conf_classes_and_max_det_filter(model):
    r_all = model(SAMPLE_IMAGE, imgsz=IMGSZ, conf=0.01)
    r_hi = model(SAMPLE_IMAGE, imgsz=IMGSZ, conf=0.55)
    assert (r_hi.boxes.conf > 0.55).all() and len(r_hi) <= len(r_all)
    k = int(r_all.boxes.cls[0])
    only = model(SAMPLE_IMAGE, imgsz=IMGSZ, conf=0.01, classes=[k])
    assert len(only) > 0 and (only.boxes.cls == k).all()
    assert len(model(SAMPLE_IMAGE, imgsz=IMGSZ, conf=0.01, max_det=7)) == 7


@pytest.mark.parametrize("mode", ["L", "LA", "RGBA", "P", "I;16"])
def test_grayscale_alpha_palette_and_16bit_images_are_converted(model, sample_rgb, tmp_path, mode):
    img = Image.fromarray(sample_rgb)
    if mode == "I;16":
        img = Image.fromarray(np.asarray(img.convert("L")).astype(np.uint16) * 257)
    else:
        img = img.convert(mode)
    path = tmp_path / "x.png"
    img.save(path)
    r = model(str(path), imgsz=IMGSZ)
    assert r.orig_shape == (480, 640)


def test_16bit_and_grayscale_arrays_are_converted(model, sample_rgb):
    gray = np.asarray(Image.fromarray(sample_rgb).convert("L"))
    assert model(gray, imgsz=IMGSZ).orig_shape == gray.shape
    assert model(gray.astype(np.uint16) * 257, imgsz=IMGSZ).orig_shape == gray.shape
    rgba = np.dstack([sample_rgb, np.full(gray.shape, 255, np.uint8)])
    assert model(rgba, imgsz=IMGSZ).orig_shape == gray.shape


@pytest.mark.parametrize("kwargs, word", [
    ({"conf": 1.5}, "conf"), ({"conf": "high"}, "conf"), ({"iou": -0.1}, "iou"),
    ({"imgsz": 300}, "imgsz"), ({"imgsz": 0}, "imgsz"), ({"max_det": 0}, "max_det"),
    ({"classes": [80]}, "classes"), ({"cuda_graph": "yes"}, "cuda_graph"), ({"batch": 0}, "batch"),
])
def test_wrong_arguments_raise_clear_errors(model, kwargs, word):
    with pytest.raises((ArgumentError, ValueError), match=word):
        model(SAMPLE_IMAGE, **kwargs)


def test_bad_images_raise_clear_errors(model, tmp_path):
    with pytest.raises(ImageError, match="not found"):
        model(str(tmp_path / "missing.jpg"))
    corrupt = tmp_path / "corrupt.jpg"
    corrupt.write_bytes(b"\xff\xd8\xff\xe0 definitely not a jpeg")
    with pytest.raises(ImageError, match="corrupt"):
        model(str(corrupt))
    with pytest.raises(ImageError, match="zero size"):
        model(np.zeros((0, 10, 3), np.uint8))
    with pytest.raises(ImageError, match="unsupported input type"):
        model(12345)
    with pytest.raises(ImageError, match="no images"):
        model(str(_empty_dir(tmp_path)))


def _empty_dir(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    return d


def test_half_on_cpu_is_a_clear_error(model):
    with pytest.raises(ArgumentError, match="half"):
        model(SAMPLE_IMAGE, half=True, device="cpu")


def test_cuda_graph_true_is_never_a_silent_eager_run_on_cpu(model):
    with pytest.raises((RuntimeError, NotImplementedError, ArgumentError)):
        model(SAMPLE_IMAGE, imgsz=IMGSZ, cuda_graph=True)
