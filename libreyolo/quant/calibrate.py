"""Calibration: which images, and the per-tensor input range of each quantized layer.

Ranges are collected with forward pre-hooks on the master network, run on the family's own
preprocessing (the predictor's letterbox / resize-crop at ``model.imgsz``).

Methods (one range ``(low, high)`` per layer input):

- ``minmax``: the smallest and largest value seen.
- ``percentile``: the 0.01th and 99.99th percentiles *of the values* (not of ``|x|``), read
  from a 2048-bin histogram over the min/max range (each percentile is the upper edge of the
  bin where the cumulative count reaches it).
- ``entropy``: TensorRT's calibration: a 2048-bin histogram of ``|x|`` over ``[0, max|x|]``;
  for each candidate threshold of ``i`` bins (128..2048) the clipped distribution is
  compared with its 128-level quantization by KL divergence, and the threshold with the least
  divergence wins (:func:`entropy_threshold`). The range is min/max clipped to ``[-t, t]``.

Every range is widened to contain 0, so that zero is exactly representable.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from libreyolo.errors import ArgumentError, DatasetError

HIST_BINS = 2048
QUANT_LEVELS = 128  # 2 ** (8 - 1): the positive half of int8, as TensorRT's entropy calibrator
PERCENTILE = 99.99
CALIB_BATCH = 8


# --- which images -----------------------------------------------------------------------------
def calibration_images(data: Any) -> tuple[list[Path], str]:
    """The image files of ``data`` (a dataset YAML: its train split, else val; or a folder of
    images, searched recursively) and a description of where they came from."""
    from libreyolo.data.sources import IMAGE_SUFFIXES
    from libreyolo.train.data import images_in, list_images

    if data is None or data == "":
        raise ArgumentError("quantize needs data=: a dataset YAML (its train split is used, else val) "
                            "or a folder of calibration images")
    path = Path(str(data)).expanduser().absolute()
    if path.is_dir():
        if (path / "train").is_dir():  # a classification root: calibrate on train, never on val
            path = path / "train"
        files = images_in(path)
        if not files:
            raise DatasetError(f"calibration folder {path} holds no images (looked for "
                               f"{', '.join(sorted(IMAGE_SUFFIXES))}); pass a folder of images or a dataset YAML")
        return files, f"folder {path}"
    if not path.is_file():
        raise DatasetError(f"calibration data not found: {path}; pass a dataset YAML or a folder of images")
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise DatasetError(f"calibration data {path} is neither a dataset YAML (.yaml) nor a folder of images")
    import yaml

    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise DatasetError(f"data YAML {path} cannot be parsed: {' '.join(str(exc).split())}") from None
    where = f"data YAML {path}"
    if not isinstance(raw, dict):
        raise DatasetError(f"{where}: expected a mapping with keys path, train and/or val")
    split = next((s for s in ("train", "val") if raw.get(s) not in (None, "", [])), None)
    if split is None:
        raise DatasetError(f"{where}: has neither a 'train' nor a 'val' split to calibrate on; add one "
                           "(e.g. train: images/train)")
    root = Path(str(raw["path"])).expanduser() if raw.get("path") not in (None, "") else Path(".")
    root = root if root.is_absolute() else path.parent / root
    return list_images(raw[split], root, split, where), f"{where}, split {split!r}"


# --- the entropy threshold ---------------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def _groups(bins: int, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """Candidate widths ``i`` (levels..bins) and, per candidate, the first bin of each of the
    ``levels`` groups (plus the end): bin ``j`` is in group ``floor(j * levels / i)``."""
    i = np.arange(levels, bins + 1, dtype=np.int64)
    g = np.arange(levels + 1, dtype=np.int64)
    return i, (g[None, :] * i[:, None] + levels - 1) // levels  # ceil(g * i / levels)


def entropy_threshold(hist: torch.Tensor | np.ndarray, bin_width: float, levels: int = QUANT_LEVELS) -> float:
    """TensorRT's KL-divergence threshold for a histogram of ``|x|`` (bin ``j`` covers
    ``[j w, (j+1) w)``): the ``i * w`` (``levels <= i <= bins``) whose clipped distribution ``P``
    (counts past bin ``i`` added to bin ``i-1``) is closest to its ``levels``-level quantization ``Q``
    (bins ``0..i-1`` merged into ``levels`` groups, each group's mass spread evenly over its
    non-empty bins). Ties go to the larger threshold.

    Vectorised over all candidates with cumulative sums: ``KL(P||Q) = sum p log p - sum p log q``,
    and both sums are group sums.
    """
    h = np.asarray(hist.cpu() if isinstance(hist, torch.Tensor) else hist, dtype=np.float64).ravel()
    n, total = h.size, float(h.sum())
    if n <= levels or total <= 0:
        return n * bin_width
    i, edges = _groups(n, levels)
    c = np.concatenate([[0.0], h.cumsum()])
    nz = np.concatenate([[0.0], (h > 0).cumsum(dtype=np.float64)])
    with np.errstate(divide="ignore", invalid="ignore"):
        hlogh = np.concatenate([[0.0], np.where(h > 0, h * np.log(h), 0.0).cumsum()])
        s = np.diff(c[edges], axis=1)  # Q's mass per group
        cnt = np.diff(nz[edges], axis=1)  # non-empty bins per group
        ci = c[i]
        # sum over a group's non-empty bins of p log q = s * log(s / cnt / ci); 0 for an empty group
        q_log = np.log(np.where(cnt > 0, s / np.maximum(cnt, 1.0), 1.0)) - np.log(ci)[:, None]
        outliers = total - ci
        p_last = h[i - 1] + outliers
        sum_p_logp = hlogh[i - 1] + np.where(p_last > 0, p_last * np.log(p_last), 0.0)
        sum_p_logq = np.einsum("kg,kg->k", s, q_log) + outliers * q_log[:, -1]
        kl = (sum_p_logp - sum_p_logq) / total - math.log(total)
    # outlier mass put into an empty last bin has no Q mass under it: infinite divergence
    kl = np.where((h[i - 1] == 0) & (outliers > 0), np.inf, kl)
    best = len(kl) - 1 - int(np.argmin(kl[::-1]))
    return float(i[best]) * bin_width


# --- ranges ------------------------------------------------------------------------------------
class _Observer:
    """One layer input: min/max in the first pass, a histogram in the second (percentile, entropy)."""

    def __init__(self) -> None:
        self.low, self.high = math.inf, -math.inf
        self.hist: torch.Tensor | None = None
        self.hist_low = self.hist_high = 0.0

    def see_range(self, x: torch.Tensor) -> None:
        x = x.detach()
        self.low = min(self.low, float(x.min()))
        self.high = max(self.high, float(x.max()))

    def start_hist(self, absolute: bool) -> None:
        self.absolute = absolute
        self.hist_low = 0.0 if absolute else self.low
        self.hist_high = max(abs(self.low), abs(self.high)) if absolute else self.high
        self.hist = torch.zeros(HIST_BINS, dtype=torch.float64)

    def see_hist(self, x: torch.Tensor) -> None:
        x = x.detach().float()
        x = x.abs() if self.absolute else x
        if self.hist_high <= self.hist_low:
            return
        self.hist += torch.histc(x, HIST_BINS, self.hist_low, self.hist_high).double().cpu()

    def result(self, method: str) -> tuple[float, float]:
        low, high = self.low, self.high
        if method == "percentile" and self.hist is not None and self.hist.sum() > 0:
            width = (self.hist_high - self.hist_low) / HIST_BINS
            cdf = self.hist.cumsum(0) / self.hist.sum()
            lo_bin = int(torch.searchsorted(cdf, (100.0 - PERCENTILE) / 100.0))
            hi_bin = int(torch.searchsorted(cdf, PERCENTILE / 100.0))
            low, high = self.hist_low + lo_bin * width, self.hist_low + (hi_bin + 1) * width
        elif method == "entropy" and self.hist is not None and self.hist.sum() > 0:
            t = entropy_threshold(self.hist, self.hist_high / HIST_BINS)
            low, high = max(low, -t), min(high, t)
        return min(low, 0.0), max(high, 0.0)


def collect_ranges(net: nn.Module, layers: dict[str, nn.Module], batches: Callable[[], Any],
                   method: str) -> dict[str, tuple[float, float]]:
    """``{layer name: (low, high)}`` of each layer's input over the batches ``batches()`` yields
    (called once per pass: one pass for minmax, two for the histogram methods)."""
    observers = {name: _Observer() for name in layers}

    def run(step: Callable[[_Observer, torch.Tensor], None]) -> None:
        handles = [m.register_forward_pre_hook(lambda _m, args, o=observers[n]: step(o, args[0]))
                   for n, m in layers.items()]
        try:
            with torch.no_grad():
                for batch in batches():
                    net(batch)
        finally:
            for h in handles:
                h.remove()

    run(_Observer.see_range)
    if method != "minmax":
        for o in observers.values():
            o.start_hist(absolute=method == "entropy")
        run(_Observer.see_hist)
    # a layer the forward never reached has no range: the caller leaves it in float
    return {n: o.result(method) for n, o in observers.items() if o.low != math.inf}
