"""Tracking validation: a detector and a tracker on a folder of MOTChallenge sequences, scored with
HOTA, IDF1 and MOTA by Roboflow ``trackers.eval`` (TrackEval's matching; not reimplemented here).

``model.val(data="seqs/", tracker="bytetrack")`` (or ``libreyolo val model=... tracker=bytetrack
data=seqs/``) predicts each sequence's frames in order (the same ``predict()`` as everything else,
so artifacts too), feeds them to a fresh tracker at the sequence's frame rate (:func:`tracked`),
writes MOTChallenge result files (``<seq>.txt``: ``frame, id, left, top, width, height, conf, -1,
-1, -1``) and evaluates them against ``<seq>/gt/gt.txt`` with ``trackers.eval.evaluate_mot_sequences``
(IoU 0.5 for CLEAR and Identity; HOTA over its own thresholds). Returns the metrics per sequence
and ``COMBINED`` (as fractions; the table shows percentages, as TrackEval does).
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from libreyolo.errors import ArgumentError, require

# the columns of the printed table: (key, shown as a percentage)
COLUMNS = (("HOTA", True), ("DetA", True), ("AssA", True), ("IDF1", True), ("MOTA", True), ("IDSW", False),
           ("CLR_FP", False), ("CLR_FN", False))
METRICS = ["CLEAR", "HOTA", "Identity"]


def val_tracking(model: Any, *, data: Any, tracker: str, json_path: str | None = None, save_dir: str | None = None,
                 **predict: Any) -> dict[str, Any]:
    """Metrics of ``model`` + ``tracker`` on the sequences of ``data``: {"tracker", "sequences":
    {name: metrics}, "COMBINED": metrics}. ``predict``: :meth:`predict` options (imgsz, batch,
    device, conf, ...). ``save_dir``: keep the result files there (else a temporary folder)."""
    from libreyolo.track.options import TRACK_VAL_OPTIONS
    from libreyolo.track.synth import read_mot_sequences
    from libreyolo.track.tracking import check_trackable, new_tracker

    tracker = TRACK_VAL_OPTIONS["tracker"].check("tracker", tracker)
    if tracker is None:
        raise ArgumentError("tracking validation needs tracker=, one of " + ", ".join(
            TRACK_VAL_OPTIONS["tracker"].choices))
    if json_path is not None:
        json_path = TRACK_VAL_OPTIONS["json"].check("json", json_path)
    if not data:
        raise ArgumentError("val with tracker= needs data=<folder of MOTChallenge sequences>")
    check_trackable(model.task_spec())
    new_tracker(tracker, None)  # the extra is installed, before any work
    sequences = read_mot_sequences(data)
    with tempfile.TemporaryDirectory(prefix="libreyolo-mot-") as tmp:
        out = Path(save_dir) if save_dir else Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        for seq in sequences:
            _track_sequence(model, seq, tracker, out / f"{seq.name}.txt", predict)
        result = {"tracker": tracker, **evaluate_results(data, out, [s.name for s in sequences])}
    if json_path is not None:
        from libreyolo.utils.atomic import atomic_write

        text = json.dumps(result, indent=1)
        atomic_write(Path(json_path), lambda p: p.write_text(text + "\n"))
    return result


def evaluate_results(gt_root: str | Path, results_dir: str | Path, names: list[str]) -> dict[str, Any]:
    """{"sequences": {name: metrics}, "COMBINED": metrics} of the MOTChallenge result files
    ``<results_dir>/<name>.txt`` against ``<gt_root>/<name>/gt/gt.txt`` (``trackers.eval``)."""
    require("trackers.eval", "track", "tracking metrics")
    from trackers.eval import evaluate_mot_sequences

    with tempfile.TemporaryDirectory(prefix="libreyolo-seqmap-") as tmp:
        seqmap = Path(tmp) / "seqmap.txt"
        seqmap.write_text("name\n" + "".join(f"{n}\n" for n in names))
        bench = evaluate_mot_sequences(gt_dir=Path(gt_root), tracker_dir=Path(results_dir), seqmap=seqmap,
                                       metrics=METRICS)
    return {"sequences": {n: _flat(s) for n, s in bench.sequences.items()}, "COMBINED": _flat(bench.aggregate)}


def _track_sequence(model: Any, seq: Any, tracker: str, dest: Path, predict: dict[str, Any]) -> None:
    from libreyolo.track.tracking import new_tracker, tracked
    from libreyolo.utils.atomic import atomic_write

    files = [str(p) for p in seq.images]
    rows: list[str] = []
    results = model.predict(files, stream=True, **predict)
    for t, (path, r) in enumerate(zip(files, tracked(results, new_tracker(tracker, seq.fps)), strict=True), 1):
        if r.path != path:  # an unreadable frame was skipped: the frame numbers would shift
            raise ArgumentError(f"{seq.name}: frame {path} could not be read; every frame of a sequence must be")
        b = r.boxes.cpu()
        for (x1, y1, x2, y2), conf, ident in zip(b.xyxy.tolist(), b.conf.tolist(), b.id.tolist(), strict=True):
            rows.append(f"{t},{ident},{x1:.2f},{y1:.2f},{x2 - x1:.2f},{y2 - y1:.2f},{conf:.4f},-1,-1,-1\n")
    atomic_write(dest, lambda p: p.write_text("".join(rows)))


def _flat(result: Any) -> dict[str, float]:
    """The scalar metrics of one trackers.eval SequenceResult, in one dict."""
    out: dict[str, float] = {}
    for part in (result.HOTA, result.CLEAR, result.Identity):
        if part is not None:
            out.update({k: v for k, v in part.to_dict().items() if isinstance(v, (int, float))})
    return out


def format_table(result: dict[str, Any]) -> str:
    """Per-sequence and combined rows of :data:`COLUMNS` (fractions shown as percentages)."""
    rows = [*result["sequences"].items(), ("COMBINED", result["COMBINED"])]
    width = max(len("sequence"), *(len(n) for n, _ in rows))
    head = f"{'sequence':<{width}}" + "".join(f"{k.replace('CLR_', ''):>8}" for k, _ in COLUMNS)
    lines = [f"tracker: {result['tracker']}", head, "-" * len(head)]
    for i, (name, m) in enumerate(rows):
        if i == len(rows) - 1:
            lines.append("-" * len(head))
        cells = "".join(f"{100 * m[k]:>8.2f}" if pct else f"{int(m[k]):>8d}" for k, pct in COLUMNS)
        lines.append(f"{name:<{width}}" + cells)
    return "\n".join(lines)
