"""Every frame's predictions of a video source in one file (``save_json=True`` / ``save_csv=True``), crash-safe.

``<save_dir>/<stem>.json``: ``{"source", "fps", "frames": [{"frame", "timestamp", "predictions": [...]}]}``
with each frame's :meth:`~libreyolo.results.Results.summary` (detections with ``track_id`` when
tracked, top-5 classes, ...). ``<save_dir>/<stem>.csv``: one row per prediction, ``frame,
timestamp`` and the summary's fields flattened (``box.x1`` becomes ``x1``); a frame without
predictions has no row. Both are written as the frames come into a temporary file beside the
destination and renamed into place after the last frame, as the annotated video is
(:mod:`libreyolo.data.video_writer`): a failed run leaves no file and never replaces an older one
with a partial one; a ``stream=True`` loop left early keeps the frames so far, as a complete file.
"""
from __future__ import annotations

import csv
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from libreyolo.data.video_writer import output_path
from libreyolo.utils.atomic import file_mode_for
from libreyolo.utils.log import LOGGER
from libreyolo.utils.tempfiles import TempGuard

FORMATS = ("json", "csv")


def save_frames(results: Iterator[Any], info: Any, save_dir: str | Path, fmt: str) -> Iterator[Any]:
    """``results`` passed through unchanged, each frame's predictions written on the way into
    ``<save_dir>/<stem>.<fmt>``, renamed into place at the end."""
    dest = output_path(info, save_dir).with_suffix(f".{fmt}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with TempGuard() as guard:
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
        guard.add(tmp)
        finished = False
        try:
            with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
                writer = _JsonFrames(f, info) if fmt == "json" else _CsvFrames(f)
                n = 0
                try:
                    for r in results:
                        writer.add(r)
                        n += 1
                        yield r
                except GeneratorExit:  # the caller stopped early: keep what was written
                    pass
                writer.close()
            os.chmod(tmp, file_mode_for(dest))
            os.replace(tmp, dest)
            finished = True
            LOGGER.info("predictions of %d frames written to %s", n, dest)
        finally:
            if not finished:
                Path(tmp).unlink(missing_ok=True)


class _JsonFrames:
    def __init__(self, f: IO[str], info: Any) -> None:
        self.f, self.first = f, True
        f.write(f'{{"source": {json.dumps(info.name)}, "fps": {json.dumps(info.fps)}, "frames": [')

    def add(self, r: Any) -> None:
        frame = {"frame": r.frame, "timestamp": r.timestamp, "predictions": r.summary()}
        self.f.write(("\n" if self.first else ",\n") + json.dumps(frame))
        self.first = False

    def close(self) -> None:
        self.f.write("\n]}\n")


class _CsvFrames:
    def __init__(self, f: IO[str]) -> None:
        self.f = f
        self.writer: csv.DictWriter | None = None

    def add(self, r: Any) -> None:
        for row in r.summary():
            flat = {"frame": r.frame, "timestamp": r.timestamp, **_flatten(row)}
            if self.writer is None:  # the columns of the first prediction (a run's rows share them)
                self.writer = csv.DictWriter(self.f, fieldnames=list(flat), restval="", extrasaction="ignore")
                self.writer.writeheader()
            self.writer.writerow(flat)

    def close(self) -> None:
        if self.writer is None:
            self.f.write("frame,timestamp\n")  # no prediction in any frame: the header alone


def _flatten(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in row.items():
        if isinstance(v, dict):
            out.update(_flatten(v))
        else:
            out[k] = v
    return out
