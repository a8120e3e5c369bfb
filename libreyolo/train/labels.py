"""Label checking for detection datasets: each image's label file found, read and checked once.

Every problem becomes one warning line naming the file (the bad line is dropped, a box past the
edge is clipped, an unreadable image is skipped), and one summary line follows
(:func:`scan_images`), so training never stops halfway through an epoch because of a bad file.
The label layout is Ultralytics' (:mod:`libreyolo.train.data`).
"""
from __future__ import annotations

import logging
import math
import os
import stat
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from libreyolo.data.sources import check_pixels
from libreyolo.errors import DatasetError, ImageError

LOGGER = logging.getLogger("libreyolo")
_MAX_WARNINGS = 100      # per scan; the rest are counted in the summary line
_EDGE_TOLERANCE = 1e-4   # a box this little past the edge is clipped without a warning
_SCAN_THREADS = min(8, os.cpu_count() or 1)


def label_path(image: Path) -> Path:
    """The label file of ``image``: ``.../labels/...`` for ``.../images/...`` when it exists, else beside it."""
    parts = image.parts
    if "images" in parts[:-1]:
        k = len(parts) - 2 - parts[-2::-1].index("images")
        candidate = Path(*parts[:k], "labels", *parts[k + 1:]).with_suffix(".txt")
        if candidate.exists():  # a folder here is reported by the scan, not silently a background
            return candidate
    return image.with_suffix(".txt")


def _check_image(path: Path) -> tuple[int, int]:
    """(height, width) of the upright image, without decoding it when the file looks complete."""
    try:
        st = path.stat()
    except OSError as exc:
        raise ImageError(f"cannot read image {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ImageError(f"cannot read image {path}: not a regular file")
    try:
        with Image.open(path) as img:
            img.verify()
        with Image.open(path) as img:
            w, h = img.size
            check_pixels(w, h, str(path))
            if img.getexif().get(0x0112, 1) in (5, 6, 7, 8):  # EXIF rotation by 90 degrees
                w, h = h, w
            if img.format == "JPEG":  # verify() does not decode JPEG data; a cut file lacks the end marker
                with open(path, "rb") as f:
                    f.seek(-2, os.SEEK_END)
                    if f.read(2) != b"\xff\xd9":
                        img.load()
    except ImageError:
        raise
    except Exception as exc:  # Pillow raises many types for broken files
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ImageError(f"cannot read image {path}: the file is corrupt or not an image ({text})") from None
    if w < 2 or h < 2:
        raise ImageError(f"image {path} is too small ({w}x{h})")
    return h, w


_PROBLEMS = {  # kind -> (what was wrong, what was done)
    "fields": ("expected 5 fields 'class cx cy w h'", "dropped"),
    "number": ("fields are not all finite numbers", "dropped"),
    "class_int": ("class id is not an integer", "dropped"),
    "class_range": ("class id outside [0, {nc})", "dropped"),
    "size": ("box has zero or negative width or height", "dropped"),
    "outside": ("box lies entirely outside the image", "dropped"),
    "clipped": ("box extends past the image edge", "clipped to the image"),
    "duplicate": ("box line repeats an earlier one", "dropped"),
}


def _parse_labels(path: Path, nc: int) -> tuple[np.ndarray, dict[str, list[str]]]:
    """Boxes ``(n, 5)`` [cls, x1, y1, x2, y2] normalised and clipped to [0, 1], and the problems
    found (kind -> details, one per affected line)."""
    problems: dict[str, list[str]] = {}
    rows: list[tuple[float, ...]] = []
    seen: set[tuple[float, ...]] = set()
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        shown = line.strip() if len(line.strip()) <= 60 else line.strip()[:57] + "..."
        if len(fields) != 5:
            problems.setdefault("fields", []).append(f"line {lineno} has {len(fields)}: {shown!r}")
            continue
        try:
            values = [float(v) for v in fields]
        except ValueError:
            values = [math.nan]
        if not all(math.isfinite(v) for v in values):
            problems.setdefault("number", []).append(f"line {lineno}: {shown!r}")
            continue
        cls, cx, cy, w, h = values
        if not cls.is_integer():
            problems.setdefault("class_int", []).append(f"line {lineno}: {fields[0]}")
            continue
        if not 0 <= cls < nc:
            problems.setdefault("class_range", []).append(f"line {lineno}: {int(cls)}, nc={nc}")
            continue
        if w <= 0 or h <= 0:
            problems.setdefault("size", []).append(f"line {lineno}: w={fields[3]} h={fields[4]}")
            continue
        box = (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)
        clipped = tuple(min(max(v, 0.0), 1.0) for v in box)
        if clipped[2] - clipped[0] <= 0 or clipped[3] - clipped[1] <= 0:
            hint = " (pixel coordinates? YOLO labels are normalised to 0..1)" if max(values[1:]) > 1.5 else ""
            problems.setdefault("outside", []).append(f"line {lineno}: {shown!r}{hint}")
            continue
        if max(abs(a - b) for a, b in zip(box, clipped, strict=True)) > _EDGE_TOLERANCE:
            problems.setdefault("clipped", []).append(f"line {lineno}")
        row = (cls, *clipped)
        if row in seen:
            problems.setdefault("duplicate", []).append(f"line {lineno}")
            continue
        seen.add(row)
        rows.append(row)
    return np.array(rows, dtype=np.float32).reshape(-1, 5), problems


@dataclass
class _Scanned:
    path: Path
    shape: tuple[int, int] | None = None     # (h, w) upright; None: image skipped
    boxes: np.ndarray = field(default_factory=lambda: np.zeros((0, 5), np.float32))
    label_state: str = "ok"                  # ok | missing | empty
    dropped: int = 0
    clipped: int = 0
    warnings: list[str] = field(default_factory=list)


def _scan_one(image: Path, nc: int | None) -> _Scanned:
    result = _Scanned(image)
    try:
        shape = _check_image(image)
    except ImageError as exc:
        result.warnings.append(f"{exc}: image skipped")
        return result
    if nc is None:  # classification: the image is all there is to check
        result.shape = shape
        return result
    labels = label_path(image)
    if labels.exists() and not labels.is_file():  # a folder named like a label is not a background image
        result.warnings.append(f"{labels}: the label path is a folder or not a regular file, not a label file: "
                               f"image {image.name} skipped")
        return result
    if not labels.is_file():
        result.shape, result.label_state = shape, "missing"
        return result
    try:
        boxes, problems = _parse_labels(labels, nc)
    except (OSError, UnicodeDecodeError) as exc:
        result.warnings.append(f"{labels}: label file cannot be read ({exc}): image {image.name} skipped")
        return result
    for kind, details in problems.items():
        what, action = _PROBLEMS[kind]
        shown = "; ".join(details[:3]) + (f"; and {len(details) - 3} more" if len(details) > 3 else "")
        result.warnings.append(f"{labels}: {what.format(nc=nc)} ({shown}): {action}")
        if kind == "clipped":
            result.clipped += len(details)
        else:
            result.dropped += len(details)
    result.shape, result.boxes = shape, boxes
    result.label_state = "ok" if len(boxes) else "empty"
    return result


def scan_images(files: Sequence[str | Path], nc: int | None, prefix: str = "") -> list[_Scanned]:
    """Check every image (and, when ``nc`` is given, its detection labels); log the problems, one
    warning line each, then one summary line. Returns the usable images, in the order given."""
    files = [Path(f) for f in files]
    if not files:
        raise DatasetError(f"{prefix}no image files given")
    with ThreadPoolExecutor(_SCAN_THREADS) as pool:
        results = list(pool.map(lambda f: _scan_one(f, nc), files))
    lines = [w for r in results for w in r.warnings]
    for line in lines[:_MAX_WARNINGS]:
        LOGGER.warning(f"{prefix}{line}")
    if len(lines) > _MAX_WARNINGS:
        LOGGER.warning(f"{prefix}{len(lines) - _MAX_WARNINGS} more dataset warnings not shown")
    kept = [r for r in results if r.shape is not None]
    skipped = len(results) - len(kept)
    summary = f"{prefix}{len(results)} images: {len(kept)} usable, {skipped} skipped (unreadable)"
    if nc is not None:
        missing = sum(r.label_state == "missing" for r in kept)
        empty = sum(r.label_state == "empty" for r in kept)
        summary += (f", {missing + empty} backgrounds ({missing} without a label file, {empty} with no boxes), "
                    f"{sum(len(r.boxes) for r in kept)} boxes, {sum(r.dropped for r in results)} label lines "
                    f"dropped, {sum(r.clipped for r in results)} boxes clipped")
        if kept and missing == len(kept):
            LOGGER.warning(f"{prefix}no image has a label file (e.g. {label_path(kept[0].path)} is missing): "
                           "every image is treated as background")
    LOGGER.info(summary)
    if not kept:
        raise DatasetError(f"{prefix}none of the {len(results)} images can be read (e.g. {files[0]}); "
                           "see the warnings above")
    return kept
