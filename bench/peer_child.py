"""Running the reference library as a black box: a child process of its interpreter that prints
one ``PEER_JSON {...}`` line per finished stage (the last one wins), shared by the bench scripts."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any


def run_peer_child(python: str, code: str, cfg_path: Path, cwd: Path, timeout: float) -> dict[str, Any]:
    """``python -c code cfg_path`` in ``cwd``: its last PEER_JSON object, plus ``rc``, ``wall_s``
    and, when it failed or printed nothing, ``error`` and ``stderr_tail``. A timeout keeps what it
    printed before."""
    peer: dict[str, Any] = {"python": python, "timeout_s": timeout}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([python, "-c", code, str(cfg_path)], capture_output=True, text=True, cwd=str(cwd),
                              timeout=timeout)
        stdout, stderr, peer["rc"] = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        peer["rc"] = f"timed out after {timeout} s"
    peer["wall_s"] = round(time.perf_counter() - t0, 1)
    lines = [ln for ln in stdout.splitlines() if ln.startswith("PEER_JSON ")]
    if lines:
        peer.update(json.loads(lines[-1][len("PEER_JSON "):]))
    else:
        peer["error"] = "no PEER_JSON line"
    if not lines or peer.get("rc") != 0:
        peer["stderr_tail"] = stderr[-3000:]
    return peer
