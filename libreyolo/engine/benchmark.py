"""predict() latency of one model, synchronised, with stage medians (the timing of ``libreyolo benchmark``,
:mod:`libreyolo.engine.benchmark_formats`)."""
from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import numpy as np
import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _bar(total: int, desc: str) -> Any:
    """A progress bar on stderr (terminals only; shown after a second), for long CPU runs."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="call", file=sys.stderr, disable=None, delay=1.0, leave=False)


def time_predict(model: Any, frames: list[np.ndarray], *, n: int, warmup: int, desc: str = "predict",
                 **kw: Any) -> dict[str, float]:
    """Median wall time of ``model.predict(frames, **kw)`` per call, synchronised, plus stage medians.
    All frames go through one forward (``batch=len(frames)``), whatever predict()'s default batch."""
    kw.setdefault("batch", len(frames))
    with _bar(warmup + n, desc) as bar:
        for _ in range(warmup):
            model.predict(frames, **kw)
            bar.update()
        _sync(model.device)
        total, pre, inf, post = _timed_calls(model, frames, n, bar, kw)
    med = statistics.median
    return {"predict_ms": med(total), "preprocess_ms": med(pre), "inference_ms": med(inf), "postprocess_ms": med(post)}


def _timed_calls(model: Any, frames: list[np.ndarray], n: int, bar: Any,
                 kw: dict[str, Any]) -> tuple[list[float], ...]:
    total, pre, inf, post = [], [], [], []
    for _ in range(n):
        t = time.perf_counter()
        out = model.predict(frames, **kw)
        _sync(model.device)
        total.append((time.perf_counter() - t) * 1e3)
        r = out[0] if isinstance(out, list) else out
        pre.append(r.speed["preprocess"] * len(frames))
        inf.append(r.speed["inference"] * len(frames))
        post.append(r.speed["postprocess"] * len(frames))
        bar.update()
    return total, pre, inf, post
