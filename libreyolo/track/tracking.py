"""Multi-object tracking over ``predict()``'s Results: ``model.track(source, tracker="bytetrack")``.

The trackers are Roboflow's ``trackers`` package (Apache-2.0: SORT, ByteTrack, OC-SORT, BoT-SORT;
extra ``track``); this module only feeds them each frame's boxes and writes their ids back as
``Results.boxes.id``. Boxes that no confirmed track owns (a new object's first frames, a
low-confidence box no track matched) are left out of a tracked Results, as Ultralytics does.

State: each call gets a fresh tracker, unless ``persist=True``: then the tracker is kept on the
model, one per source (the path, URL or webcam index; every in-memory source shares one), so a
loop of ``model.track(frame, persist=True)`` continues its tracks and two videos tracked by one
model, even interleaved, never share identities. :meth:`Tracking.reset` forgets them.
Tracking needs boxes: the task plugin says whether its Results carry them (``Task.trackable``).
"""
from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from libreyolo.errors import ArgumentError, require
from libreyolo.track.options import TRACKERS

IN_MEMORY = "<in-memory>"  # the persist key of every source that is not a path, URL or webcam index


def source_key(source: Any) -> str:
    """The name tracks of ``source`` are kept under with ``persist=True``."""
    if isinstance(source, (str, Path)):
        return os.path.abspath(os.fspath(source)) if "://" not in os.fspath(source) else os.fspath(source)
    if isinstance(source, int) and not isinstance(source, bool):
        return f"webcam {source}"
    return IN_MEMORY


def new_tracker(name: str, fps: float | None) -> Any:
    """A fresh ``trackers`` tracker ``name`` for a video of ``fps`` frames/s (None: 30)."""
    trackers = require("trackers", "track", "track()")
    cls = getattr(trackers, TRACKERS[name])
    return cls(frame_rate=float(fps or 30.0))


def check_trackable(task: Any) -> None:
    if not task.trackable:
        raise ArgumentError(f"{task.name} models cannot be tracked: track() follows detection boxes "
                            "(detect models only); use predict()")


@dataclass
class Tracking:
    """The trackers a model keeps for ``persist=True``: {(tracker name, source key): tracker}."""

    kept: dict[tuple[str, str], Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def tracker_for(self, name: str, key: str, fps: float | None, persist: bool) -> Any:
        if not persist:
            return new_tracker(name, fps)
        with self.lock:
            if (name, key) not in self.kept:
                self.kept[(name, key)] = new_tracker(name, fps)
            return self.kept[(name, key)]

    def reset(self) -> None:
        with self.lock:
            self.kept.clear()


def tracked(results: Iterator[Any], tracker: Any, *, ahead: int = 1, threaded: bool = True) -> Iterator[Any]:
    """``results`` (one stream's, in frame order) with their boxes replaced by the tracked ones.

    The tracker runs off the critical path: frame N's update runs on a thread of its own while
    frame N+1 is predicted (the network's work releases the GIL), one frame after another in
    order, at most ``ahead`` frames behind the predictions: the same results as updating inline
    (one worker, in frame order). Each Results' ``speed["track"]`` is its update's milliseconds.
    An error of the tracker is raised at its frame, after the frames before it. ``threaded=False``
    (one image per call, e.g. a ``track(frame, persist=True)`` loop: nothing to overlap) updates inline."""
    if not threaded:
        for r in results:
            _timed_apply(tracker, r)
            yield r
        return
    pending: deque[tuple[Any, Future]] = deque()
    pool = ThreadPoolExecutor(1, thread_name_prefix="libreyolo-track")
    try:
        for r in results:
            pending.append((r, pool.submit(_timed_apply, tracker, r)))
            while len(pending) > ahead:
                done, update = pending.popleft()
                update.result()
                yield done
        while pending:
            done, update = pending.popleft()
            update.result()
            yield done
    finally:
        for _, update in pending:  # the caller stopped early: updates not begun are dropped
            update.cancel()
        pool.shutdown(wait=True)


def _timed_apply(tracker: Any, r: Any) -> None:
    t0 = time.perf_counter()
    apply(tracker, r)
    r.speed["track"] = (time.perf_counter() - t0) * 1e3


def apply(tracker: Any, r: Any) -> None:
    """Update ``tracker`` with one frame's boxes; ``r.boxes`` becomes the confirmed tracks' boxes with ids."""
    import supervision as sv

    from libreyolo.results import Boxes

    b = r.boxes
    cpu = b.cpu()
    dets = sv.Detections(xyxy=cpu.xyxy.numpy().astype(np.float32).reshape(-1, 4),
                         confidence=cpu.conf.numpy().astype(np.float32),
                         class_id=cpu.cls.numpy().astype(int))
    # fixed-rate mode (one step per call at the frame rate the tracker was made with, vid_stride included):
    # a persisted tracker then continues across calls whose timestamps start again from 0
    out = tracker.update(dets)
    ids = np.asarray(out.tracker_id if out.tracker_id is not None else [], dtype=np.int64)
    keep = ids >= 0
    device = b.xyxy.device

    def col(a: Any, dtype: torch.dtype) -> torch.Tensor:
        return torch.as_tensor(np.asarray(a)[keep], dtype=dtype).to(device)

    if len(out):
        r.boxes = Boxes(col(out.xyxy, b.xyxy.dtype).reshape(-1, 4), col(out.confidence, b.conf.dtype),
                        col(out.class_id, b.cls.dtype), b.orig_shape, col(ids + 1, torch.int64))
    else:
        empty = b.xyxy.new_zeros((0, 4))
        r.boxes = Boxes(empty, b.conf.new_zeros(0), b.cls.new_zeros(0), b.orig_shape,
                        torch.zeros(0, dtype=torch.int64, device=device))
