"""RT-DETRv2-r18 (the compat fixture's weights) exported to ONNX and ExecuTorch at 320x320 (small, to keep
CI cheap; the stored 640 anchors are then rebuilt for the export's shapes, as eager does): validated
against eager by the export driver (raw outputs per query row with the selection-edge rule, decoded
detections, the sample through predict()), predicting the same detections through
``LibreYOLO(artifact)``; the graphs carry portable deformable sampling only; a wrong artifact is refused."""
from __future__ import annotations

from typing import Any

import pytest
import torch

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from tests.compat_utils import model_from_fixture
from tests.test_export_common import FUSED_OR_CUSTOM

IMGSZ = 320
_CACHE: dict[str, Any] = {}


@pytest.fixture(scope="module")
def model(compat_dir, compat_fill):
    d = compat_dir / "fixtures" / "rtdetrv2-r18"
    if not (d / "schema.json").is_file():
        pytest.skip(f"fixture rtdetrv2-r18 is not in {compat_dir}")
    return model_from_fixture(d, compat_fill)


def _exported(model, tmp_path_factory, fmt: str, suffix: str) -> Any:
    if fmt not in _CACHE:
        folder = tmp_path_factory.mktemp(f"rtdetrv2-{fmt}")
        _CACHE[fmt] = model.export(format=fmt, imgsz=IMGSZ, output=folder / f"r18{suffix}", verbose=False)
    return _CACHE[fmt]


@pytest.fixture(scope="module")
def onnx_report(model, tmp_path_factory):
    pytest.importorskip("onnxruntime")
    return _exported(model, tmp_path_factory, "onnx", ".onnx")


@pytest.fixture(scope="module")
def pte_report(model, tmp_path_factory):
    pytest.importorskip("executorch.exir", reason="executorch is not installed (pip install 'libreyolo[executorch]')")
    return _exported(model, tmp_path_factory, "executorch", ".pte")


def _same_predictions(model, artifact_path) -> None:
    """predict() through the artifact keeps the same (class, box) detections as eager, scores within 1e-4."""
    from tests.compat_utils import set_match

    eager = model.predict(SAMPLE_IMAGE, conf=0.05, imgsz=IMGSZ)
    art = LibreYOLO(artifact_path).predict(SAMPLE_IMAGE, conf=0.05)
    as_dict = [{"xyxy": r.boxes.xyxy, "conf": r.boxes.conf, "cls": r.boxes.cls} for r in (eager, art)]
    assert len(eager) > 0
    a, b = set_match(*as_dict)
    assert min(a, b) >= 0.99, (len(eager), len(art), a, b)


def test_onnx_artifact_validates_predicts_the_same_and_is_portable(model, onnx_report):
    from libreyolo.export.onnx import onnx_ops

    v = onnx_report.validation
    assert v.status == "passed", v.text()
    assert all(d["passed"] for d in v.detections)
    assert all(d["eager"] > 0 for d in v.detections if d["probe"].startswith("sample")), v.text()
    ops = onnx_ops(onnx_report.path)
    assert not [op for op in ops if any(w.lower() in op.lower() for w in FUSED_OR_CUSTOM)], sorted(ops)
    assert {"GridSample", "MatMul", "Softmax", "TopK"} <= ops, sorted(ops)
    _same_predictions(model, onnx_report.path)


def test_executorch_artifact_validates_predicts_the_same_and_is_portable(model, pte_report):
    from libreyolo.export.executorch import pte_ops

    v = pte_report.validation
    assert v.status == "passed", v.text()
    assert all(d["passed"] for d in v.detections)
    ops = pte_ops(pte_report.path)
    assert not [op for op in ops if any(w.lower() in op.lower() for w in FUSED_OR_CUSTOM)], sorted(ops)
    assert any("grid_sampler" in op for op in ops), sorted(ops)
    _same_predictions(model, pte_report.path)


def test_a_wrong_artifact_is_refused(model, onnx_report):
    """The same validator on the artifact with one decoder class bias moved in the eager model: it must fail."""
    from libreyolo.export.base import ExportOptions, get_exporter
    from libreyolo.export.validate import validate_artifact

    wrong = LibreYOLO("LibreRTDETRv2r18.yaml")
    wrong.net.load_state_dict(model.net.state_dict())
    with torch.no_grad():
        wrong.net.decoder.dec_score_head[-1].bias[3] += 0.05
    report = validate_artifact(wrong, get_exporter("onnx"), onnx_report.path, ExportOptions("onnx", IMGSZ))
    assert report.status == "failed", report.text()
