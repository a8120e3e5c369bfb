"""DEIM and RT-DETRv4 export: deim-n and rtdetrv4-s at 128 px to ONNX and ExecuTorch.

Seeded untrained weights with BatchNorm statistics of real activations (tests/mutations.py), so the
output depends on every layer. Each artifact is validated against eager by the export driver (raw
outputs per query row against float64, decoded detections, the sample through ``predict()``) and
must carry portable ops only; ``LibreYOLO(artifact)`` predicts the eager detections. A wrong
artifact (one convolution of the ONNX file scaled by 1.01, its metadata re-stamped so that it loads)
is refused by ``compare``. 128 px keeps CI cheap: deim-n then has 80 encoder candidates (all of them
queries), rtdetrv4-s 336 (a top-300 selection with an edge).
"""
from __future__ import annotations

import shutil

import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from libreyolo.export.compare import compare  # noqa: E402
from tests import mutations  # noqa: E402
from tests.test_export_common import FUSED_OR_CUSTOM  # noqa: E402

FAMILIES = ("deim", "rtdetrv4")
_SUFFIX = {"onnx": "onnx", "executorch": "pte"}
_CACHE: dict = {}


def _model(family: str):
    if family not in _CACHE:
        _CACHE[family] = mutations.seeded(family, seed=11, high_gain=False)
    return _CACHE[family]


def _export(family: str, fmt: str, tmp_path_factory):
    key = (family, fmt)
    if key not in _CACHE:
        model = _model(family)
        out = tmp_path_factory.mktemp(f"{family}-{fmt}") / f"model.{_SUFFIX[fmt]}"
        _CACHE[key] = model.export(format=fmt, imgsz=model.imgsz, output=str(out), verbose=False)
    return _CACHE[key]


def _same_detections(model, artifact_path) -> None:
    """The artifact through ``LibreYOLO`` predicts the eager model's detections (class, IoU, score)."""
    from libreyolo import LibreYOLO
    from libreyolo.ops.boxes import box_iou

    runtime = LibreYOLO(str(artifact_path))
    assert runtime.family.name == model.family.name
    g = torch.Generator().manual_seed(3)
    image = torch.randint(0, 256, (model.imgsz * 3 // 4, model.imgsz, 3), generator=g, dtype=torch.uint8).numpy()
    a = model(image, conf=0.05)
    b = runtime(image, conf=0.05)
    assert len(a) > 0 and len(a) == len(b), (len(a), len(b))
    iou = box_iou(a.boxes.xyxy.float(), b.boxes.xyxy.float())
    same = (iou >= 0.99) & (a.boxes.cls[:, None] == b.boxes.cls[None]) & (
        (a.boxes.conf[:, None] - b.boxes.conf[None]).abs() <= 1e-4)
    assert bool(same.any(1).all()) and bool(same.any(0).all())


@pytest.mark.parametrize("family", FAMILIES)
def test_onnx_validates_predicts_like_eager_and_carries_portable_ops(family, tmp_path_factory):
    from libreyolo.export.onnx import onnx_ops

    report = _export(family, "onnx", tmp_path_factory)
    v = report.validation
    assert v.status == "passed", v.text()
    assert {c["probe"] for c in v.checks} >= {"sample", "uniform", "clipped-normal", "ramps"}
    assert all(d["passed"] for d in v.detections)
    assert all(d["eager"] > 0 for d in v.detections if d["probe"].startswith("sample")), v.text()
    ops = onnx_ops(report.path)
    bad = sorted(op for op in ops if any(word.lower() in op.lower() for word in FUSED_OR_CUSTOM))
    assert not bad, f"fused or custom ops in the exported graph: {bad}"
    assert {"GridSample", "MatMul", "Softmax", "TopK"} <= ops, sorted(ops)
    _same_detections(_model(family), report.path)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_mutated_onnx_artifact_is_refused(family, tmp_path_factory):
    """One convolution weight of the validated artifact scaled by 1.01 in the file (hashes re-stamped,
    so the runtime loads it): compare() refuses it."""
    import onnx
    from onnx import numpy_helper

    from libreyolo.export.base import get_exporter
    from libreyolo.export.metadata import decode, stamp

    good = _export(family, "onnx", tmp_path_factory)
    bad = tmp_path_factory.mktemp(f"{family}-bad") / "bad.onnx"
    shutil.copy(good.path, bad)
    proto = onnx.load(str(bad))
    conv_weights = [n.input[1] for n in proto.graph.node if n.op_type == "Conv"]
    target = conv_weights[len(conv_weights) // 2]
    for i, init in enumerate(proto.graph.initializer):
        if init.name == target:
            proto.graph.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.01, init.name))
            break
    else:
        raise AssertionError(f"no initializer {target}")
    onnx.save(proto, str(bad))
    meta = decode({p.key: p.value for p in onnx.load(str(bad)).metadata_props}, str(bad))
    exporter = get_exporter("onnx")
    exporter.write_metadata(bad, stamp(meta, exporter.content_sha256(bad)), meta)
    report = compare(_model(family), str(bad))
    assert report.status == "failed", report.text()
    assert mutations.worst_ratio(report) > 1.0 or any(not d["passed"] for d in report.detections)


@pytest.mark.parametrize("family", FAMILIES)
def test_executorch_validates_predicts_like_eager_and_carries_portable_ops(family, tmp_path_factory):
    pytest.importorskip("executorch")
    from libreyolo.export.executorch import pte_ops

    report = _export(family, "executorch", tmp_path_factory)
    v = report.validation
    assert v.status == "passed", v.text()
    assert all(d["passed"] for d in v.detections)
    assert all(d["eager"] > 0 for d in v.detections if d["probe"].startswith("sample")), v.text()
    ops = pte_ops(report.path)
    bad = sorted(op for op in ops if any(word.lower() in op.lower() for word in FUSED_OR_CUSTOM))
    assert not bad, f"fused or custom ops in the exported program: {bad}"
    assert any("grid_sampler" in op for op in ops), sorted(ops)
    _same_detections(_model(family), report.path)
