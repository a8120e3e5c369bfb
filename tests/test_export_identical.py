"""With weights that have no near-tied scores, artifacts reproduce eager detections exactly (as sets).

The untrained architecture (detector bias prior) is such a model: the validator compares its
detections at a lowered threshold, and every decoded detection must match, not merely be explained
by a tie swap. The seeded-weight tests elsewhere cover the near-tie case.
"""
from __future__ import annotations

import importlib.util

import pytest

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.export.validate import match_detections

from .test_export_common import as_dets

IMGSZ = 256


@pytest.fixture(scope="module")
def untrained():
    return LibreYOLO("LibreYOLO9t.yaml")


def _assert_identical(report):
    v = report.validation
    assert v.status == "passed", v.text()
    assert v.worst()["max_abs_error"] <= 1e-4
    assert v.detections and all(d["identical"] and d["eager"] > 0 for d in v.detections), v.text()


@pytest.mark.parametrize("dynamic", [False, True])
def test_onnx_detections_identical_to_eager(untrained, tmp_path, dynamic):
    report = untrained.export(format="onnx", imgsz=IMGSZ, dynamic=dynamic, output=tmp_path / "m.onnx", verbose=False)
    _assert_identical(report)
    # through the runtime's predict(): every box of the best 100 matches, none by a tie swap
    eager = untrained.predict(SAMPLE_IMAGE, imgsz=IMGSZ, conf=0.0, max_det=100)
    got = LibreYOLO(report.path).predict(SAMPLE_IMAGE, conf=0.0, max_det=100)
    m = match_detections(as_dets(eager), as_dets(got), conf=0.0, max_det=100, iou_min=0.99, score_tol=1e-4)
    assert m["identical"] and m["eager"] == 100, m


@pytest.mark.skipif(importlib.util.find_spec("executorch") is None,
                    reason="executorch not installed (pip install 'libreyolo[executorch]')")
def test_executorch_detections_identical_to_eager(untrained, tmp_path):
    _assert_identical(untrained.export(format="executorch", imgsz=IMGSZ, output=tmp_path / "m.pte", verbose=False))
