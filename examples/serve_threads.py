"""Serve one model from several threads, with CUDA graphs captured before the first request.

    python examples/serve_threads.py                       # untrained YOLOv9-t, 8 threads
    python examples/serve_threads.py --model LibreYOLO9t.pt --threads 16 --requests 400

Every request gets its own result even though all threads share one model and its graphs
(each graph's static buffers are locked per input shape; see docs/graphs.md). The script
checks that: each thread's detections are compared with a single-threaded eager run. Without a
CUDA GPU it serves eagerly (same results, slower) and says so.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

import numpy as np
import torch
from PIL import Image

from libreyolo import SAMPLE_IMAGE, LibreYOLO


def requests_images() -> list[np.ndarray]:
    """A few different RGB frames (the sample image, mirrored, flipped, cropped)."""
    base = np.asarray(Image.open(SAMPLE_IMAGE).convert("RGB"))
    return [np.ascontiguousarray(v) for v in (base, base[:, ::-1], base[::-1], base[40:440, 80:600])]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="LibreYOLO9t.yaml", help="checkpoint path or architecture yaml")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--requests", type=int, default=200, help="total requests over all threads")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--conf", type=float, default=0.25)
    args = ap.parse_args(argv)

    use_graphs = torch.cuda.is_available()
    model = LibreYOLO(args.model, device="cuda" if use_graphs else "cpu")
    if use_graphs:
        info = model.capture_graph(args.imgsz, batch=1)
        print(f"CUDA graph captured for input {info['shape']} {info['dtype']} in {info['capture_ms']:.0f} ms; "
              f"serving with cuda_graph=True from {args.threads} threads")
    else:
        print("No CUDA GPU here: serving eagerly (CUDA graphs need a CUDA device); results are the same, "
              f"only slower. {args.threads} threads")

    images = requests_images()
    expected = [model(img, imgsz=args.imgsz, conf=args.conf, color_format="rgb") for img in images]
    latencies: list[float] = []
    mismatches: list[str] = []
    lock = threading.Lock()
    per_thread = max(1, args.requests // args.threads)

    def serve(worker: int) -> None:
        mine = []
        for step in range(per_thread):
            i = (worker + step) % len(images)
            t0 = time.perf_counter()
            r = model(images[i], imgsz=args.imgsz, conf=args.conf, color_format="rgb", cuda_graph=use_graphs)
            mine.append((time.perf_counter() - t0) * 1e3)
            want = expected[i].boxes
            if not (torch.equal(r.boxes.xyxy, want.xyxy) and torch.equal(r.boxes.cls, want.cls)):
                with lock:
                    mismatches.append(f"thread {worker} request {step}: image {i}")
        with lock:
            latencies.extend(mine)

    start = time.perf_counter()
    threads = [threading.Thread(target=serve, args=(w,), name=f"server-{w}") for w in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start

    print(f"{len(latencies)} requests in {wall:.2f} s ({len(latencies) / wall:.1f} req/s); "
          f"latency median {statistics.median(latencies):.1f} ms, max {max(latencies):.1f} ms")
    if use_graphs:
        info = model.graph_info()
        replays = sum(g["replays"] for g in info["graphs"])
        print(f"graphs: {len(info['graphs'])} captured, {replays} replays, "
              f"{sum(f['count'] for f in info['eager_fallbacks'])} eager fallbacks")
    if mismatches:
        print(f"{len(mismatches)} requests got a result that differs from the eager run:", *mismatches[:5], sep="\n  ")
        return 1
    print("every request got its own correct result")
    return 0


if __name__ == "__main__":
    sys.exit(main())
