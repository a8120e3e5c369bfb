"""The DETR line and YOLOv9-E2E on CUDA (issue 47): ours against the reference, on the same checkpoint files.

    PYTHONPATH=. python3 bench/detr_line_bench.py --peer-path .peer --json bench/results/<date>-detr-line-<gpu>.json

Cases: RF-DETR-s (512), DEIM-s, RT-DETRv2-r18 and YOLOv9-E2E-t (640). The reference library (1.6.0, its
unpacked wheel on ``--peer-path``) runs first in a child process: it builds each model untrained
(``Class(None, size=..., device="cuda")``), writes it with its own ``save()`` and times its ``predict()``
eager and with ``cuda_graph=True``, batch 1 and 8, fp32 and fp16. Then we load the file the reference
wrote (so both sides run the same weights; a case the reference cannot build falls back to our own
untrained model, said in the row) and time the same calls, plus the graphed network forward alone (the
floor under graphed predict) and, for the families that call the ``ms_deform_attn`` slot, the eager
forward with each provider alone (portable first) and its largest output difference from portable.

Each figure is the median of ``--n`` calls after ``--warmup``, host-timed around a device sync: what a
caller waits for. The table prints ours, the reference and ours/reference.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (case, reference class, size, our yaml)
CASES = (("rfdetr-s", "LibreRFDETR", "s", "LibreRFDETRs.yaml"),
         ("deim-s", "LibreDEIM", "s", "LibreDEIMs.yaml"),
         ("rtdetrv2-r18", "LibreRTDETRv2", "r18", "LibreRTDETRv2r18.yaml"),
         ("yolo9_e2e-t", "LibreYOLO9E2E", "t", "LibreYOLO9E2Et.yaml"))
SLOT = "ms_deform_attn"

PEER = r'''
import json, statistics, sys, time, traceback, numpy as np, torch, libreyolo
cfg = json.loads(sys.argv[1])
def frame():
    return (np.random.RandomState(0).rand(480, 640, 3) * 255).astype(np.uint8)
def timed(fn, n, warm):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize(); times = []
    for _ in range(n):
        t = time.perf_counter(); fn(); torch.cuda.synchronize(); times.append(time.perf_counter() - t)
    return round(statistics.median(times) * 1e3, 3)
out = {"version": libreyolo.__version__, "file": libreyolo.__file__, "cases": []}
for case, cls, size, _ in cfg["cases"]:
    row = {"case": case}
    try:
        m = getattr(libreyolo, cls)(None, size=size, device="cuda")
        m.model.eval()
        row["path"] = m.save(f"{cfg['dir']}/{case}.pt")
    except Exception as exc:
        row["build_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        out["cases"].append(row); print("peer " + json.dumps(row), file=sys.stderr, flush=True); continue
    for precision in cfg["precisions"]:
        for batch in cfg["batches"]:
            src = frame() if batch == 1 else [frame()] * batch
            n = cfg["n"] if batch == 1 else max(5, cfg["n"] // 3)
            warm = cfg["warmup"] if batch == 1 else max(2, cfg["warmup"] // 3)
            for graph in (False, True):
                key = f"{precision} b{batch} {'graph' if graph else 'eager'}"
                kw = {"conf": 0.25, **({"half": True} if precision == "fp16" else {}),
                      **({"cuda_graph": True} if graph else {})}
                try:
                    row[key] = timed(lambda: m(src, **kw), n, warm)
                except Exception as exc:
                    row[key] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    out["cases"].append(row)
    print("peer " + json.dumps(row), file=sys.stderr, flush=True)
    del m
    torch.cuda.empty_cache()
print("PEER_JSON " + json.dumps(out))
'''


def frame() -> np.ndarray:
    return (np.random.RandomState(0).rand(480, 640, 3) * 255).astype(np.uint8)


def timed(fn, n: int, warm: int) -> float:
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return round(statistics.median(times) * 1e3, 3)


def _err(exc: BaseException) -> str:
    return f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]


def _flat(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for k in sorted(out) for t in _flat(out[k])]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _flat(o)]
    return []


def providers(model, imgsz: int, n: int, warm: int) -> dict:
    """Eager b1 fp32 forward with each ``ms_deform_attn`` provider alone, against the portable path."""
    from libreyolo import kernels
    from libreyolo.kernels import _registry

    kernels.active()
    names = [impl.name for impl in _registry._selection(SLOT).ordered]
    state = _registry._snapshot()
    net = model.inference_module()
    x = torch.rand(1, 3, imgsz, imgsz, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    rows: dict = {}
    try:
        with torch.inference_mode():
            for name in names:
                kernels.disable(SLOT, name, "bench: portable")
            ref = _flat(net(x))
            rows["portable"] = {"forward_ms": timed(lambda: net(x), n, warm), "max_diff": 0.0}
            _registry._restore(state)
            for name in names:
                for other in names:
                    if other != name:
                        kernels.disable(SLOT, other, "bench: one at a time")
                try:
                    got = _flat(net(x))
                    diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(got, ref, strict=True))
                    rows[name] = {"forward_ms": timed(lambda: net(x), n, warm), "max_diff": diff,
                                  "note": "raw outputs; near-tied query selections can trade rows"}
                except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                    rows[name] = {"error": _err(exc)}
                _registry._restore(state)
    finally:
        _registry._restore(state)
    return rows


def ours(case: str, path: str | None, yaml: str, args) -> dict:
    from libreyolo import LibreYOLO

    row: dict = {"case": case,
                 "weights": "reference-written file" if path else "our untrained model (reference failed)"}
    model = LibreYOLO(path or yaml, device="cuda")
    imgsz = int(model.imgsz)
    row["imgsz"] = imgsz
    row["graph_supported"] = bool(model.graph_info().get("supported"))
    for precision in args.precisions:
        half = precision == "fp16"
        for batch in args.batches:
            src = frame() if batch == 1 else [frame()] * batch
            n = args.n if batch == 1 else max(5, args.n // 3)
            warm = args.warmup if batch == 1 else max(2, args.warmup // 3)
            for graph in (False, True):
                key = f"{precision} b{batch} {'graph' if graph else 'eager'}"
                kw = {"conf": 0.25, "half": half, "batch": batch, **({"cuda_graph": True} if graph else {})}
                try:
                    row[key] = timed(lambda m=model, s=src, k=kw: m(s, **k), n, warm)
                except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                    row[key] = _err(exc)
            x = torch.rand(batch, 3, imgsz, imgsz, device="cuda").to(torch.float16 if half else torch.float32)
            try:
                row[f"{precision} b{batch} forward-graph"] = timed(
                    lambda m=model, x=x: m._forward(x, cuda_graph=True), n, warm)
            except Exception as exc:  # noqa: BLE001
                row[f"{precision} b{batch} forward-graph"] = _err(exc)
            model.release_graphs()
    if model.family.name != "yolo9_e2e":  # the DETR line calls the deformable-attention slot
        try:
            row["ms_deform_attn"] = providers(model, imgsz, args.n, args.warmup)
        except Exception as exc:  # noqa: BLE001
            row["ms_deform_attn"] = {"error": _err(exc)}
    model.release_graphs()
    torch.cuda.empty_cache()
    return row


def table(result: dict) -> str:
    peer = {r["case"]: r for r in result.get("peer", {}).get("cases", [])}
    keys = [f"{p} b{b} {m}" for p in result["precisions"] for b in result["batches"] for m in ("eager", "graph")]
    lines = ["| case | call | ours ms | reference ms | ours/ref |", "| --- | --- | --- | --- | --- |"]
    for row in result["ours"]:
        theirs = peer.get(row["case"], {})
        for k in keys:
            a, b = row.get(k), theirs.get(k, theirs.get("build_error", "-"))
            ratio = f"{a / b:.2f}x" if isinstance(a, float) and isinstance(b, float) else "-"
            lines.append(f"| {row['case']} | {k} | {a} | {b} | {ratio} |")
        for p in result["precisions"]:
            for bt in result["batches"]:
                lines.append(f"| {row['case']} | {p} b{bt} forward-graph (network alone) | "
                             f"{row.get(f'{p} b{bt} forward-graph')} | - | - |")
        for name, pr in (row.get("ms_deform_attn") or {}).items():
            if isinstance(pr, dict):
                lines.append(f"| {row['case']} | ms_deform_attn {name} eager fp32 b1 forward | "
                             f"{pr.get('forward_ms', pr.get('error'))} (max diff {pr.get('max_diff', '-')}) | - | - |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--md", type=Path)
    ap.add_argument("--peer-path", help="folder holding the reference's unpacked `libreyolo` package")
    ap.add_argument("--cases", nargs="+", default=[c[0] for c in CASES], choices=[c[0] for c in CASES])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "fp16"], choices=["fp32", "fp16"])
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=8)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    cases = [c for c in CASES if c[0] in args.cases]
    result: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "python": platform.python_version(), "command": " ".join(sys.argv),
                    "batches": args.batches, "precisions": args.precisions, "ours": []}
    with tempfile.TemporaryDirectory() as work:
        paths: dict[str, str] = {}
        if args.peer_path:
            cfg = {"cases": cases, "dir": work, "n": args.n, "warmup": args.warmup, "batches": args.batches,
                   "precisions": args.precisions}
            env = {**os.environ, "PYTHONPATH": str(Path(args.peer_path).resolve())}
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-c", PEER, json.dumps(cfg)], capture_output=True, text=True,
                                  cwd=work, env=env)
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith("PEER_JSON ")]
            result["peer"] = (json.loads(line[-1][len("PEER_JSON "):]) if line
                              else {"error": proc.stderr[-3000:], "cases": []})
            result["peer_s"] = round(time.perf_counter() - t0, 1)
            print(proc.stderr[-4000:], file=sys.stderr)
            paths = {r["case"]: r["path"] for r in result["peer"].get("cases", []) if "path" in r}
        for case, _, _, yaml in cases:
            try:
                result["ours"].append(ours(case, paths.get(case), yaml, args))
            except Exception as exc:  # noqa: BLE001 - one failing case is recorded
                result["ours"].append({"case": case, "error": _err(exc)})
            print("ours " + json.dumps(result["ours"][-1]), flush=True)
    md = table(result)
    print(md)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.md:
        args.md.write_text(f"# DETR line bench ({result['device']}, torch {result['torch']})\n\n"
                           f"`{result['command']}`\n\n{md}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
