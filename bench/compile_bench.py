"""Latency of predict() with compile=True against eager and cuda_graph=True, end to end.

    PYTHONPATH=. python3 bench/compile_bench.py --json bench/results/<date>-compile-h200.json
    PYTHONPATH=. python3 bench/compile_bench.py --quick          # a smoke run on the CPU, in seconds

YOLOv9-t (untrained, 80 classes, with the class-bias prior of an untrained detector so that few
boxes pass ``conf``, as in bench/stream_bench.py; ``--model`` another checkpoint or architecture, e.g.
LibreRTDETRr34.yaml), fp16 on CUDA (``--fp32``: fp32; fp32 on the CPU), one host uint8
480x640 BGR frame per image (``predict(frame)`` at batch 1, ``predict([frame] * b, batch=b)``
above), ``workers=0`` (the plain path: one call is one batch). Rows, each on a fresh model:

- ``eager``: the eager inference copy (``cuda_graph=False``);
- ``graph``: ``cuda_graph=True`` (our CUDA graphs of the eager copy, whole pipeline where the family allows);
- ``compile:<mode>``: ``compile=<mode>`` with ``cuda_graph=False`` (torch.compile of the copy, validated
  against eager on the first call);
- ``graph+compile:<mode>``: ``compile=<mode>`` with ``cuda_graph=True``: our whole-pipeline graphs (the
  letterbox inside from the second batch of a frame size) holding the network compiled in the mode's
  counterpart without Inductor's CUDA graphs, validated against eager before the capture.

Reported per row: the first call's seconds (compilation, validation or capture included), then the
median and 90th percentile of ``--n`` timed calls after ``--warmup`` calls, in ms per call, and for
compile rows whether the compiled program serves (or the fallback reason) and its compile seconds
(``compile_info()``), and images per second (batch / median). Prints a table and writes JSON (device,
torch, command).
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import math
import os
import platform
import pstats
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def frame(h: int = 480, w: int = 640) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    base = (xx + yy // 2) % 256
    return np.stack([base, (base + 85) % 256, (base + 170) % 256], -1).astype(np.uint8)


def sparse_model(device: str, imgsz: int):
    """YOLOv9-t with the detection prior of an untrained detector (scores ~1e-3: little NMS work)."""
    from libreyolo import LibreYOLO

    model = LibreYOLO("LibreYOLO9t.yaml", device=device)
    with torch.no_grad():
        for seq, stride in zip(model.net.head.cv3, (8, 16, 32), strict=True):
            seq[-1].bias.fill_(math.log(5 / model.nc / (imgsz / stride) ** 2))
    return model


def cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) jiffies of the whole machine from /proc/stat (None where there is none)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def busy_cores(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """How many of the machine's cores were busy on average between two :func:`cpu_jiffies` readings."""
    if before is None or after is None or after[1] == before[1]:
        return None
    return round((after[0] - before[0]) / (after[1] - before[1]) * (os.cpu_count() or 1), 2)


def stop_compile_workers() -> bool:
    """End Inductor's pool of compile worker processes (it is started again by the next compilation)."""
    try:
        from torch._inductor.async_compile import shutdown_compile_workers
    except ImportError:
        return False
    shutdown_compile_workers()
    return True


def timed(call, cuda: bool) -> float:
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    call()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def run_row(name: str, batch: int, args: argparse.Namespace, cuda: bool) -> dict:
    if args.model:
        from libreyolo import LibreYOLO

        model = LibreYOLO(args.model, device=args.device)
    else:
        model = sparse_model(args.device, args.imgsz)
    if cuda and not args.fp32:
        model.half()
    graphed, _, mode = name.partition("compile:")
    kw = {"imgsz": args.imgsz, "workers": 0, "cuda_graph": name.startswith("graph")}
    if mode:
        model.compile(mode)
    img = frame()
    source = img if batch == 1 else [img] * batch
    if batch > 1:
        kw["batch"] = batch

    def call():
        model.predict(source, **kw)

    first = timed(call, cuda)
    stopped = bool(mode) and args.stop_compile_workers and stop_compile_workers()
    for _ in range(args.warmup):
        call()
    gc_ms: list[float] = []
    started: list[float] = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            gc_ms.append((time.perf_counter() - started.pop()) * 1e3)

    gc.callbacks.append(on_gc)
    jiffies = cpu_jiffies()
    try:
        times = sorted(timed(call, cuda) * 1e3 for _ in range(args.n))
    finally:
        gc.callbacks.remove(on_gc)
    machine_busy = busy_cores(jiffies, cpu_jiffies())
    row = {"row": name, "batch": batch, "first_call_s": round(first, 3),
           "median_ms": round(statistics.median(times), 3),
           "p90_ms": round(times[min(len(times) - 1, int(0.9 * len(times)))], 3), "n": args.n}
    row["images_per_s"] = round(batch / row["median_ms"] * 1e3, 1)
    row["gc"] = {"collections": len(gc_ms), "ms": round(sum(gc_ms), 3), "objects": len(gc.get_objects())}
    row["threads"] = {"torch": torch.get_num_threads(), "affinity": len(os.sched_getaffinity(0))}
    row["machine_busy_cores"] = machine_busy  # this process and any other (e.g. Inductor's compile workers)
    if mode:
        row["compile_workers_stopped"] = stopped
    if args.profile:  # where the host time of a call goes (cProfile of 20 calls, own time)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(20):
            timed(call, cuda)
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(14)
        row["profile"] = text.getvalue().split("ncalls", 1)[-1]
    if mode:
        info = model.compile_info()
        entry = info["copies"][0] if info["copies"] else {}
        row.update({"mode": entry.get("mode"), "compiled": entry.get("compiled"), "fallback": entry.get("fallback"),
                    "compile_s": entry.get("compile_seconds"),
                    "validate_s": round(sum(x["validate_seconds"] for x in entry.get("shapes", [])), 3),
                    "inductor_cuda_graphs": entry.get("inductor_cuda_graphs"), "calls": entry.get("calls")})
    if kw["cuda_graph"]:
        row["graphs"] = sorted(g["program"] for g in model.graph_info()["graphs"])
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, help="write results here")
    ap.add_argument("--quick", action="store_true", help="CPU smoke run: fp32, imgsz 64, batch 1, few calls")
    ap.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--model", default=None,
                    help="checkpoint or architecture yaml (default: the untrained YOLOv9-t with the detection prior)")
    ap.add_argument("--fp32", action="store_true", help="fp32 on CUDA too (default there: fp16)")
    ap.add_argument("--batches", default="1,8", help="comma-separated batch sizes")
    ap.add_argument("--rows", default="eager,graph,compile:default,compile:reduce-overhead",
                    help="comma-separated rows: eager, graph, compile:<mode>, graph+compile:<mode>")
    ap.add_argument("--n", type=int, default=200, help="timed calls per row")
    ap.add_argument("--stop-compile-workers", action="store_true",
                    help="end Inductor's compile worker processes after a compile row's first call")
    ap.add_argument("--profile", action="store_true", help="per row: cProfile of 20 more calls (own time) in the JSON")
    ap.add_argument("--warmup", type=int, default=20, help="untimed calls per row after the first")
    args = ap.parse_args(argv)
    if args.quick:
        args.device, args.imgsz, args.batches, args.n, args.warmup = "cpu", 64, "1", 5, 2
        args.rows = "eager,compile:default"
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = args.device.startswith("cuda")
    rows_wanted = [r.strip() for r in args.rows.split(",") if r.strip()]
    if not cuda:
        rows_wanted = [r for r in rows_wanted if not r.startswith("graph")]  # CUDA graphs need CUDA
    env = {"device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
           "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
           "cpus": __import__("os").cpu_count(), "command": " ".join(["python3", *sys.argv]),
           "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "json"}}
    rows: list[dict] = []
    precision = "fp16" if cuda and not args.fp32 else "fp32"
    result = {**env, "precision": precision, "imgsz": args.imgsz, "rows": rows}
    for b in (int(x) for x in args.batches.split(",")):
        for name in rows_wanted:
            row = run_row(name, b, args, cuda)
            rows.append(row)
            print("row " + json.dumps(row), flush=True)
            if args.json:  # rewritten after every row: a run cut short keeps what it measured
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{args.model or 'YOLOv9-t'} {precision} imgsz {args.imgsz}, predict(one 480x640 uint8 frame per image), "
          f"workers=0 ({env['device']}, torch {env['torch']})")
    print(f"{'batch':>5} | {'row':<24} | {'first call s':>12} | {'median ms':>9} | {'p90 ms':>8} | {'img/s':>7} | "
          f"{'x eager':>7} | compiled")
    eager = {r["batch"]: r["median_ms"] for r in rows if r["row"] == "eager"}
    for r in rows:
        base = eager.get(r["batch"])
        state = "" if "compiled" not in r else ("yes" if r["compiled"] else f"no: {r['fallback']}")
        speedup = f"{base / r['median_ms']:.2f}" if base else "-"
        print(f"{r['batch']:>5} | {r['row']:<24} | {r['first_call_s']:>12} | {r['median_ms']:>9} | "
              f"{r['p90_ms']:>8} | {r['images_per_s']:>7} | {speedup:>7} | {state} "
              f"(busy cores {r['machine_busy_cores']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
