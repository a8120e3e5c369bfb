"""What a predictor keeps and measures per call: its :class:`CallState` (call plans, pinned staging
buffers, frame sizes seen) and the :class:`StageClock` of one batch, and the progress bar of a run.
Each is usable alone (tests/test_call_plan.py, tests/test_predictor_parts.py)."""
from __future__ import annotations

import sys
import threading
import time
from collections import OrderedDict
from typing import Any

import torch

from libreyolo.engine.plan import PlanCache
from libreyolo.engine.stream import StagingPool


class CallState:
    """What a predictor keeps between calls in order to run them (a part of the model, testable alone):
    its call plans (:class:`~libreyolo.engine.plan.PlanCache`), its pinned staging buffers (made on
    first use: pinned memory is allocated only where a CUDA upload needs it) and the frame sizes
    seen (a size's letterbox goes inside the pipeline graph from its ``FRAMES_AFTER``-th batch).
    A copy of a model starts with its own, empty."""

    def __init__(self) -> None:
        self.plans = PlanCache()
        self.frame_sightings: OrderedDict[tuple, int] = OrderedDict()
        self._staging: StagingPool | None = None
        self._lock = threading.Lock()

    def staging(self) -> StagingPool:
        pool = self._staging
        if pool is None:
            with self._lock:
                if self._staging is None:
                    self._staging = StagingPool()
                pool = self._staging
        return pool

    def __deepcopy__(self, memo: dict[int, Any]) -> CallState:
        return CallState()


class StageClock:
    """Per-image ``preprocess`` / ``inference`` / ``postprocess`` times of one batch, honestly.

    Device work is asynchronous and the pipeline synchronises once, when postprocessing reads
    its results back, so host timestamps alone would charge the network's device time to
    postprocessing. On CUDA each boundary (:meth:`mark`) also records an event on the current
    stream; :meth:`speed` (called after the results are back, so it waits for nothing) gives
    ``inference`` and ``postprocess`` as device time between the events, and ``preprocess`` as
    the rest of the wall time since ``t0`` (decoding, upload, letterbox, reading back). Elsewhere
    the three are host time. With a whole-pipeline CUDA graph, the network and on-device
    postprocessing are one replay, counted as ``inference``; ``postprocess`` is then about 0.
    When the streaming pipeline overlaps batches, the wall-time share is approximate (the host
    enqueues one batch while another runs); the device times are the batch's own.
    """

    def __init__(self, device: torch.device, t0: float) -> None:
        self.t0 = t0
        self.cuda = device.type == "cuda"  # (no is_available(): 0.14 ms a call on the H200's host, per batch)
        self.marks: list[tuple[float, Any]] = []

    def mark(self) -> None:
        event = None
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        self.marks.append((time.perf_counter(), event))

    def speed(self, n: int, read_s: float = 0.0) -> dict[str, float]:
        """Per-image times once the batch is read back; ``read_s``: host seconds the read-back took
        (the marks are: preprocessing, network, postprocessing enqueued)."""
        (t1, e1), (t2, e2), (t3, e3) = self.marks[-3:]
        if self.cuda:
            e3.synchronize()  # complete, or nearly: the results were read back
            inference, post = e1.elapsed_time(e2), e2.elapsed_time(e3)
            pre = max(0.0, (t3 - self.t0 + read_s) * 1e3 - inference - post)
        else:
            pre, inference, post = (t1 - self.t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2 + read_s) * 1e3
        return {"preprocess": pre / n, "inference": inference / n, "postprocess": post / n}


def progress_bar(total: int | None, *, show: bool, auto: bool, unit: str = "img") -> Any:
    """A tqdm bar on stderr over ``total`` images or frames (None: a count and a rate only), or None.
    ``auto``: only on a terminal."""
    if not show:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, desc="predict", file=sys.stderr, disable=None if auto else False,
                dynamic_ncols=True)
