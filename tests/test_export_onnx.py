"""ONNX export: validated against eager, static/dynamic, with and without embedded NMS."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import numpy as np  # noqa: E402
import onnx  # noqa: E402

from libreyolo import SAMPLE_IMAGE, LibreYOLO  # noqa: E402
from libreyolo.errors import ArgumentError, LibreYOLOError, MissingDependencyError  # noqa: E402
from libreyolo.export import ExportError, export  # noqa: E402
from libreyolo.export.base import get_exporter  # noqa: E402
from tests.test_export_common import (  # noqa: E402
    FUSED_OR_CUSTOM,
    IMGSZ,
    STANDARD_ONNX_OPS,
    assert_same_detections,
    exported,
    model,
)


@pytest.fixture(scope="module")
def static(tmp_path_factory):
    return exported(tmp_path_factory, "onnx")


@pytest.fixture(scope="module")
def dynamic(tmp_path_factory):
    return exported(tmp_path_factory, "onnx", dynamic=True)


@pytest.fixture(scope="module")
def with_nms(tmp_path_factory):
    return exported(tmp_path_factory, "onnx", nms=True, dynamic=True, batch=2)


def _inputs(path):
    graph = onnx.load(str(path)).graph
    return [[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input]


def test_static_onnx_validates_against_eager_within_fp32_tolerance(static):
    v = static.validation
    assert v.status == "passed", v.text()
    assert v.worst()["worst_ratio"] <= 1.0  # each output group within its float64-derived allowance
    assert v.worst()["min_cosine"] >= 0.99999
    # element by element on every probe, and each group's error distribution over all of them
    assert {c["probe"] for c in v.checks} == {"sample", "uniform", "clipped-normal", "ramps", "all probes"}
    assert {c["group"] for c in v.checks if c["probe"] == "all probes"} == {"predictions/box", "predictions/score"}
    assert v.worst()["artifact_float64_error"] > 0 and v.worst()["eager_float64_error"] > 0
    assert all(d["passed"] for d in v.detections)
    assert _inputs(static.path) == [[1, 3, IMGSZ, IMGSZ]]


def test_onnx_artifact_predicts_the_same_results_as_eager(static):
    eager = model().predict(SAMPLE_IMAGE, conf=0.25, imgsz=IMGSZ)
    runtime = LibreYOLO(static.path)
    art = runtime.predict(SAMPLE_IMAGE, conf=0.25)
    assert type(art) is type(eager) and art.names == eager.names and art.orig_shape == eager.orig_shape
    assert len(eager) > 0
    assert_same_detections(eager, art)


def test_dynamic_onnx_has_symbolic_batch_and_size_and_runs_a_batch(dynamic):
    assert dynamic.validation.status == "passed", dynamic.validation.text()
    assert _inputs(dynamic.path) == [["batch", 3, "height", "width"]]
    probes = {c["probe"] for c in dynamic.validation.checks}
    assert "sample+uniform (batch 2)" in probes and f"{IMGSZ - 64}x{IMGSZ}" in probes
    results = LibreYOLO(dynamic.path).predict([str(SAMPLE_IMAGE)] * 3, conf=0.25)
    assert len(results) == 3 and len({len(r) for r in results}) == 1


def test_embedded_nms_outputs_detections_and_matches_eager_below_the_candidate_cap(with_nms):
    assert with_nms.validation.status == "passed", with_nms.validation.text()
    graph = onnx.load(str(with_nms.path)).graph
    assert [o.name for o in graph.output] == ["detections", "num_detections"]
    assert "NonMaxSuppression" not in {n.op_type for n in graph.node}
    # a conf at which fewer than topk (box, class) pairs remain, on a square image (no letterbox
    # padding: the graph clips boxes to the input square, eager to the image; see export/nms.py):
    # there the artifact equals eager
    from PIL import Image

    square = np.asarray(Image.open(SAMPLE_IMAGE).convert("RGB"))[:, :480].copy()  # 480 x 480
    m = model()
    batch, _ = m.family.letterbox(IMGSZ)([torch.from_numpy(square).permute(2, 0, 1)])
    with torch.no_grad():
        scores = m.net(batch)["predictions"][0, 4:].flatten()
    conf = float(scores.topk(800).values[-1])
    eager = m.predict(square, conf=conf, imgsz=IMGSZ, color_format="rgb")
    art = LibreYOLO(with_nms.path).predict(square, conf=conf, color_format="rgb")
    assert len(eager) > 0
    assert_same_detections(eager, art, conf=conf)


def test_embedded_nms_artifact_refuses_a_different_iou(with_nms):
    with pytest.raises(ArgumentError, match="iou=0.45"):
        LibreYOLO(with_nms.path).predict(SAMPLE_IMAGE, iou=0.6)


def test_metadata_travels_with_the_onnx_file(static):
    props = {p.key: p.value for p in onnx.load(str(static.path)).metadata_props}
    for key in ("family", "size", "task", "names", "imgsz", "stride", "letterbox", "normalization", "precision",
                "dynamic_axes", "export_args", "versions", "source_weights_sha256", "validation"):
        assert key in props, key
    assert props["family"] == "yolo9" and props["size"] == "t" and props["precision"] == "fp32"
    assert '"status": "passed"' in props["validation"]
    assert props["source_weights_sha256"].startswith("state_dict:")
    assert LibreYOLO(static.path).validation["status"] == "passed"


def test_onnx_graphs_hold_only_standard_ops(static, with_nms):
    for artifact in (static, with_nms):
        ops = get_exporter("onnx").graph_ops(artifact.path)
        assert ops <= STANDARD_ONNX_OPS, ops - STANDARD_ONNX_OPS
        assert not [op for op in ops if any(bad.lower() in op.lower() for bad in FUSED_OR_CUSTOM)]


def test_unknown_format_is_a_clear_error():
    with pytest.raises(ArgumentError, match="unknown export format 'caffe2'"):
        model().export(format="caffe2")


def test_half_on_cpu_is_refused(tmp_path):
    with pytest.raises(ArgumentError, match="half=True .* needs a CUDA device"):
        model().export(format="onnx", half=True, device="cpu", output=tmp_path / "x.onnx")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("opts, message", [
    ({"opset": 9}, "opset must be an integer from 13 to 20"),
    ({"workspace": 2}, "workspace applies only to format=tensorrt"),
    ({"imgsz": 300}, "multiple of the model stride"),
    ({"batch": 0}, "batch must be an integer from 1 to 1024"),
    ({"nms": {"topk": 10, "bogus": 1}}, "unknown nms option"),
])
def test_bad_options_are_refused_before_anything_is_built(tmp_path, opts, message):
    with pytest.raises(ArgumentError, match=message):
        model().export(format="onnx", output=tmp_path / "x.onnx", **opts)
    assert not list(tmp_path.iterdir())


def test_output_suffix_and_unwritable_folder_are_refused(tmp_path, monkeypatch):
    with pytest.raises(ArgumentError, match=r"must end in \.onnx"):
        model().export(format="onnx", output=tmp_path / "x.pte")
    with pytest.raises(ArgumentError, match="does not exist"):
        model().export(format="onnx", output=tmp_path / "missing" / "x.onnx")
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    # root can write anywhere, so the permission check is simulated for this folder only
    monkeypatch.setattr("libreyolo.export.driver.os.access",
                        lambda p, mode: False if Path(p) == locked else real_access(p, mode))
    with pytest.raises(ArgumentError, match="not writable"):
        model().export(format="onnx", output=locked / "x.onnx")
    assert not list(locked.iterdir())


def test_a_toolchain_failure_midway_leaves_nothing(tmp_path, monkeypatch):
    from libreyolo.export import onnx as onnx_exporter

    def half_written(module, example, path, opts):
        path.write_bytes(b"partial")
        raise RuntimeError("disk full")

    monkeypatch.setattr(onnx_exporter, "export_onnx", half_written)
    with pytest.raises(RuntimeError, match="disk full"):
        model().export(format="onnx", output=tmp_path / "x.onnx", imgsz=64)
    assert not list(tmp_path.iterdir())


def test_simplify_without_onnxslim_names_the_extra(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "onnxslim", None)
    with pytest.raises(MissingDependencyError, match=r"libreyolo\[onnx-simplify\]"):
        model().export(format="onnx", simplify=True, output=tmp_path / "x.onnx", imgsz=64)
    assert not list(tmp_path.iterdir())


def test_a_failed_validation_fails_the_export_and_leaves_nothing(tmp_path, monkeypatch):
    from libreyolo.runtimes import onnx as ort_runtime

    real = ort_runtime.OnnxPredictor._run
    monkeypatch.setattr(ort_runtime.OnnxPredictor, "_run", lambda self, b: [o + 1e-2 for o in real(self, b)])
    with pytest.raises(ExportError, match="does not match the eager model") as err:
        model().export(format="onnx", output=tmp_path / "bad.onnx", imgsz=64, verbose=False)
    assert isinstance(err.value, LibreYOLOError)
    assert "BAD" in str(err.value)
    assert not list(tmp_path.iterdir())  # no artifact, no temp folder


def test_validate_false_warns_loudly_and_records_it(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="libreyolo"):
        report = model().export(format="onnx", output=tmp_path / "raw.onnx", imgsz=64, validate=False, verbose=False)
    assert any(r.levelname == "WARNING" and "validate=False" in r.getMessage() and "NOT compared" in r.getMessage()
               for r in caplog.records)
    assert report.validation.status == "skipped"
    assert LibreYOLO(report.path).validation["status"] == "skipped"


def test_default_output_is_next_to_the_checkpoint_or_in_the_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = model().export(format="onnx", imgsz=64, validate=False, verbose=False)
    assert Path(report.path) == Path("yolo9t.onnx") and Path("yolo9t.onnx").is_file()
    ckpt = tmp_path / "sub" / "LibreYOLO9t.pt"
    ckpt.parent.mkdir()
    model().save(ckpt)
    loaded = LibreYOLO(ckpt)
    report = export(loaded, "onnx", imgsz=64, validate=False, verbose=False)
    assert Path(report.path) == ckpt.with_suffix(".onnx")
    meta = LibreYOLO(report.path).metadata
    from libreyolo.export.metadata import sha256_file

    assert meta["source_weights_sha256"] == sha256_file(ckpt)


def test_run_export_prints_the_artifact_its_validation_and_the_next_command(tmp_path, capsys):
    from libreyolo.export.cli import run_export

    out = tmp_path / "cli.onnx"
    code = run_export({"model": "LibreYOLO9t.yaml", "format": "onnx", "imgsz": "64", "dynamic": "false",
                       "output": str(out)})
    text = capsys.readouterr().out
    assert code == 0 and out.is_file()
    assert f"exported onnx: {out}" in text and "MiB" in text
    assert "validation: passed" in text
    assert f"libreyolo predict model={out} source=" in text


def test_run_export_rejects_unknown_options_and_bad_values():
    from libreyolo.export.cli import run_export

    with pytest.raises(ArgumentError, match="unknown export option"):
        run_export({"model": "LibreYOLO9t.yaml", "fromat": "onnx"})
    with pytest.raises(ArgumentError, match="dynamic must be true or false"):
        run_export({"model": "LibreYOLO9t.yaml", "dynamic": "maybe"})
    with pytest.raises(ArgumentError, match="export needs model="):
        run_export({"format": "onnx"})


def test_untrained_model_validation_still_compares_real_detections(tmp_path):
    """An untrained head scores nothing above 0.25; the validator lowers conf so the decoded
    comparison is not vacuous (what `make demo` shows)."""
    from libreyolo import LibreYOLO

    model = LibreYOLO("LibreYOLO9t.yaml")
    report = model.export(format="onnx", imgsz=320, output=tmp_path / "u.onnx", verbose=False)
    text = report.text()
    assert "compared at conf=" in text
    assert "matched 0/0" not in text and "eager 0 artifact 0" not in text
