"""The multi-threaded serving example runs as a user would run it (eagerly, with a message, on a CPU)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_serve_threads_example_serves_every_thread_its_own_result(tmp_path):
    args = ["--imgsz", "64", "--conf", "0.5", "--threads", "2", "--requests", "4"]
    proc = subprocess.run([sys.executable, str(EXAMPLES / "serve_threads.py"), *args],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if torch.cuda.is_available():
        assert "CUDA graph captured" in proc.stdout
    else:
        assert "No CUDA GPU here: serving eagerly" in proc.stdout
    assert "4 requests in" in proc.stdout
    assert "every request got its own correct result" in proc.stdout
