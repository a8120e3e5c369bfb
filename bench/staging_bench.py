"""Packing frames into a staging buffer: torch's ``copy_`` against our ``pack()``, on an idle and a busy host.

    PYTHONPATH=. python3 bench/staging_bench.py --json bench/results/<date>-staging-<machine>.json
    PYTHONPATH=. python3 bench/staging_bench.py --quick      # seconds

Before a batch of 8-bit frames is uploaded, ``predict()`` packs them into one staging buffer
(``libreyolo.engine.stream.stage``). Rows, per batch size (480x640x3 uint8 frames, one buffer):

- ``torch copy_``: ``buffer[off:off + n].copy_(frame)`` per frame, what the staging did before: torch
  runs a large copy as a parallel region of all its intra-op threads;
- ``pack``: :func:`libreyolo.engine.stream.pack`, numpy copies (the GIL released), split over a few
  pool threads above ``PACK_PART_BYTES``.

Each row is timed ``--n`` times on an idle host, then again while ``--busy`` processes (default: one
per CPU) spin on the CPUs, the situation of a serving process beside client threads, Inductor's
compile workers or another job. Reported: median, 99th percentile and maximum in microseconds, and
that the buffer holds the same bytes. On a CUDA machine the buffer is pinned, as the staging pool's is.

Then the host half of the streaming pipeline from JPEG files (``--jpegs`` 480x640 frames, quality 90):
the folder decoded in batches of 32 on ``--workers`` threads (``Sources.batches``, as the feeder thread
runs it) and each batch packed by either method; images per second, median of 3 passes (no device
work: the ceiling the decode and pack put on ``predict(folder, stream=True)``). Prints tables and
writes JSON (CPU, torch, threads, command).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from report_json import write_json  # noqa: E402

from libreyolo.engine.stream import pack  # noqa: E402


def spin(stop: Any) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(10_000):
            x += 1


def torch_copy(buffer: torch.Tensor, parts: list[tuple[torch.Tensor, int]]) -> None:
    for pixels, off in parts:
        buffer[off:off + pixels.numel()].copy_(pixels.view(-1))


def time_it(fn, buffer: torch.Tensor, parts: list[tuple[torch.Tensor, int]], n: int) -> dict[str, float]:
    walls = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn(buffer, parts)
        walls.append((time.perf_counter() - t0) * 1e6)
    return {"median_us": round(statistics.median(walls), 1), "p99_us": round(float(np.percentile(walls, 99)), 1),
            "max_us": round(max(walls), 1)}


def feeder_rows(count: int, workers: str, pin: bool) -> list[dict[str, Any]]:
    """Images/s of decoding a JPEG folder in batches of 32 and packing each batch, per method and workers."""
    import tempfile

    from PIL import Image

    from libreyolo import SAMPLE_IMAGE
    from libreyolo.data.sources import open_sources
    from libreyolo.engine.stream import StagingPool, stageable

    base = np.asarray(Image.open(SAMPLE_IMAGE).convert("RGB").resize((640, 480)))
    rows = []
    print(f"\n{'workers':>7} {'method':<12} {'images/s':>9}  (decode {count} JPEG files in batches of 32, pack)")
    with tempfile.TemporaryDirectory() as folder:
        for i in range(count):
            Image.fromarray(np.roll(base, 8 * i, axis=1)).save(f"{folder}/{i:05d}.jpg", quality=90)
        for w in (int(v) for v in workers.split(",")):
            for method, fn in (("torch copy_", torch_copy), ("pack", pack)):
                pool, passes = StagingPool(pin=pin), []
                for _ in range(4):  # a warm-up pass, then 3 timed
                    t0 = time.perf_counter()
                    for chunk in open_sources(folder).batches(32, skip_unreadable=False, workers=w):
                        parts, total = [], 0
                        for img in chunk:
                            if stageable(img):
                                parts.append((img.pixels, total))
                                total += -(-img.pixels.numel() // 256) * 256
                        slot = pool.acquire(total)
                        fn(slot.buffer, parts)
                        pool.release(slot, None)
                    passes.append(time.perf_counter() - t0)
                rate = count / statistics.median(passes[1:])
                rows.append({"workers": w, "method": method, "images_per_s": round(rate, 1)})
                print(f"{w:>7} {method:<12} {rate:>9.1f}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,8,32", help="comma list of batch sizes")
    ap.add_argument("--n", type=int, default=200, help="timed calls per row")
    ap.add_argument("--busy", type=int, default=None, help="spinning processes in the busy rows (default: CPUs)")
    ap.add_argument("--jpegs", type=int, default=512, help="JPEG files for the decode-and-pack rows (0: none)")
    ap.add_argument("--workers", default="4", help="comma list of decode thread counts for those rows")
    ap.add_argument("--quick", action="store_true", help="batches 1,8, 30 calls, 64 JPEG files")
    ap.add_argument("--json", default=None, help="JSON path to write")
    args = ap.parse_args(argv)
    batches = [1, 8] if args.quick else [int(b) for b in args.batches.split(",")]
    n = 30 if args.quick else args.n
    if args.quick:
        args.jpegs = min(args.jpegs, 64)
    busy = args.busy if args.busy is not None else os.cpu_count() or 1
    rng = np.random.default_rng(0)
    frames = [torch.from_numpy(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)) for _ in range(max(batches))]
    pin = torch.cuda.is_available()
    rows = []
    print(f"{'host':<6} {'batch':>5} {'method':<12} {'median us':>10} {'p99 us':>10} {'max us':>10}")
    for host in ("idle", "busy"):
        stop, procs = mp.Event(), []
        if host == "busy":
            procs = [mp.Process(target=spin, args=(stop,), daemon=True) for _ in range(busy)]
            for p in procs:
                p.start()
            time.sleep(0.5)
        try:
            for b in batches:
                size = frames[0].numel()
                parts = [(frames[i], i * size) for i in range(b)]
                buffers = {m: torch.zeros(b * size, dtype=torch.uint8, pin_memory=pin) for m in ("torch", "pack")}
                timings = {"torch copy_": time_it(torch_copy, buffers["torch"], parts, n),
                           "pack": time_it(pack, buffers["pack"], parts, n)}
                same = bool(torch.equal(buffers["torch"], buffers["pack"]))
                for method, t in timings.items():
                    rows.append({"host": host, "batch": b, "method": method, **t, "same_bytes": same})
                    print(f"{host:<6} {b:>5} {method:<12} {t['median_us']:>10.1f} {t['p99_us']:>10.1f} "
                          f"{t['max_us']:>10.1f}", flush=True)
        finally:
            stop.set()
            for p in procs:
                p.join()
    feeder = feeder_rows(args.jpegs, args.workers, pin) if args.jpegs else []
    report = {"command": " ".join([sys.executable, *sys.argv]), "cpu": platform.processor() or platform.machine(),
              "cpus": os.cpu_count(), "torch": torch.__version__, "intra_op_threads": torch.get_num_threads(),
              "pinned": pin, "busy_processes": busy, "timed_calls": n, "rows": rows, "feeder": feeder}
    if args.json:
        write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
