"""Serving throughput: the micro-batching Batcher against one request per forward, under N client threads.

    PYTHONPATH=. python3 bench/serve_bench.py --out bench/results/<date>-serve-h200.json            # CUDA, graphs
    PYTHONPATH=. python3 bench/serve_bench.py --half --out ...                                       # fp16
    PYTHONPATH=. python3 bench/serve_bench.py --quick --out /tmp/serve-smoke.json                    # CPU smoke

Each of ``--clients`` threads sends ``--requests`` single-image requests back to back (a closed
loop: a client sends its next request when the last one is answered). Modes:

- ``lock``: every request is one ``model.predict(image)`` under a lock (one forward per request;
  the lock is what a thread-safe single-model server needs to keep requests from interleaving);
- ``batcher``: ``libreyolo.serve.Batcher(model, max_batch, max_wait_ms)``, which coalesces the
  waiting requests into one forward padded to a power of two.

Both run ``cuda_graph=True`` on CUDA (graphs captured during the warm-up: batch 1 for ``lock``,
every padded size for ``batcher``). Reported per mode and client count: throughput (requests/s),
latency p50/p99 (ms, from submit to result), and for the batcher the mean batch and queue wait.
``exact``: the share of requests whose boxes equal (``torch.equal``) a direct single ``predict()``
of the same image, and the largest box-coordinate difference where the counts agree (a batched
forward may round differently from a single one: see README, "Serving"); ``own``/``set gap``: the
same order-free; ``b-exact``: the share bit-identical to their own image's result in a batch of one
of the padded sizes (a batch of copies of it): below 1.0 would mean a result that depends on its
neighbours in the batch, or was handed to the wrong caller. Targets at 32 clients:
batcher throughput >= 4x lock, batcher p99 < 25 ms.
"""
from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from libreyolo import SAMPLE_IMAGE, LibreYOLO  # noqa: E402
from libreyolo.serve import Batcher  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from compile_bench import busy_cores, cpu_jiffies, stop_compile_workers  # noqa: E402
from report_json import write_json  # noqa: E402


def frames(n: int = 8) -> list[np.ndarray]:
    """``n`` distinct BGR frames of one size (the sample image, flipped, shifted, with noise)."""
    from PIL import Image

    base = np.asarray(Image.open(SAMPLE_IMAGE).convert("RGB").resize((640, 480)))[:, :, ::-1]
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        f = base[:, ::-1] if i % 2 else base
        f = np.roll(f, 16 * i, axis=1)
        noise = rng.integers(-8, 9, size=f.shape, dtype=np.int16)
        out.append(np.clip(f.astype(np.int16) + noise, 0, 255).astype(np.uint8))
    return out


def run_clients(call, images: list[np.ndarray], clients: int, requests: int) -> tuple[float, list[float], list]:
    """(wall seconds, latencies in ms, (image index, result) pairs) of ``clients`` closed-loop threads."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    outputs: list[list] = [[] for _ in range(clients)]
    start = threading.Barrier(clients + 1)

    def client(c: int) -> None:
        start.wait()
        for r in range(requests):
            i = (c + r) % len(images)
            t0 = time.perf_counter()
            result = call(images[i])
            latencies[c].append((time.perf_counter() - t0) * 1e3)
            outputs[c].append((i, result))

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, [x for lat in latencies for x in lat], [x for out in outputs for x in out]


def _gap(a, b) -> float:
    """Largest distance (px, max over coordinates) from a box of ``a`` to the nearest box of ``b`` of its
    class; inf when one has a box whose class the other lacks, 0 for two empty sets."""
    xa, ca = a.xyxy.float().cpu(), a.cls.cpu()
    xb, cb = b.xyxy.float().cpu(), b.cls.cpu()
    if not len(xa) or not len(xb):
        return 0.0 if len(xa) == len(xb) else math.inf
    d = (xa[:, None] - xb[None]).abs().amax(-1)  # (n, m) box-to-box distances
    d[ca[:, None] != cb[None]] = math.inf          # only boxes of the same class count
    return float(max(d.amin(1).max(), d.amin(0).max()))


def exactness(outputs: list, reference: list) -> dict[str, Any]:
    """``exact``: share of results bit-identical to a direct single predict() of the same image;
    ``own``: share whose boxes are nearer (as sets, order-free) to their own image's direct result
    than to any other image's (below 1: results handed to the wrong caller); ``max_set_gap``: the
    largest order-free box distance (px) from a result to its own image's direct result (inf: a
    box of a class the other lacks, e.g. an NMS decision flipped); ``max_box_diff``: index-wise,
    where the counts agree (large when two near-equal scores swap order)."""
    exact = own = 0
    worst = gap = 0.0
    for i, r in outputs:
        want, got = reference[i].boxes, r.boxes
        if all(torch.equal(getattr(got, k), getattr(want, k)) for k in ("xyxy", "conf", "cls")):
            exact += 1
        elif got.xyxy.shape == want.xyxy.shape:
            worst = max(worst, float((got.xyxy - want.xyxy).abs().max()) if got.xyxy.numel() else 0.0)
        gaps = [_gap(got, ref.boxes) for ref in reference]
        own += gaps[i] <= min(gaps)
        gap = max(gap, gaps[i])
    n = len(outputs)
    return {"exact": round(exact / n, 4), "own": round(own / n, 4), "max_set_gap": gap, "max_box_diff": worst}


def batched_exactness(outputs: list, by_size: dict, sizes: tuple[int, ...]) -> float:
    """Share of results bit-identical to their own image's result at one of the padded batch sizes."""
    def equal(a, b) -> bool:
        return all(torch.equal(getattr(a.boxes, k), getattr(b.boxes, k)) for k in ("xyxy", "conf", "cls"))

    return round(sum(any(equal(r, by_size[(i, s)]) for s in sizes) for i, r in outputs) / len(outputs), 4)


def pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="LibreYOLO9t.yaml", help="checkpoint, architecture yaml or artifact")
    ap.add_argument("--imgsz", type=int, default=None, help="default: the model's (640 for yolo9-t)")
    ap.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    ap.add_argument("--half", action="store_true", help="fp16 (CUDA)")
    ap.add_argument("--no-graph", action="store_true", help="eager forwards even on CUDA")
    ap.add_argument("--clients", default="1,8,32,64", help="comma list of client thread counts")
    ap.add_argument("--requests", type=int, default=64, help="requests per client")
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--max-wait-ms", type=float, default=2.0)
    ap.add_argument("--in-flight", type=int, default=1, help="Batcher in_flight")
    ap.add_argument("--overlap", default=None, choices=("true", "false"),
                    help="Batcher overlap (default: its own, on on CUDA)")
    ap.add_argument("--configs", default=None,
                    help="Batcher settings to run in turn in this one process, as IN_FLIGHT:MAX_WAIT_MS pairs, "
                         "':o' after one for overlap=True (without: overlap=False), e.g. '1:5,2:2,1:5:o' (default: "
                         "--in-flight, --max-wait-ms and --overlap); one compile and capture for all")
    ap.add_argument("--batch-sizes", default=None,
                    help="comma list of padded batch sizes, or 'all' (1 to max batch; default: powers of two)")
    ap.add_argument("--letterbox-outside", action="store_true",
                    help="letterbox outside the whole-pipeline graph (the path before frames went into it)")
    ap.add_argument("--size-table", action="store_true",
                    help="first: median predict() time and graph replay time per padded batch size")
    ap.add_argument("--switch-interval-ms", type=float, default=None,
                    help="sys.setswitchinterval for the run (Python's default: 5 ms between forced GIL hand-offs)")
    ap.add_argument("--modes", default="lock,batcher", help="comma list of modes to run (lock, batcher)")
    ap.add_argument("--compile", default=None,
                    help="model.compile(MODE) after the eager reference: the graphs hold the compiled network")
    ap.add_argument("--stop-compile-workers", action="store_true",
                    help="with --compile: end Inductor's compile workers after each warm-up (the Batcher's does)")
    ap.add_argument("--conf", type=float, default=0.25)
    ap.add_argument("--quick", action="store_true", help="CPU smoke run: imgsz 160, 1 and 4 clients, 6 requests")
    ap.add_argument("--out", required=True, help="JSON path to write")
    args = ap.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.letterbox_outside:
        import libreyolo.engine.pipeline as pipeline_module

        pipeline_module.FRAMES_IN_GRAPH = False
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1e3)
    clients = [int(c) for c in args.clients.split(",")]
    configs = [(args.in_flight, args.max_wait_ms, None if args.overlap is None else args.overlap == "true")]
    if args.configs:  # IN_FLIGHT:MAX_WAIT_MS is without overlap, IN_FLIGHT:MAX_WAIT_MS:o with it
        configs = [(int(a), float(b), rest == ["o"]) for a, b, *rest in (c.split(":") for c in args.configs.split(","))]
    requests, imgsz = args.requests, args.imgsz
    if args.quick:
        clients, requests, imgsz = [1, 4], 6, imgsz or 160
        args.max_batch = min(args.max_batch, 4)
    cuda = device.startswith("cuda")
    graph = cuda and not args.no_graph

    model = LibreYOLO(args.model, device=device)
    kw: dict[str, Any] = {"imgsz": imgsz or model.imgsz, "conf": args.conf, "half": args.half or None}
    if graph:
        kw["cuda_graph"] = True
    images = frames()
    reference = [model(f, **{k: v for k, v in kw.items() if k != "cuda_graph"}) for f in images]  # eager, single
    if args.compile:  # after the reference: "exact" then says how often the compiled graphs give eager's boxes
        model.compile(True if args.compile == "true" else args.compile)
    # what each image gives in a batch of each padded size (a batch of copies of it): a batched result must be
    # one of its own image's, bit for bit, whatever its neighbours (each image's outputs are computed alone)
    from libreyolo.serve.batcher import default_batch_sizes

    if args.batch_sizes == "all":
        sizes = tuple(range(1, args.max_batch + 1))
    elif args.batch_sizes:
        sizes = tuple(int(v) for v in args.batch_sizes.split(","))
    else:
        sizes = default_batch_sizes(args.max_batch)
    size_table = []
    if args.size_table:
        print(f"{'batch':>5} {'predict ms':>10} {'replay ms':>9} {'ms/img':>7}")
        for s in sizes:
            batch_in = [images[k % len(images)] for k in range(s)]
            for _ in range(3):
                model.predict(batch_in, batch=s, workers=0, **kw)
            if args.compile and args.stop_compile_workers:
                stop_compile_workers()  # this size compiled: its workers would slow the timing
            walls, replays = [], []
            for _ in range(15):
                t0 = time.perf_counter()
                out = model.predict(batch_in, batch=s, workers=0, **kw)
                walls.append((time.perf_counter() - t0) * 1e3)
                replays.append(out[0].speed["inference"] * s)
            row = {"batch": s, "predict_ms": round(statistics.median(walls), 3),
                   "replay_ms": round(statistics.median(replays), 3)}
            size_table.append(row)
            per_image = row["predict_ms"] / s
            print(f"{s:>5} {row['predict_ms']:>10.2f} {row['replay_ms']:>9.2f} {per_image:>7.3f}", flush=True)
    by_size = {(i, s): model.predict([f] * s, batch=s, workers=0, **kw)[0] for i, f in enumerate(images) for s in sizes}

    lock = threading.Lock()

    def locked(image: np.ndarray) -> Any:
        with lock:
            return model(image, **kw)

    rows = []
    print(f"{'mode':<8} {'clients':>7} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'batch':>6} {'wait ms':>8} "
          f"{'exact':>6} {'own':>5} {'set gap':>8} {'max diff':>9} {'b-exact':>7}")
    runs = [(mode, cfg) for mode in args.modes.split(",") for cfg in (configs if mode == "batcher" else [None])]
    for n in clients:
        for mode, cfg in runs:
            batcher = None
            if mode == "lock":
                call = locked
                for f in images[:3]:  # warm-up (captures the batch-1 graph)
                    locked(f)
                if args.compile and args.stop_compile_workers:
                    stop_compile_workers()  # as the Batcher's warm-up does
            else:
                batcher = Batcher(model, max_batch=args.max_batch, max_wait_ms=cfg[1], device=device,
                                  in_flight=cfg[0], overlap=cfg[2], batch_sizes=sizes, **kw)
                batcher.warmup(images[0])  # every padded size once: graphs captured before timing
                call = batcher.predict  # (its warm-up ended Inductor's compile workers on a compiled model)
            if cuda:
                torch.cuda.synchronize()
            jiffies = cpu_jiffies()
            wall, latencies, outputs = run_clients(call, images, n, requests)
            machine_busy = busy_cores(jiffies, cpu_jiffies())
            stats = batcher.stats() if batcher else {}
            if batcher:
                batcher.close()
            row = {"mode": mode, "clients": n, "requests": len(latencies), "req_per_s": round(len(latencies) / wall, 2),
                   "p50_ms": pct(latencies, 50), "p99_ms": pct(latencies, 99),
                   "mean_ms": round(statistics.fmean(latencies), 3), **exactness(outputs, reference),
                   "batched_exact": batched_exactness(outputs, by_size, sizes), "machine_busy_cores": machine_busy}
            if batcher:
                row.update(in_flight=stats["in_flight"], max_wait_ms=stats["max_wait_ms"], overlap=stats["overlap"])
                row.update(mean_batch=stats["mean_batch"], queue_wait_ms_mean=stats["queue_wait_ms_mean"],
                           batches_by_size=stats["batches_by_size"], batch_ms_by_size=stats["batch_ms_by_size"])
            rows.append(row)
            label = mode if not batcher else f"b{stats['in_flight']}/{stats['max_wait_ms']:g}{'o' * stats['overlap']}"
            print(f"{label:<8} {n:>7} {row['req_per_s']:>9.1f} {row['p50_ms']:>8.2f} {row['p99_ms']:>8.2f} "
                  f"{row.get('mean_batch') or 1:>6.2f} {row.get('queue_wait_ms_mean') or 0:>8.2f} "
                  f"{row['exact']:>6.2f} {row['own']:>5.2f} {row['max_set_gap']:>8.2e} {row['max_box_diff']:>9.2e} "
                  f"{row['batched_exact']:>7.2f}", flush=True)

    targets = {}
    lock32 = next((r for r in rows if r["mode"] == "lock" and r["clients"] == 32), None)
    for r in [r for r in rows if r["mode"] == "batcher" and r["clients"] == 32] if lock32 else []:
        speedup = r["req_per_s"] / lock32["req_per_s"]
        key = f"in_flight={r['in_flight']},max_wait_ms={r['max_wait_ms']:g}" + (",overlap" if r["overlap"] else "")
        targets[key] = {"speedup_at_32_clients": round(speedup, 2), "speedup_goal": 4.0,
                        "speedup_met": speedup >= 4.0, "batcher_p99_ms_at_32_clients": r["p99_ms"],
                        "p99_goal_ms": 25.0, "p99_met": r["p99_ms"] < 25.0}
        print(f"32 clients [{key}]: batcher {speedup:.2f}x lock (goal >= 4x), p99 {r['p99_ms']:.2f} ms (goal < 25 ms)")
    report = {
        "command": " ".join([sys.executable, *sys.argv]),
        "model": args.model, "device": device,
        "gpu": torch.cuda.get_device_name(torch.device(device)) if cuda else None,
        "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
        "threads": torch.get_num_threads(), "settings": {**{k: v for k, v in kw.items()}, "max_batch": args.max_batch,
                                                          "max_wait_ms": args.max_wait_ms, "configs": configs,
                                                          "requests_per_client": requests, "quick": args.quick,
                                                          "compile": args.compile},
        "switch_interval_ms": sys.getswitchinterval() * 1e3,
        "letterbox_in_graph": not args.letterbox_outside, "batch_sizes": list(sizes), "size_table": size_table,
        "rows": rows, "targets": targets,
    }
    write_json(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
