"""Eager vs CUDA-graph latency of predict() and of the network forward, ours and the reference's.

    PYTHONPATH=. python3 bench/graph_bench.py --json graph_bench.json           # ours only
    PYTHONPATH=. python3 bench/graph_bench.py --peer --json graph_bench_peer.json  # + reference, ratios

YOLOv9 (default size t) at 640, batch 1, 8 and 32, fp32 and fp16, random weights, one
480x640 uint8 frame (the same frame as ../shared/bench/peer_gpu_bench.py). Each figure is the
median of N calls after a warm-up, each call timed from the host with a device
synchronisation after it, so it is what a caller waits for.

- ``predict_*``: ``model(frames, conf=0.25[, half=True][, cuda_graph=True])``, frames -> Results.
- ``forward_eager`` / ``forward_graph``: the network on a letterboxed batch; ours through
  ``Model._forward`` (graph: weight check, key lookup, copy-in, replay, copy-out), the
  reference's as a bare ``CUDAGraph.replay()`` (what its bench measured). ``replay``: our bare
  replay; ``weight_check_us``: the host time of the per-call weight check alone.

Random weights: our untrained head gets the usual class-bias prior (scores ~1e-3, as
detectors are initialised for training) so that NMS sees a realistic handful of candidates
instead of every anchor at 0.5; ``n_det`` is recorded on both sides.

``--peer`` measures the reference library (1.6.0, unpacked under ``.peer/``) in a child
process of this script (``--peer-only``), so our ``libreyolo`` and theirs never share a process.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

METRICS = ("predict_eager_ms", "predict_graph_ms", "forward_eager_ms", "forward_graph_ms")


def timed(fn: Callable[[], object], n: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times) * 1e3, 3)


def frame() -> np.ndarray:
    return (np.random.RandomState(0).rand(480, 640, 3) * 255).astype(np.uint8)


def _n(args: argparse.Namespace, batch: int) -> tuple[int, int]:
    scale = 1 if batch == 1 else (2 if batch <= 8 else 4)
    return max(5, args.n // scale), max(3, args.warmup // scale)


def _class_prior(model) -> None:
    head = model.net.head
    with torch.no_grad():
        for seq, stride in zip(head.cv3, (8, 16, 32), strict=True):
            seq[-1].bias.fill_(math.log(5 / model.nc / (640 / stride) ** 2))


def bench_ours(args: argparse.Namespace) -> list[dict]:
    from libreyolo import LibreYOLO

    model = LibreYOLO(f"LibreYOLO9{args.size}.yaml", device="cuda")
    _class_prior(model)
    rows = []
    for precision in args.precisions:
        for batch in args.batches:
            rows.append(_ours_row(model, args, precision, batch))
            print(f"ours {precision} b{batch}: " + ", ".join(f"{k} {rows[-1][k]}" for k in METRICS), flush=True)
        model.release_graphs()
    return rows


def _ours_row(model, args: argparse.Namespace, precision: str, batch: int) -> dict:
    half = precision == "fp16"
    n, warm = _n(args, batch)
    src = frame() if batch == 1 else [frame()] * batch
    row: dict = {"precision": precision, "batch": batch}
    # batch=batch: every frame in one forward, whatever predict()'s default batch
    row["predict_eager_ms"] = timed(lambda: model(src, conf=0.25, half=half, batch=batch), n, warm)
    row["predict_graph_ms"] = timed(lambda: model(src, conf=0.25, half=half, cuda_graph=True, batch=batch), n, warm)
    last = model(src, conf=0.25, half=half, cuda_graph=True, batch=batch)
    last = last if isinstance(last, list) else [last]
    row["n_det"] = sum(len(r) for r in last)
    row["speed_graph_ms"] = {k: round(v * batch, 3) for k, v in last[0].speed.items()}  # chunk totals
    x = torch.rand(batch, 3, args.imgsz, args.imgsz, device="cuda").to(torch.float16 if half else torch.float32)
    row["forward_eager_ms"] = timed(lambda: model._forward(x), n, warm)
    row["forward_graph_ms"] = timed(lambda: model._forward(x, cuda_graph=True), n, warm)
    runner = model._graph_runner(model.inference_copy(x.device, x.dtype))  # each precision has its own copy
    # the forward-only program's graph for this input (key: program, options, inputs, ...)
    entry = next(e for k, e in runner._table.items()
                 if any(inp[0] == tuple(x.shape) and inp[2] == x.dtype for inp in k[2]) and len(k[2]) == 1)
    row["replay_ms"] = timed(lambda: runner.backend.replay(entry.graph), n, warm)
    # host cost of the per-call weight check (every parameter's data_ptr), part of forward_graph
    t0 = time.perf_counter()
    for _ in range(1000):
        runner.check_weights()
    row["weight_check_us"] = round((time.perf_counter() - t0) * 1e3, 2)
    row["tracked_tensors"] = runner._watch.tracked
    row["capture_ms"] = round(entry.capture_ms, 1)
    row["per_image_predict_graph_ms"] = round(row["predict_graph_ms"] / batch, 3)
    return row


def _bare_graph(net, x):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            net(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        net(x)
    return graph


def bench_peer(args: argparse.Namespace) -> list[dict]:
    """Runs in a child process: ``libreyolo`` here is the reference package under ``--peer-dir``."""
    import copy

    sys.path.insert(0, str(Path(args.peer_dir).resolve()))
    import libreyolo

    if Path(args.peer_dir).resolve() not in Path(libreyolo.__file__).resolve().parents:
        raise RuntimeError(f"imported {libreyolo.__file__}, not the reference package under {args.peer_dir}")
    m = libreyolo.LibreYOLO9(None, size=args.size, device="cuda")
    m.model.eval()
    rows = []
    for precision in args.precisions:
        net = m.model if precision == "fp32" else copy.deepcopy(m.model).half()
        for batch in args.batches:
            rows.append(_peer_row(m, net, args, precision, batch))
            print(f"peer {precision} b{batch}: " + ", ".join(f"{k} {rows[-1].get(k)}" for k in METRICS), flush=True)
    return rows


def _peer_row(m, net, args: argparse.Namespace, precision: str, batch: int) -> dict:
    half = precision == "fp16"
    n, warm = _n(args, batch)
    src = frame() if batch == 1 else [frame()] * batch
    row: dict = {"precision": precision, "batch": batch}
    # keyword arguments exactly as ../shared/bench/peer_gpu_bench.py passes them
    kw = {"conf": 0.25, **({"half": True} if half else {})}
    for key, extra in (("predict_eager_ms", {}), ("predict_graph_ms", {"cuda_graph": True})):
        try:
            row[key] = timed(lambda extra=extra: m(src, **kw, **extra), n, warm)
        except Exception as exc:  # noqa: BLE001 - recorded, the bench goes on
            row[key.replace("_ms", "_error")] = f"{type(exc).__name__}: {exc}"[:200]
    try:
        r = m(src, **kw)
        row["n_det"] = sum(len(x) for x in r) if isinstance(r, list) else len(r)
    except Exception:  # noqa: BLE001
        pass
    x = torch.randn(batch, 3, args.imgsz, args.imgsz, device="cuda").to(torch.float16 if half else torch.float32)
    with torch.no_grad():
        row["forward_eager_ms"] = timed(lambda: net(x), n, warm)
        graph = _bare_graph(net, x)
        row["forward_graph_ms"] = timed(graph.replay, n, warm)
    return row


def run_peer_child(args: argparse.Namespace) -> list[dict] | dict:
    if not (Path(args.peer_dir) / "libreyolo").is_dir():
        return {"error": f"reference package not found under {args.peer_dir}/ (pip download --no-deps "
                         "libreyolo==1.6.0, unzip it there)"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "peer.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--peer-only", "--json", str(out),
               "--peer-dir", args.peer_dir, "--size", args.size, "--imgsz", str(args.imgsz), "--n", str(args.n),
               "--warmup", str(args.warmup), "--batches", *map(str, args.batches), "--precisions", *args.precisions]
        proc = subprocess.run(cmd, text=True, capture_output=True)
        print(proc.stdout, end="")
        if proc.returncode != 0 or not out.exists():
            return {"error": f"reference run failed (rc {proc.returncode}): {proc.stderr[-2000:]}"}
        return json.loads(out.read_text())["peer"]


def ratios(ours: list[dict], peer: list[dict]) -> list[dict]:
    index = {(r["precision"], r["batch"]): r for r in peer}
    out = []
    for r in ours:
        p = index.get((r["precision"], r["batch"]))
        if p is None:
            continue
        row = {"precision": r["precision"], "batch": r["batch"]}
        for k in METRICS:
            if isinstance(p.get(k), (int, float)) and p[k] > 0:
                row[k.replace("_ms", "_ratio")] = round(r[k] / p[k], 3)
        out.append(row)
    return out


def table(ours: list[dict], peer: list[dict] | dict | None) -> str:
    peer_rows = {(r["precision"], r["batch"]): r for r in peer} if isinstance(peer, list) else {}
    head = ["prec", "batch", "pred eager", "pred graph", "fwd eager", "fwd graph", "replay",
            "ref pred graph", "ref fwd graph", "pred graph x", "fwd graph x"]
    lines = [" | ".join(f"{h:>14}" for h in head)]
    for r in ours:
        p = peer_rows.get((r["precision"], r["batch"]), {})
        pg, fg = p.get("predict_graph_ms"), p.get("forward_graph_ms")
        cells = [r["precision"], r["batch"], r["predict_eager_ms"], r["predict_graph_ms"], r["forward_eager_ms"],
                 r["forward_graph_ms"], r["replay_ms"], pg or "-", fg or "-",
                 f"{r['predict_graph_ms'] / pg:.2f}" if pg else "-", f"{r['forward_graph_ms'] / fg:.2f}" if fg else "-"]
        lines.append(" | ".join(f"{c!s:>14}" for c in cells))
    return "\n".join(lines)


def goals(ours: list[dict], peer: list[dict] | dict | None) -> dict:
    """The issue's targets at fp32, batch 1: graphed predict <= 0.5x the reference's, forward <= 1x."""
    mine = next((r for r in ours if r["precision"] == "fp32" and r["batch"] == 1), None)
    if mine is None:
        return {}
    ref = next((r for r in peer if r["precision"] == "fp32" and r["batch"] == 1), {}) if isinstance(peer, list) \
        else {}
    ref_predict = ref.get("predict_graph_ms", 7.671)  # ../shared/bench/peer-h200-2026-11-29.jsonl if not run
    ref_forward = ref.get("forward_graph_ms", 3.34)
    return {"reference_measured_here": bool(ref),
            "predict_graph_ms": mine["predict_graph_ms"], "predict_goal_ms": round(ref_predict / 2, 3),
            "predict_goal_met": mine["predict_graph_ms"] <= ref_predict / 2,
            "forward_graph_ms": mine["forward_graph_ms"], "forward_goal_ms": ref_forward,
            "forward_goal_met": mine["forward_graph_ms"] <= ref_forward}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write results here")
    ap.add_argument("--peer", action="store_true", help="also measure the reference under --peer-dir")
    ap.add_argument("--peer-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--peer-dir", default=".peer")
    ap.add_argument("--size", default="t")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "fp16"], choices=["fp32", "fp16"])
    ap.add_argument("--n", type=int, default=100, help="timed calls per figure (fewer for large batches)")
    ap.add_argument("--warmup", type=int, default=15)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("graph_bench needs a CUDA GPU (CUDA graphs); nothing measured")
        return 2
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "command": " ".join([Path(sys.executable).name, *sys.argv]),
           "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "config": {k: v for k, v in vars(args).items() if k != "json"}}
    if args.peer_only:
        result = {**env, "peer": bench_peer(args)}
    else:
        ours = bench_ours(args)
        peer = run_peer_child(args) if args.peer else None
        result = {**env, "ours": ours, "peer": peer, "ratios": ratios(ours, peer) if isinstance(peer, list) else [],
                  "goals": goals(ours, peer)}
        print(table(ours, peer))
        if isinstance(peer, dict):
            print("reference:", peer["error"])
        print("goals (fp32, batch 1):", json.dumps(result["goals"]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
