"""``libreyolo benchmark``: predict() latency, eager and with CUDA graphs, on one model."""
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


def run_benchmark(model: Any, *, imgsz: int | None, batch: int, n: int, half: bool, cuda_graph: bool | str,
                  conf: float = 0.25) -> list[dict[str, Any]]:
    """Rows for eager and (when asked and possible) graph mode on random 480x640 frames."""
    frames = [(np.random.RandomState(i).rand(480, 640, 3) * 255).astype(np.uint8) for i in range(batch)]
    kw = {"imgsz": imgsz, "half": half, "conf": conf}
    rows = [{"mode": "eager", **time_predict(model, frames, n=n, warmup=5, desc="eager", **kw)}]
    if cuda_graph:
        rows.append({"mode": f"cuda_graph={cuda_graph}",
                     **time_predict(model, frames, n=n, warmup=5, desc=f"cuda_graph={cuda_graph}",
                                    cuda_graph=cuda_graph, **kw)})
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    head = f"{'mode':<18}{'predict ms':>12}{'pre':>9}{'infer':>9}{'post':>9}"
    lines = [head]
    for r in rows:
        lines.append(f"{r['mode']:<18}{r['predict_ms']:>12.2f}{r['preprocess_ms']:>9.2f}"
                     f"{r['inference_ms']:>9.2f}{r['postprocess_ms']:>9.2f}")
    if len(rows) == 2:
        lines.append(f"speed-up with graphs: {rows[0]['predict_ms'] / rows[1]['predict_ms']:.2f}x")
    return "\n".join(lines)
