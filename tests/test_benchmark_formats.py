"""``libreyolo benchmark`` across formats: the table, the JSON, and the exit status CI relies on.

The demo detector at imgsz 160 with formats=onnx (one ONNX export, ~5 s on 2 cores) on a small
generated shapes val split; n=2 timed calls keep it cheap (the timings are not checked).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("faster_coco_eval", reason="mAP needs libreyolo[train] (faster-coco-eval)")

from libreyolo.cli import main as cli_main  # noqa: E402
from libreyolo.train.shapes import make_shapes_dataset  # noqa: E402

IMGSZ = 160
COLUMNS = ("format", "size MiB", "validation", "err vs fp64", "mAP50-95", "ms/img", "img/s")


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    return make_shapes_dataset(tmp_path_factory.mktemp("bench-shapes"), n_train=1, n_val=8, imgsz=IMGSZ, seed=3)


def _bench(shapes: Path, out: Path, *extra: str) -> list[str]:
    return ["benchmark", "model=LibreYOLO9t-shapes.pt", f"imgsz={IMGSZ}", "formats=onnx", f"data={shapes}", "n=2",
            "device=cpu", f"json={out}", *extra]


@pytest.fixture(scope="module")
def onnx_run(shapes, tmp_path_factory):
    import contextlib
    import io

    folder = tmp_path_factory.mktemp("bench")
    out = folder / "bench.json"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):  # capsys is per test; this run is shared by the tests below
        rc = cli_main(_bench(shapes, out, f"save_dir={folder / 'artifacts'}"))
    return rc, buf.getvalue(), json.loads(out.read_text())


def test_benchmark_prints_one_row_per_format_with_the_columns_and_exits_0(onnx_run):
    rc, out, _ = onnx_run
    assert rc == 0, out
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("format"))
    assert all(c in header for c in COLUMNS), header
    rows = {line.split()[0]: line for line in lines[lines.index(header) + 1:] if line.split()}
    assert rows["eager"].split()[2] == "reference" and rows["onnx"].split()[2] == "passed"
    assert "CUDA graphs need a CUDA device" in rows["cuda_graph"]
    assert "all run formats passed" in out


def test_benchmark_json_holds_the_rows_with_equal_eager_and_onnx_map(onnx_run):
    _, _, report = onnx_run
    assert report["passed"] is True and report["metric_name"] == "mAP50-95" and report["imgsz"] == IMGSZ
    rows = {r["format"]: r for r in report["rows"]}
    assert list(rows) == ["eager", "cuda_graph", "onnx"]
    for key in ("size_mib", "status", "float64_error", "metric", "ms_per_image", "images_per_s"):
        assert all(key in r for r in rows.values())
    eager, onnx = rows["eager"], rows["onnx"]
    assert eager["metric"] > 0.5 and abs(onnx["metric"] - eager["metric"]) <= 1e-9  # see test_val_artifacts
    assert onnx["size_mib"] > 1 and onnx["ms_per_image"] > 0 and onnx["images_per_s"] > 0
    assert rows["cuda_graph"]["status"] == "not run" and rows["cuda_graph"]["ms_per_image"] is None


def test_an_artifact_is_benchmarked_alone_from_its_recorded_validation(onnx_run, shapes, capsys):
    _, _, report = onnx_run
    kept = Path(report["rows"][-1]["file"])
    assert kept.is_file() and kept.parent.name == "artifacts"  # save_dir= keeps the exports
    assert cli_main(["benchmark", f"model={kept}", f"data={shapes}", "n=2"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("onnx")]
    assert len(rows) == 1 and rows[0].split()[2] == "passed"
    assert abs(float(rows[0].split()[4]) - report["rows"][0]["metric"]) < 1e-4  # printed with 4 decimals
    assert cli_main(["benchmark", f"model={kept}", "formats=executorch"]) == 2
    assert "cannot be exported to executorch" in capsys.readouterr().err


def test_a_metric_below_eager_minus_floor_exits_1(shapes, tmp_path, monkeypatch, capsys):
    """Also: the float64 errors the validation report records are what the table shows (today's
    report has none: the keys are added here, as the float64 comparison will add them)."""
    from libreyolo.engine import benchmark_formats as bench
    from libreyolo.export.report import ValidationReport

    recorded = ValidationReport.to_dict
    monkeypatch.setattr(ValidationReport, "to_dict", lambda self: {
        **recorded(self), "artifact_float64_error": 2.5e-5, "eager_float64_error": 1.25e-5})
    real = bench._metric

    def dropped(model, data, **kw):  # the artifact's real mAP, minus 0.05 (what a broken export might lose)
        value = real(model, data, **kw)
        return value - 0.05 if hasattr(model, "format") else value

    monkeypatch.setattr(bench, "_metric", dropped)
    out = tmp_path / "b.json"
    assert cli_main(_bench(shapes, out, "floor=0.01")) == 1
    text = capsys.readouterr().out
    assert "below floor" in text and "FAILED: onnx" in text
    report = json.loads(out.read_text())
    assert report["passed"] is False and report["rows"][-1]["status"] == "below floor"
    assert [r["float64_error"] for r in report["rows"]] == [1.25e-5, None, 2.5e-5]
    assert "1.25e-05" in text and "2.50e-05" in text


def test_a_format_that_fails_validation_exits_1(tmp_path, monkeypatch, capsys):
    from libreyolo.runtimes.onnx import OnnxPredictor

    real = OnnxPredictor._run
    monkeypatch.setattr(OnnxPredictor, "_run", lambda self, batch: [o * 1.05 for o in real(self, batch)])
    argv = ["benchmark", "model=LibreYOLO9t-shapes.pt", "imgsz=64", "formats=onnx", "n=1", "device=cpu"]
    assert cli_main(argv) == 1
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.startswith("onnx"))
    assert row.split()[1:3] == ["-", "failed"] and "does not match the eager model" in row
    assert "FAILED: onnx" in text


@pytest.mark.parametrize("arg, message", [
    ("n=0", "n must be an integer from 1 to 100000, got '0'"),
    ("n=-5", "n must be an integer from 1 to 100000, got '-5'"),
    ("n=two", "n must be an integer from 1 to 100000, got 'two'"),
    ("batch=0", "batch must be an integer from 1 to 1024"),
    ("floor=-0.1", "floor must be a number from 0 to 1"),
    ("floor=nan", "floor must be a finite number"),
    ("formats=onnx,jpeg", "unknown export format 'jpeg'"),
    ("workers=-1", "workers must be an integer from 0 to 64"),
    ("int8=true", "int8=True needs data=: the dataset whose train split calibrates"),
    ("int8=maybe", "int8 must be"),
    ("max_drop=0.05", "max_drop=0.05 applies to the INT8 rows only"),
    ("max_drop=2", "max_drop must be a number from 0 to 1"),
])
def test_bad_benchmark_options_are_one_clean_line_and_exit_2(arg, message, capsys):
    assert cli_main(["benchmark", "model=LibreYOLO9t-shapes.pt", arg]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in err[0], err


def test_formats_that_cannot_run_here_get_a_row_saying_why(monkeypatch):
    import torch

    from libreyolo import LibreYOLO
    from libreyolo.engine.benchmark_formats import why_not_here

    model = LibreYOLO("LibreYOLO9t-shapes.pt")
    if not torch.cuda.is_available():
        assert why_not_here(model, "tensorrt", imgsz=IMGSZ, batch=1, half=False) == "needs tensorrt and an NVIDIA GPU"
    monkeypatch.setattr("sys.platform", "linux")
    assert "macOS" in why_not_here(model, "coreml", imgsz=IMGSZ, batch=1, half=False)
    assert why_not_here(model, "onnx", imgsz=IMGSZ, batch=1, half=False) is None


INT8_IMGSZ = 64


@pytest.fixture(scope="module")
def int8_run(tmp_path_factory):
    """formats=onnx,coreml with int8=true: onnx, onnx-int8 (exported, timed, gated), coreml and
    coreml-int8 (not run here off macOS, without exporting). At imgsz 64 on 4 calibration images
    the demo's INT8 drop is larger than the default 0.02 (the row then fails with the gate's
    message and the run exits 1), so max_drop=0.5 lets the row pass and be timed."""
    import contextlib
    import io

    data = make_shapes_dataset(tmp_path_factory.mktemp("bench-int8-shapes"), n_train=4, n_val=4, imgsz=INT8_IMGSZ,
                               seed=3)
    out = tmp_path_factory.mktemp("bench-int8") / "bench.json"
    buf = io.StringIO()
    argv = ["benchmark", "model=LibreYOLO9t-shapes.pt", f"imgsz={INT8_IMGSZ}", "formats=onnx,coreml", f"data={data}",
            "n=1", "device=cpu", "int8=true", "max_drop=0.5", f"json={out}"]
    with contextlib.redirect_stdout(buf):
        rc = cli_main(argv)
    return rc, buf.getvalue(), json.loads(out.read_text())


def test_int8_rows_are_exported_timed_measured_and_gated(int8_run):
    import sys

    rc, out, report = int8_run
    rows = {r["format"]: r for r in report["rows"]}
    assert list(rows) == ["eager", "cuda_graph", "onnx", "onnx-int8", "coreml", "coreml-int8"], list(rows)
    q, eager = rows["onnx-int8"], rows["eager"]
    assert q["status"] == "passed", q
    gate = q["gate"]
    assert gate["metric"] == "mAP50-95" and set(gate) >= {"float", "int8", "drop", "max_drop", "passed"}
    assert gate["passed"] is True and gate["drop"] <= gate["max_drop"] == 0.5 and gate["int8"] > 0.05
    assert gate["float"] == pytest.approx(eager["metric"], abs=1e-6)  # the float eager model on the same val split
    assert q["metric"] == pytest.approx(gate["int8"], abs=1e-6)  # the benchmark's val() of the INT8 artifact
    assert q["ms_per_image"] > 0 and q["size_mib"] < rows["onnx"]["size_mib"]  # int8 weights
    assert q["file"].endswith("-int8.onnx")
    line = next(line for line in out.splitlines() if line.startswith("onnx-int8"))
    assert "gate mAP50-95 float" in line and "-> int8" in line
    if sys.platform != "darwin":
        assert rows["coreml-int8"]["status"] == "not run" and "macOS" in rows["coreml-int8"]["reason"]
    assert rc == 0 and report["passed"] is True, out


def test_int8_without_data_is_refused_in_python_too():
    from libreyolo import LibreYOLO
    from libreyolo.engine.benchmark_formats import benchmark_formats
    from libreyolo.errors import ArgumentError

    with pytest.raises(ArgumentError, match="int8=True needs data="):
        benchmark_formats(LibreYOLO("LibreYOLO9t-shapes.pt"), formats="onnx", int8=True, n=1)
