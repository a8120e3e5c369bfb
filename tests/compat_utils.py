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


def gap_conf(conf: np.ndarray, least_rows: int = 20) -> tuple[float, float, int]:
    """For a recorded top-k prediction (set predictors, one-to-one heads: the top-k comes before the
    conf filter, so the reference's answer at a higher conf is the recorded rows above it): the middle
    of the widest gap between consecutive recorded scores that leaves at least ``least_rows``
    detections above it, as (conf, gap, rows above). No row there is decided by float noise."""
    s = np.sort(conf)[::-1]
    gaps = s[least_rows - 1:-1] - s[least_rows:]
    i = int(np.argmax(gaps)) + least_rows - 1
    return float((s[i] + s[i + 1]) / 2), float(gaps[i - least_rows + 1]), i + 1


def assert_detections_match_above_gap(result_at: Any, d: Path) -> None:
    """``result_at(conf)`` (a predict call) matches every recorded detection above :func:`gap_conf`'s
    conf both ways, and no other. The gap must exceed twice the score tolerance: a row within the
    tolerance of its recorded score then cannot cross the threshold in the gap's middle."""
    theirs, call = recorded_detections(d)
    assert "conf=0.01" in call, call
    conf, gap, rows = gap_conf(theirs["conf"].numpy())
    assert gap > 2 * SCORE_TOL, f"{d.name}: no clear gap in the recorded scores ({gap:.2g})"
    keep = theirs["conf"] > conf
    theirs = {k: v[keep] for k, v in theirs.items()}
    r = result_at(conf)
    ours = {"xyxy": r.boxes.xyxy, "conf": r.boxes.conf, "cls": r.boxes.cls}
    assert len(ours["conf"]) == rows == len(theirs["conf"]), (d.name, len(ours["conf"]), rows)
    assert set_match(ours, theirs) == (1.0, 1.0), d.name
