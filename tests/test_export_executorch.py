"""ExecuTorch export (XNNPACK .pte): validated against eager, portable ops, sidecar metadata."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("executorch.exir", reason="executorch is not installed (pip install 'libreyolo[executorch]')")

from libreyolo import SHAPES_IMAGE, LibreYOLO  # noqa: E402
from libreyolo.errors import ArgumentError, CheckpointError  # noqa: E402
from libreyolo.export.base import get_exporter  # noqa: E402
from libreyolo.export.metadata import sidecar_path  # noqa: E402
from tests.conftest import DEMO_IMGSZ  # noqa: E402
from tests.test_export_common import assert_same_detections, model  # noqa: E402


@pytest.fixture(scope="module")
def pte(demo_pte):
    # the demo detector's program, lowered once per session and shared with test_val_artifacts (conftest)
    return demo_pte


def test_executorch_program_validates_against_eager_within_fp32_tolerance(pte):
    v = pte.validation
    assert v.status == "passed", v.text()
    assert v.runtime.startswith("executorch")
    assert v.worst()["worst_ratio"] <= 1.0 and v.worst()["min_cosine"] >= 0.99999
    assert all(d["passed"] for d in v.detections)


def test_executorch_artifact_predicts_the_same_results_as_eager(pte, demo):
    eager = demo.predict(SHAPES_IMAGE, conf=0.25, imgsz=DEMO_IMGSZ)
    assert len(eager.boxes) >= 3  # the demo finds the held-out image's shapes: the comparison has boxes to compare
    runtime = LibreYOLO(pte.path)
    assert runtime.device.type == "cpu" and runtime.imgsz == DEMO_IMGSZ
    assert_same_detections(eager, runtime.predict(SHAPES_IMAGE, conf=0.25))


def test_executorch_program_runs_only_portable_ops_and_xnnpack_delegates(pte):
    ops = get_exporter("executorch").graph_ops(pte.path)
    delegates = {op for op in ops if op.startswith("delegate::")}
    assert delegates == {"delegate::XnnpackBackend"}
    others = ops - delegates
    assert all(op.startswith("aten::") for op in others), others
    assert not [op for op in others if "attention" in op or "flash" in op]


def test_sidecar_metadata_is_bound_to_the_program(pte, tmp_path):
    side = json.loads(sidecar_path(pte.path).read_text())
    assert side["metadata"]["family"] == "yolo9" and side["metadata"]["validation"]["status"] == "passed"
    copy = tmp_path / "m.pte"
    copy.write_bytes(pte.path.read_bytes() + b"\0")
    sidecar_path(copy).write_text(sidecar_path(pte.path).read_text())
    with pytest.raises(CheckpointError, match="sha256 differs"):
        LibreYOLO(copy)
    sidecar_path(copy).unlink()
    with pytest.raises(CheckpointError, match="m.pte.json is missing"):
        LibreYOLO(copy)


@pytest.mark.parametrize("opts, message", [
    ({"dynamic": True}, "dynamic=True is not possible for format=executorch"),
    ({"half": True}, "half=True is not supported for format=executorch"),
    ({"opset": 17}, "opset/simplify apply to ONNX-based formats"),
    ({"nms": True}, "nms=True .* not supported for format=executorch"),
])
def test_impossible_executorch_options_are_refused(tmp_path, opts, message):
    with pytest.raises(ArgumentError, match=message):
        model().export(format="executorch", output=tmp_path / "x.pte", **opts)
    assert not list(tmp_path.iterdir())
