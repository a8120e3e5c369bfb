"""Shared helpers for the checkpoint-compatibility tests (every family uses the same bar).

The bar (issue 8): raw outputs within ``RAW_ATOL``; predictions compared as sets with at least
``MIN_SET_MATCH`` matched both ways, a match being the same class, IoU >= ``MATCH_IOU`` and a
score within ``SCORE_TOL``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from libreyolo.ops.boxes import box_iou

RAW_ATOL = 1e-4
MIN_SET_MATCH = 0.99
MATCH_IOU = 0.99
SCORE_TOL = 1e-4


def fixtures(compat_dir: Path, *, family: str | None = None, task: str | None = None) -> list[Path]:
    """Fixture folders whose schema names ``family`` (and/or ``task``), sorted by name."""
    out = []
    for d in sorted((compat_dir / "fixtures").iterdir()):
        schema = d / "schema.json"
        if not schema.is_file():
            continue
        s = json.loads(schema.read_text())
        if (family is None or s["family"] == family) and (task is None or s["task"] == task):
            out.append(d)
    return out


def schema(d: Path) -> dict[str, Any]:
    return json.loads((d / "schema.json").read_text())


def model_from_fixture(d: Path, compat_fill) -> Any:
    """The project's model for a fixture, loaded exactly as ``LibreYOLO("x.pt")`` loads a file.

    The fixture's metadata and filled state dict are saved as a reference-format checkpoint
    (a flat dict, like the reference's ``save()`` writes) and read back through ``LibreYOLO``.
    """
    import tempfile

    from libreyolo import LibreYOLO

    meta = json.loads((d / "meta.json").read_text())
    meta["names"] = {int(k): v for k, v in meta["names"].items()}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{d.name}.pt"
        torch.save({"model": compat_fill.fill(d), **meta}, path)
        return LibreYOLO(path)


def flatten_outputs(out: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Network outputs flattened by path like the fixtures' ``output.<probe>.<path>`` keys."""
    if isinstance(out, torch.Tensor):
        return {prefix: out}
    items = out.items() if isinstance(out, dict) else enumerate(out)
    flat: dict[str, torch.Tensor] = {}
    for k, v in items:
        flat.update(flatten_outputs(v, f"{prefix}.{k}" if prefix else str(k)))
    return flat


def assert_probe_parity(model: Any, d: Path, compat_fill) -> None:
    """Every recorded ``output.<probe>.*`` array is reproduced within ``RAW_ATOL``."""
    s = schema(d)
    recorded = np.load(d / "probes.npz")
    net = model.net.eval()
    for name, x in compat_fill.probes(s["probe_size"], s["seed"]).items():
        with torch.no_grad():
            flat = flatten_outputs(net(x))
        keys = [k for k in recorded if k == f"output.{name}" or k.startswith(f"output.{name}.")]
        assert keys, f"{d.name}: no recorded outputs for probe {name}"
        for key in keys:
            path = key[len(f"output.{name}."):] if key != f"output.{name}" else ""
            assert path in flat, f"{d.name}: output {path!r} missing; ours: {sorted(flat)[:8]}"
            ours = flat[path].float().numpy()
            assert ours.shape == recorded[key].shape, (d.name, key, ours.shape, recorded[key].shape)
            err = float(np.abs(ours - recorded[key]).max()) if ours.size else 0.0
            assert err <= RAW_ATOL, f"{d.name} {key}: max abs error {err:.3g} > {RAW_ATOL}"


def set_match(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> tuple[float, float]:
    """Fraction of our detections matched in theirs, and of theirs matched in ours."""
    a, b = (ours["xyxy"].float(), ours["conf"].float(), ours["cls"].float()), \
        (theirs["xyxy"].float(), theirs["conf"].float(), theirs["cls"].float())
    if len(a[0]) == 0 or len(b[0]) == 0:
        both_empty = float(len(a[0]) == len(b[0]))
        return both_empty, both_empty
    ok = ((box_iou(a[0], b[0]) >= MATCH_IOU) & (a[2][:, None] == b[2][None])
          & ((a[1][:, None] - b[1][None]).abs() <= SCORE_TOL))
    return ok.any(1).float().mean().item(), ok.any(0).float().mean().item()


def recorded_detections(d: Path) -> tuple[dict[str, torch.Tensor], str]:
    ref = np.load(d / "predict.npz")
    return {k: torch.from_numpy(ref[k]).float() for k in ("xyxy", "conf", "cls")}, str(ref["call"])


def assert_detections_match(result: Any, d: Path) -> None:
    theirs, _ = recorded_detections(d)
    ours = {"xyxy": result.boxes.xyxy, "conf": result.boxes.conf, "cls": result.boxes.cls}
    a, b = set_match(ours, theirs)
    assert min(a, b) >= MIN_SET_MATCH, (
        f"{d.name}: {len(ours['conf'])} ours vs {len(theirs['conf'])} recorded; matched {a:.3f} / {b:.3f}, "
        f"need {MIN_SET_MATCH}")
