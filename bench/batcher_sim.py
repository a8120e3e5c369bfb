"""The Batcher's scheduling alone: closed-loop clients against a simulated device, on any machine.

    PYTHONPATH=. python3 bench/batcher_sim.py --json bench/results/<date>-batcher-sim-cpu.json

``serve_bench.py`` measures the real thing on a GPU; this separates what the Batcher's policy
(batch forming, padding, ``in_flight``) does to latency from what the host does (copies, the GIL,
stalls). The model's ``predict()`` is replaced by a simulation of one measured GPU size table
(``--table``: batch -> predict ms and replay ms, default: YOLOv9-t fp16 compiled graphs on the H200,
``bench/results/2026-12-04-serve27-h200-compiled-graphs.json``, batch 1 from
``2026-12-04-compile-graphs-h200.json``): the host part (predict - replay) split before and after
the replay, which holds one device lock (one GPU runs one batch at a time), everything in
``time.sleep`` (no CPU work, so the machine running this does not matter much), or with
``--host gil`` the host part as Python work that holds the GIL (a py-spy profile of the H200 run,
``2026-12-05-spy27-gil.txt``, found the workers holding it about 3.3 ms per batch). Requests go
through the real :class:`libreyolo.serve.Batcher` (decoding, options, grouping, padding).

Each setting runs twice: ``take all`` (every queued request of one option set, up to ``max_batch``:
the policy before batch times) and ``timed`` (the Batcher's: the count that runs the most images
per second by its measured batch times). Reported per row: requests/s, p50/p99/max latency in ms,
mean batch (``in_flight`` 2 unless a setting names it: the CUDA default before ``overlap``).
Prints a table and writes JSON.
The figures are a model: they say which policy leaves a tail on a device without stalls, not what
the H200 gives.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from report_json import write_json  # noqa: E402

# batch: (predict ms, replay ms), H200, YOLOv9-t fp16, compiled network in our graphs (see the docstring)
H200_COMPILED = {1: (2.93, 2.37), 2: (3.29, 2.48), 4: (3.54, 2.68), 8: (4.86, 3.55), 16: (7.12, 4.98),
                 32: (13.24, 9.60)}


def _spin(seconds: float) -> None:
    """Python work holding the GIL for ``seconds`` (released only at the interpreter's switch interval)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class SimulatedDevice:
    """``predict(images, batch=...)`` that takes the table's time for the padded batch size."""

    def __init__(self, table: dict[int, tuple[float, float]], host: str = "sleep") -> None:
        self.table = dict(sorted(table.items()))
        self.gpu = threading.Lock()
        self.wait = time.sleep if host == "sleep" else _spin  # "gil": the host part is Python work

    def cost(self, size: int) -> tuple[float, float]:
        size = next((s for s in self.table if s >= size), max(self.table))
        return self.table[size]

    def __call__(self, images: list[Any], **kw: Any) -> list[Any]:
        predict_ms, replay_ms = self.cost(len(images))
        host = max(0.0, predict_ms - replay_ms) / 2e3
        self.wait(host)  # upload, letterbox launch
        with self.gpu:
            time.sleep(replay_ms / 1e3)
        self.wait(host)  # read-back, Results
        return [None] * len(images)


def run(model: Any, device: SimulatedDevice, clients: int, requests: int, take_all: bool,
        **batcher_kw: Any) -> dict[str, Any]:
    from serve_bench import run_clients  # the same closed-loop client threads as the GPU benchmark

    from libreyolo.serve import Batcher

    frame = np.zeros((48, 64, 3), np.uint8)
    with Batcher(model, imgsz=64, **batcher_kw) as batcher:
        batcher._predict = lambda images, call, size: device(images)  # the simulated forward
        if take_all:  # the policy before batch times: every queued request, up to max_batch
            batcher._take = lambda queued: min(queued, batcher.max_batch)
        batcher.warmup(frame)
        wall, flat, _ = run_clients(batcher, [frame], clients, requests)
        stats = batcher.stats()
    return {"clients": clients, "requests": len(flat), "req_per_s": round(len(flat) / wall, 1),
            "p50_ms": round(float(np.percentile(flat, 50)), 2), "p99_ms": round(float(np.percentile(flat, 99)), 2),
            "max_ms": round(max(flat), 2), "mean_ms": round(statistics.fmean(flat), 2),
            "mean_batch": stats["mean_batch"], "batches_by_size": stats["batches_by_size"],
            "batch_ms_by_size": stats["batch_ms_by_size"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=128, help="per client")
    ap.add_argument("--settings", nargs="*", default=[
        "max_batch=32", "max_batch=32,in_flight=1", "max_batch=32,in_flight=3", "max_batch=16",
        "max_batch=16,in_flight=3"],
        help="Batcher keyword sets, e.g. max_batch=16,in_flight=2,max_wait_ms=2")
    ap.add_argument("--host", choices=("sleep", "gil"), default="sleep",
                    help="the host part of a batch (predict - replay ms) as a sleep or as Python work holding the GIL")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from libreyolo import LibreYOLO

    model = LibreYOLO("LibreYOLO9t.yaml")
    device = SimulatedDevice(H200_COMPILED, args.host)
    rows = []
    print(f"{'setting':<32} {'policy':<9} {'req/s':>8} {'p50':>7} {'p99':>7} {'max':>7} {'batch':>6}")
    for setting in args.settings:
        kw: dict[str, Any] = {"max_wait_ms": 2.0, "in_flight": 2}
        for item in filter(None, setting.split(",")):
            k, v = item.split("=")
            kw[k] = float(v) if k == "max_wait_ms" else int(v)
        for policy in ("take all", "timed"):
            row = {"setting": setting, "policy": policy,
                   **run(model, device, args.clients, args.requests, policy == "take all", **kw)}
            rows.append(row)
            print(f"{setting:<32} {policy:<9} {row['req_per_s']:>8.1f} {row['p50_ms']:>7.2f} {row['p99_ms']:>7.2f} "
                  f"{row['max_ms']:>7.2f} {row['mean_batch']:>6.2f}", flush=True)
    report = {"command": " ".join([sys.executable, *sys.argv]), "table_ms": H200_COMPILED, "host": args.host,
              "rows": rows}
    if args.json:
        write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
