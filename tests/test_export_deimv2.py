"""DEIMv2 export: the deimv2-s fixture's weights (the reference's seed-0 model) at 160 px.

One export per format, shared by the module. The driver validates each artifact against eager
(raw outputs per query row against a float64 copy, decoded detections, the sample through
predict()); the artifact must carry portable ops only (the ViT's RoPE attention and the decoder's
self-attention as MatMul/Softmax, deformable sampling as GridSample, the ImageNet normalisation
of the ViT sizes inside the graph), predict the eager model's detections through
``LibreYOLO(artifact)``, and be refused when compared with a model one convolution away.
160 px keeps CI cheap and still leaves 525 encoder positions for the 300 queries.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from libreyolo.export.compare import compare  # noqa: E402
from tests import mutations  # noqa: E402
from tests.compat_utils import model_from_fixture, set_match  # noqa: E402
from tests.test_export_common import FUSED_OR_CUSTOM  # noqa: E402

IMGSZ = 160
_SUFFIX = {"onnx": "onnx", "executorch": "pte"}


@pytest.fixture(scope="module")
def model(compat_dir, compat_fill):
    d = compat_dir / "fixtures" / "deimv2-s"
    if not (d / "schema.json").is_file():
        pytest.skip(f"fixture deimv2-s is not in {compat_dir}")
    return model_from_fixture(d, compat_fill)


_ARTIFACTS: dict = {}


def _export(model, fmt, tmp_path_factory):
    if fmt not in _ARTIFACTS:
        out = tmp_path_factory.mktemp(f"deimv2-{fmt}") / f"LibreDEIMv2s.{_SUFFIX[fmt]}"
        _ARTIFACTS[fmt] = model.export(format=fmt, imgsz=IMGSZ, output=str(out), verbose=False)
    return _ARTIFACTS[fmt]


def _check_report_and_predict(model, report, sample):
    from libreyolo import LibreYOLO

    v = report.validation
    assert v.status == "passed", v.text()
    assert all(d["passed"] for d in v.detections)
    assert all(d["eager"] > 0 for d in v.detections if d["probe"].startswith("sample")), v.text()
    ours = model(sample, imgsz=IMGSZ, conf=0.05)
    theirs = LibreYOLO(report.path)(sample, conf=0.05)
    assert len(ours) > 0
    a = {"xyxy": ours.boxes.xyxy, "conf": ours.boxes.conf, "cls": ours.boxes.cls}
    b = {"xyxy": theirs.boxes.xyxy, "conf": theirs.boxes.conf, "cls": theirs.boxes.cls}
    assert min(set_match(a, b)) >= 0.99, set_match(a, b)


@pytest.mark.slow
def test_deimv2_onnx_validates_predicts_like_eager_and_carries_portable_ops(model, compat_dir, tmp_path_factory):
    from libreyolo.export.onnx import onnx_ops

    report = _export(model, "onnx", tmp_path_factory)
    _check_report_and_predict(model, report, str(compat_dir / "fixtures" / "sample.png"))
    ops = onnx_ops(report.path)
    bad = sorted(op for op in ops if any(word.lower() in op.lower() for word in FUSED_OR_CUSTOM))
    assert not bad, f"fused or custom ops in the exported graph: {bad}"
    assert {"GridSample", "MatMul", "Softmax", "TopK", "Resize"} <= ops, sorted(ops)


@pytest.mark.slow
def test_deimv2_onnx_artifact_is_refused_against_a_model_one_conv_away(model, tmp_path_factory):
    report = _export(model, "onnx", tmp_path_factory)
    wrong = mutations.scale_one_conv(model)
    with torch.no_grad():  # the mutation must reach the outputs, or this test could not fail
        x = torch.rand(1, 3, IMGSZ, IMGSZ)
        assert not torch.equal(model.net(x)["pred_logits"], wrong.net(x)["pred_logits"])
    assert compare(wrong, report.path).status == "failed"


@pytest.mark.slow
def test_deimv2_executorch_validates_and_predicts_like_eager(model, compat_dir, tmp_path_factory):
    pytest.importorskip("executorch")
    from libreyolo.export.executorch import pte_ops

    report = _export(model, "executorch", tmp_path_factory)
    _check_report_and_predict(model, report, str(compat_dir / "fixtures" / "sample.png"))
    ops = pte_ops(report.path)
    bad = sorted(op for op in ops if any(word.lower() in op.lower() for word in FUSED_OR_CUSTOM))
    assert not bad, f"fused or custom ops in the exported program: {bad}"
    assert any("grid_sampler" in op for op in ops), sorted(ops)
