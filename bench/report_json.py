"""The last step of the benchmark scripts: their report written as JSON, atomically (no half-written file)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(path: str | Path, report: dict[str, Any]) -> Path:
    """Write ``report`` (indented JSON; values JSON cannot hold as their ``str``) to ``path``, creating its folder."""
    from libreyolo.checkpoint import atomic_write

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, lambda tmp: tmp.write_text(json.dumps(report, indent=1, default=str) + "\n"))
    print(f"wrote {out}")
    return out
