"""The predict example runs as a user would run it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from PIL import Image

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_predict_example_runs_and_saves_an_image(tmp_path):
    out = tmp_path / "annotated.jpg"
    proc = subprocess.run([sys.executable, str(EXAMPLES / "predict.py"), "LibreYOLO9t.yaml", "", str(out)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "detections" in proc.stdout
    assert Image.open(out).size == (640, 480)
