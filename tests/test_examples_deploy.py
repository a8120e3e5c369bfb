"""The edge-deployment example runs as a user would run it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "deploy_edge.py"


def test_deploy_example_exports_onnx_and_runs_it_with_the_runtime_only(tmp_path):
    pytest.importorskip("onnxruntime")
    proc = subprocess.run([sys.executable, str(EXAMPLE), "LibreYOLO9t.yaml", "--imgsz", "64", "--formats", "onnx",
                           "--out", str(tmp_path)], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "validation passed" in proc.stdout
    assert "model.onnx:" in proc.stdout and "detections on sample.jpg" in proc.stdout
    assert (tmp_path / "model.onnx").is_file()


def test_deploy_example_skips_executorch_with_a_clear_message_when_missing(tmp_path, monkeypatch, capsys):
    import importlib.util

    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import deploy_edge
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    real = importlib.util.find_spec
    monkeypatch.setattr(deploy_edge.importlib.util, "find_spec",
                        lambda name, *a: None if name == "executorch" else real(name, *a))
    assert deploy_edge.main(["--formats", "executorch", "--out", str(tmp_path), "--imgsz", "64"]) == 0
    assert "skipping executorch: the 'executorch' package is not installed" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())
