"""Query-selection anchors and other per-shape constants, built once per shape on the device.

A DETR forward at a fixed input size must be capturable in a CUDA graph: no host tensors
created and copied in, no ``.item()``, no data-dependent shapes. Everything that depends only
on the input shape (anchors, their valid mask, the encoder's position embedding) is therefore
built with device ops the first time a shape is seen (the graph runner's warm-up does that
before capture) and reused from a small cache afterwards. While tracing, compiling or
exporting, the cache is bypassed: those graphs must own their constants and fake tensors must
never leak into eager calls.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch

from libreyolo.kernels.context import eager_only_ok

GRID_SIZE = 0.05
VALID_EPS = 1e-2


def make_anchors(shapes: Sequence[tuple[int, int]], *, grid_size: float = GRID_SIZE, eps: float = VALID_EPS,
                 device: torch.device | None = None, dtype: torch.dtype = torch.float32,
                 invalid: float = float("inf")) -> tuple[torch.Tensor, torch.Tensor]:
    """Anchors in logit space (1, sum H*W, 4) as (cx, cy, w, h), and their valid mask (1, N, 1).

    Level ``l`` has cell centres ``(x + 0.5) / W, (y + 0.5) / H`` and a box size of
    ``grid_size * 2**l``; anchors too close to the border are invalid and set to ``invalid``
    (+inf; DEIMv2 uses a finite 1e4, which saturates the sigmoid the same way).
    """
    levels = []
    for lvl, (h, w) in enumerate(shapes):
        gy, gx = torch.meshgrid(torch.arange(h, dtype=dtype, device=device),
                                torch.arange(w, dtype=dtype, device=device), indexing="ij")
        # dividing by a Python scalar rounds exactly like dividing by a one-element tensor
        xy = torch.stack([(gx + 0.5) / w, (gy + 0.5) / h], dim=-1)
        wh = torch.ones_like(xy) * grid_size * (2.0 ** lvl)
        levels.append(torch.cat([xy, wh], dim=-1).reshape(1, h * w, 4))
    anchors = torch.cat(levels, dim=1)
    valid = ((anchors > eps) & (anchors < 1 - eps)).all(-1, keepdim=True)
    anchors = torch.log(anchors / (1 - anchors))
    anchors = torch.where(valid, anchors, invalid)
    return anchors, valid


class ShapeCache:
    """A few device tensors per key (shape, device, dtype), built by a callback on first use."""

    def __init__(self, max_entries: int = 16) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple, build: Callable[[], Any]) -> Any:
        if not eager_only_ok():
            return build()
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                return hit
        value = build()
        with self._lock:
            self._entries[key] = value
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __deepcopy__(self, memo: dict) -> ShapeCache:
        return type(self)(self.max_entries)  # copies (inference copies, export) start empty


class LevelShapes(tuple):
    """(H, W) per level as Python ints (what the portable deformable path and exporters read),
    carrying its int64 device copy, made once, for kernel providers (see ``shapes_tensor``)."""

    _tensor: torch.Tensor | None

    def __new__(cls, shapes: Sequence[tuple[int, int]], device: torch.device | None = None) -> LevelShapes:
        obj = super().__new__(cls, (tuple(int(n) for n in s) for s in shapes))
        obj._tensor = None if device is None else torch.tensor(list(obj), dtype=torch.int64, device=device)
        return obj

    def as_tensor(self, device: torch.device) -> torch.Tensor:
        if self._tensor is None:
            return torch.tensor(list(self), dtype=torch.int64, device=device)
        return self._tensor if self._tensor.device == torch.device(device) else self._tensor.to(device)


class AnchorCache(ShapeCache):
    """Anchors and valid masks per (level shapes, device, dtype), and the level shapes themselves."""

    def level_shapes(self, shapes: Sequence[tuple[int, int]], device: torch.device) -> Sequence[tuple[int, int]]:
        if not eager_only_ok():
            return [tuple(s) for s in shapes]  # graphs for export own their constants
        return self.get(("shapes", tuple(shapes), str(device)), lambda: LevelShapes(shapes, device))

    def anchors(self, shapes: Sequence[tuple[int, int]], device: torch.device,
                dtype: torch.dtype = torch.float32, invalid: float = float("inf")) -> tuple[torch.Tensor, torch.Tensor]:
        key = (tuple(shapes), str(device), dtype, invalid)
        return self.get(key, lambda: make_anchors(shapes, device=device, dtype=dtype, invalid=invalid))
