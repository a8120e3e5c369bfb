"""End-to-end ONNX artifacts (e2e=True): uint8 RGB pixels in, the family's preprocessing and NMS inside.

YOLOv9 (RGB / 255) is the bundled demo detector, YOLOX (BGR, 0..255) a seeded YOLOX-n; both at 160 px,
exported once per module. Mutations: a graph that swaps the colour order, and a declaration whose colour
order or scale disagrees with the family's preprocessing, are refused by the validation.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import onnx  # noqa: E402

from libreyolo import SHAPES_IMAGE, LibreYOLO  # noqa: E402
from libreyolo.errors import ArgumentError  # noqa: E402
from libreyolo.export.base import ExportOptions, get_exporter  # noqa: E402
from libreyolo.export.e2e import check_declaration, input_normalization  # noqa: E402
from tests.conftest import DEMO_IMGSZ  # noqa: E402
from tests.test_export_common import as_dets  # noqa: E402

IMGSZ = DEMO_IMGSZ


@pytest.fixture(scope="module")
def yolo9(demo, tmp_path_factory):
    path = tmp_path_factory.mktemp("e2e") / "y9.onnx"
    return demo, demo.export(format="onnx", imgsz=IMGSZ, e2e=True, output=path, verbose=False)


@pytest.fixture(scope="module")
def yolox(tmp_path_factory):
    from tests.test_export_yolox import seeded_yolox

    model = seeded_yolox(0, IMGSZ)
    path = tmp_path_factory.mktemp("e2e") / "yx.onnx"
    return model, model.export(format="onnx", imgsz=IMGSZ, e2e=True, output=path, verbose=False)


def _pixels(model, image=SHAPES_IMAGE):
    """What an edge user feeds: the image letterboxed to the input size as uint8 RGB NCHW (here through
    the family's own letterbox, turned back into pixels)."""
    from libreyolo.data.sources import load_sources
    from libreyolo.export.e2e import to_pixels

    batch, metas = model.family.letterbox(IMGSZ)([load_sources(image)[0].data])
    return to_pixels(batch, input_normalization(model.family, IMGSZ)).numpy(), metas


@pytest.mark.parametrize("case", ["yolo9", "yolox"])
def test_e2e_artifact_validates_takes_uint8_rgb_and_has_nms_inside(case, request):
    model, report = request.getfixturevalue(case)
    v = report.validation
    assert v.status == "passed", v.text()
    assert any(c["output"] == "e2e input" and c["passed"] for c in v.checks)
    graph = onnx.load(str(report.path)).graph
    assert graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.UINT8
    assert [d.dim_value for d in graph.input[0].type.tensor_type.shape.dim] == [1, 3, IMGSZ, IMGSZ]
    assert [o.name for o in graph.output] == ["detections", "num_detections"]
    meta = report.metadata
    assert meta["input_dtype"] == "uint8" and meta["e2e"]["input"]["color"] == "RGB"
    inside = meta["e2e"]["inside"]
    want = {"yolo9": ("RGB", 1 / 255), "yolox": ("BGR", 1.0)}[case]
    assert (inside["color"], inside["scale"]) == pytest.approx(want) and inside["nms"] is True


@pytest.fixture(scope="module")
def square(tmp_path_factory):
    """A square crop of the shapes image: no letterbox padding, where embedded NMS (boxes clipped to the
    input square) and eager NMS (boxes clipped to the image) differ by design (docs/export.md)."""
    from PIL import Image

    image = Image.open(SHAPES_IMAGE).convert("RGB")
    side = min(image.size)
    path = tmp_path_factory.mktemp("e2e-img") / "square.png"
    image.crop((0, 0, side, side)).save(path)
    return path


@pytest.mark.parametrize("case", ["yolo9", "yolox"])
def test_e2e_artifact_predicts_like_eager_and_plain_onnxruntime_needs_no_preprocessing(case, request, square):
    import onnxruntime as ort

    from libreyolo.export.matching import match_detections

    model, report = request.getfixturevalue(case)
    conf = 0.25 if case == "yolo9" else 0.2
    want = model.predict(square, imgsz=IMGSZ, conf=conf)
    got = LibreYOLO(report.path).predict(square, conf=conf)
    assert len(want.boxes) > 0
    m = match_detections(as_dets(want), as_dets(got), conf=conf, max_det=300, iou_min=0.99, score_tol=1e-4)
    assert m["passed"] and m["matched"] == m["eager"] == m["artifact"], m
    # a user with ONNX Runtime alone: uint8 RGB pixels in, NMS-ed boxes in input pixels out
    pixels, metas = _pixels(model, square)
    det, num = ort.InferenceSession(str(report.path)).run(None, {"images": pixels})
    rows = det[0, :int(num[0])]
    rows = rows[rows[:, 4] > conf]
    boxes = metas[0].to_original(torch.from_numpy(rows[:, :4].copy()))
    assert len(rows) == len(want.boxes)
    order = np.argsort(-rows[:, 4])
    assert torch.allclose(boxes[order], want.boxes.xyxy[torch.argsort(-want.boxes.conf)], atol=1e-2)


def test_a_graph_with_the_wrong_colour_order_fails_validation(yolox, tmp_path):
    """Mutation: the same e2e graph with the colour flip removed (YOLOX then sees RGB where it was
    trained on BGR, the mistake e2e exists to prevent) is refused by the validator."""
    from libreyolo.export.validate import validate_artifact
    from libreyolo.runtimes.onnx import load

    model, report = yolox
    mutated = onnx.load(str(report.path))
    cast = next(n for n in mutated.graph.node if n.input and n.input[0] == "images")
    flips = [n for n in mutated.graph.node if n.op_type == "Slice" and n.input[0] == cast.output[0]]
    assert len(flips) == 1, "the BGR flip of the input is one Slice of the pixels as floats"
    flip = flips[0]
    for node in mutated.graph.node:  # consumers of the flipped pixels read the pixels as they came
        for i, name in enumerate(node.input):
            if name == flip.output[0]:
                node.input[i] = cast.output[0]
    mutated.graph.node.remove(flip)
    path = tmp_path / "swapped.onnx"
    onnx.save(mutated, str(path))
    opts = ExportOptions("onnx", IMGSZ, nms=report.metadata["nms"], e2e=input_normalization(model.family, IMGSZ))
    bad = validate_artifact(model, get_exporter("onnx"), path, opts, runtime=load(path, verify=False))
    assert bad.status == "failed", bad.text()


def test_a_declaration_that_disagrees_with_the_preprocessing_is_refused(demo):
    from libreyolo.models.registry import get_family

    for name in ("yolo9", "yolox", "rtmdet", "vit", "rtdetr"):
        family = get_family(name)
        imgsz = family.fixed_imgsz or IMGSZ
        norm = input_normalization(family, imgsz)
        assert check_declaration(family, imgsz, norm)["passed"], name
        swapped = {**norm, "color": "BGR" if norm["color"] == "RGB" else "RGB"}
        assert not check_declaration(family, imgsz, swapped)["passed"], name
        assert not check_declaration(family, imgsz, {**norm, "scale": norm["scale"] * 255 if norm["scale"] < 1
                                                     else 1 / 255})["passed"], name


def test_e2e_options_are_checked_before_anything_is_built(demo):
    with pytest.raises(ArgumentError, match="e2e=True .* not supported for format=coreml"):
        demo.export(format="coreml", e2e=True, verbose=False)
    with pytest.raises(ArgumentError, match="cannot be combined"):
        demo.export(format="onnx", e2e=True, half=True, verbose=False)
    with pytest.raises(ArgumentError, match="e2e"):
        demo.export(format="onnx", e2e="maybe", verbose=False)
