"""With weights that have no near-tied scores, artifacts reproduce eager detections exactly (as sets).

The seeded test model has separated class scores (conftest.spread_scores), so at conf 0.25
every decoded detection must match directly, not merely be explained by a tie swap. (The untrained
architecture is not such a model: its scores sit on the class-bias prior and thousands of
candidates are tied to 1e-6, so which of them survive depends on float rounding; the validator's
tie-aware matcher is what handles that case.)

ExecuTorch is held to the same bar in ``tests/test_export_executorch.py`` (its shared artifact of a
seeded YOLOv9-t must match eager's 300 detections at conf 0.25 box for box, no tie swaps), so a
second lowering here (about a minute on 2 cores) is not repeated.
"""
from __future__ import annotations

import pytest

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.export.validate import match_detections

from .conftest import seeded_model
from .test_export_common import as_dets

IMGSZ = 256


@pytest.fixture(scope="module")
def untrained():
    return seeded_model("t", seed=3)


def _assert_identical(model, report):
    v = report.validation
    assert v.status == "passed", v.text()
    assert v.worst()["worst_ratio"] <= 1.0
    assert v.detections and all(d["passed"] and d["eager"] > 0 for d in v.detections), v.text()
    # The validator's own probes run at a low conf (about 240 boxes per image), where candidates
    # of one class still sit within 1e-6 of each other: which of two such boxes survives NMS then
    # depends on the CPU's reduction order (a one-thread run swaps 2 of 243 on the sample image),
    # so those are judged by the validator's tie-aware matcher (asserted above). At conf 0.25 the
    # scores are separated: there the artifact's predict() must reproduce eager box for box.
    eager = model.predict(SAMPLE_IMAGE, imgsz=IMGSZ, conf=0.25, max_det=100)
    got = LibreYOLO(report.path).predict(SAMPLE_IMAGE, conf=0.25, max_det=100)
    m = match_detections(as_dets(eager), as_dets(got), conf=0.25, max_det=100, iou_min=0.99, score_tol=1e-4)
    assert m["identical"] and m["eager"] >= 50, m


@pytest.mark.parametrize("dynamic", [False, True])
def test_onnx_detections_identical_to_eager(untrained, tmp_path, dynamic):
    report = untrained.export(format="onnx", imgsz=IMGSZ, dynamic=dynamic, output=tmp_path / "m.onnx", verbose=False)
    _assert_identical(untrained, report)
