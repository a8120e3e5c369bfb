"""Per-epoch training records: ``results.csv``, ``results.json`` and a ``results.png`` overview.

Both files are rewritten whole after every epoch through a temporary file renamed into place, so a
run killed at any moment leaves either the previous or the new complete file, never half of one.
"""
from __future__ import annotations

import csv
import io
import json
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from libreyolo.utils.atomic import atomic_write

LOGGER = logging.getLogger("libreyolo")


def _plain(value: Any) -> Any:
    """Tensors, numpy scalars/arrays and tuples as plain JSON-able Python values."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return _plain(value.tolist())  # torch tensors and numpy values
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def flatten_row(row: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """One level of columns: nested mappings become ``outer/inner`` and sequences ``name/0``, ``name/1``...
    (so ``{"losses": {"box": 1.2}, "lr": [0.01, 0.01]}`` gives ``losses/box``, ``lr/0``, ``lr/1``)."""
    flat: dict[str, Any] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_row(value, f"{name}/"))
        elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
            flat.update(flatten_row({str(i): v for i, v in enumerate(value)}, f"{name}/"))
        else:
            flat[name] = value
    return flat


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class MetricsLog:
    """Collects one row per epoch and keeps ``results.csv`` / ``results.json`` in ``save_dir`` up to date.

    A row is a dict such as ``{"epoch": 3, "losses": {...}, "lr": [...], "metrics": {...}, "seconds": 41.2}``.
    ``results.json`` holds the rows as given (a list of dicts, tensors turned into numbers); ``results.csv``
    holds them flattened (see :func:`flatten_row`), one column per key seen in any row, in order of first
    appearance, with empty cells where a row lacks a key. With ``resume=True`` the rows already in
    ``results.json`` are loaded first, so a resumed run continues the same files.
    """

    def __init__(self, save_dir: str | Path, *, resume: bool = False) -> None:
        self.save_dir = Path(save_dir)
        self.save_dir.mkdir(parents=True, exist_ok=True)
        self.csv_path = self.save_dir / "results.csv"
        self.json_path = self.save_dir / "results.json"
        self.png_path = self.save_dir / "results.png"
        self.rows: list[dict[str, Any]] = []
        if resume and self.json_path.is_file():
            self.rows = list(json.loads(self.json_path.read_text()))

    def columns(self) -> list[str]:
        seen: dict[str, None] = {}
        for row in self.rows:
            seen.update(dict.fromkeys(flatten_row(row)))
        return list(seen)

    def append(self, row: Mapping[str, Any]) -> None:
        """Add one epoch's row and rewrite both files atomically."""
        self.rows.append(_plain(dict(row)))
        columns = self.columns()
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=columns, restval="", lineterminator="\n")
        writer.writeheader()
        for flat in map(flatten_row, self.rows):
            writer.writerow(flat)
        text_csv = buffer.getvalue()
        text_json = json.dumps(self.rows, indent=1)
        atomic_write(self.csv_path, lambda tmp: Path(tmp).write_text(text_csv))
        atomic_write(self.json_path, lambda tmp: Path(tmp).write_text(text_json + "\n"))

    def plot(self) -> Path | None:
        """Write ``results.png``: one panel per numeric column against the epoch. Returns its path, or None when
        there is nothing to plot or matplotlib is not installed (one info line says which extra provides it)."""
        if not self.rows:
            return None
        try:
            # the object API with an explicit Agg canvas: no pyplot, so the user's global backend is left alone
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure
        except ImportError:
            LOGGER.info("results.png skipped: plotting needs matplotlib (pip install 'libreyolo[train]')")
            return None
        flat_rows = [flatten_row(row) for row in self.rows]
        x_key = "epoch"
        xs = [flat.get(x_key, i) for i, flat in enumerate(flat_rows)]
        panels = [c for c in self.columns() if c != x_key and any(_is_number(flat.get(c)) for flat in flat_rows)]
        if not panels:
            return None
        ncols = min(5, len(panels))
        nrows = math.ceil(len(panels) / ncols)
        figure = Figure(figsize=(3.2 * ncols, 2.6 * nrows), tight_layout=True)
        FigureCanvasAgg(figure)
        axes = figure.subplots(nrows, ncols, squeeze=False).ravel()
        for ax, column in zip(axes, panels, strict=False):
            points = [(x, flat[column]) for x, flat in zip(xs, flat_rows, strict=True) if _is_number(flat.get(column))]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", linewidth=1.5)
            ax.set_title(column, fontsize=9)
            ax.set_xlabel(x_key, fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
        for ax in axes[len(panels):]:
            ax.set_visible(False)
        atomic_write(self.png_path, lambda tmp: figure.savefig(tmp, format="png", dpi=120))
        return self.png_path
