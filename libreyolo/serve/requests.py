"""What the :class:`~libreyolo.serve.Batcher` queues and runs: a request, a batch started by an
overlapping worker, the grouping key of a request's options and the default padded sizes."""
from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Request:
    """One caller's image, decoded, with its checked options and the Future it waits on."""

    image: Any                      # an HWC uint8 array (its channel order in ``call``) or a CHW tensor
    path: str | None
    key: tuple                      # the options that change the computation, canonical and hashable
    call: dict[str, Any]            # those options, as predict() keywords
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    t_submit: float = field(default_factory=time.perf_counter)


@dataclass(eq=False)
class Launched:
    """A batch started by an overlapping worker: ``finish`` reads it back (None: starting it raised)."""

    group: list[Request]
    size: int
    start: float
    finish: Any
    event: Any = None       # a CUDA event recorded after the batch's work (None: done when started)
    host_s: float = 0.0     # host seconds spent starting it

    def ready(self) -> bool:
        return self.event is None or bool(self.event.query())


def hashable(value: Any) -> Any:
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value) if isinstance(value, (set, frozenset)) else value
        return tuple(hashable(v) for v in items)
    if isinstance(value, Mapping):
        return tuple(sorted((k, hashable(v)) for k, v in value.items()))
    return value


def default_batch_sizes(max_batch: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``max_batch`` (which is included even when not a power of two)."""
    sizes, n = [], 1
    while n < max_batch:
        sizes.append(n)
        n *= 2
    return (*sizes, max_batch)
