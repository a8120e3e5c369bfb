"""bench/serving_targets.py: the serving Targets table built from a run's files (no device needed)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("serving_targets", ROOT / "bench" / "serving_targets.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write(folder: Path, name: str, data: dict) -> None:
    (folder / name).write_text(json.dumps(data))


def _run(tmp_path: Path) -> dict[str, dict]:
    out = tmp_path / "targets.json"
    assert _module().main(["--dir", str(tmp_path), "--json", str(out), "--md", str(tmp_path / "t.md")]) == 0
    return {r["target"]: r for r in json.loads(out.read_text())["targets"]}


def test_each_target_is_judged_against_its_goal_and_the_reference(tmp_path):
    _write(tmp_path, "x-serving-t26.json", {
        "device": "GPU", "ours": [
            {"workload": "sparse", "precision": "fp16", "batch": 1, "predict_graph_ms": 2.9, "forward_graph_ms": 2.5},
            {"workload": "sparse", "precision": "fp32", "batch": 1, "predict_graph_ms": 5.0, "forward_graph_ms": 3.0}],
        "ours_families": [
            {"family": "rtdetr-r34", "precision": "fp32", "batch": 1, "predict_graph_ms": 6.0, "forward_graph_ms": 4.0},
            {"family": "vit-s", "precision": "fp32", "batch": 8, "predict_graph_ms": 3.0}],
        "peer": {"workloads": [{"workload": "sparse", "precision": "fp16", "batch": 1, "predict_graph_ms": 8.0},
                               {"workload": "sparse", "precision": "fp32", "batch": 1, "predict_graph_ms": 9.0}],
                 "families": [{"family": "rtdetr-r34", "precision": "fp32", "batch": 1, "predict_graph_ms": 10.0},
                              {"family": "vit-s", "precision": "fp32", "batch": 8, "predict_eager_ms": 20.0,
                               "predict_graph_error": "NotImplementedError: no graphs"}]}})
    _write(tmp_path, "x-stream-t26-arrays.json", {
        "rows": [{"source": "arrays", "cuda_graph": True, "workers": 4, "path": "pipeline", "images_per_s": 3100.0}],
        "forward_images_per_s": {"graph=True": 4600.0}, "peer": {"rows": [{"source": "arrays", "images_per_s": 70.0}]}})
    got = _run(tmp_path)
    b1 = got["yolo9-t b1 fp16 graphed predict (not compiled)"]
    assert (b1["met"], b1["reference"], b1["floor"]) == (True, 8.0, 2.5)
    arrays = got["yolo9-t sparse, b32 fp16, host uint8 arrays, stream=True end to end"]
    assert (arrays["met"], arrays["reference"]) == (True, 70.0)
    assert got["rtdetr-r34 fp32 b1 graphed predict <= 0.5x reference"]["met"] is False  # 6.0 > 10.0 / 2
    assert got["yolo9-t sparse fp32 b1: graphed predict <= 1.3x graphed forward"]["met"] is False  # 5.0 > 3.9
    vit = got["vit-s fp32 b8 graphed predict <= 0.5x reference"]  # the reference's eager stands in for its graph
    assert (vit["met"], vit["reference"]) == (True, 20.0) and "eager" in vit["note"]
    # what the run did not produce is "not measured", never met
    assert got["yolo9-t dense, b32 fp16, host uint8 arrays, stream=True end to end"]["met"] is None
    assert got["autotuned .pt2 (yolo9-t sparse fp16 b1) predict replayed in our graph"]["met"] is None


def test_failed_gpu_tests_and_parity_cells_are_missed_targets(tmp_path):
    (tmp_path / "x-gpu-tests-t26.log").write_text("..F.\n1 failed, 3 passed in 2.00s\n")
    _write(tmp_path, "x-graph-parity-t26.json", {"rows": [
        {"family": "yolo9", "size": "t", "check": "probe_image", "result": "pass"},
        {"family": "yolo9", "size": "t", "check": "second_replay", "result": "fail"}]})
    got = _run(tmp_path)
    assert got["GPU tests (x-gpu-tests-t26.log)"]["met"] is False
    parity = got["graph parity matrix (replayed forward bit for bit eager)"]
    assert parity["met"] is False and "yolo9-t second_replay" in parity["note"]
