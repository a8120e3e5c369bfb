"""Host time of predict() beyond the network's own time, batch 1: this tree, a baseline tree, the reference.

    # CPU (runs here): per-call host time of predict(b1) with the network replaced by a stub that returns
    # the real network's outputs for this input at no cost, so what is timed is everything else:
    # option checks, source, letterbox, executor dispatch, postprocessing, Results
    PYTHONPATH=. python bench/host_overhead.py --device cpu --baseline-src /tmp/base --rounds 3

    # CUDA (the lead's run): graphed b1 predict fp32 and fp16 against the graphed forward alone, every
    # family whose graphs are enabled (hidden sizes: SIZES), this tree, a baseline tree and the reference
    PYTHONPATH=. python bench/host_overhead.py --device cuda --families all --baseline-src /tmp/base \
        --peer-python /path/to/python --peer-path .peer

``--baseline-src DIR``: a source tree of another version (e.g. ``git archive 9cc6a8c libreyolo | tar -x -C
DIR``), timed in child processes taking turns with this tree (``--rounds``), so that both see the same
machine load; medians of the rounds are reported. ``--peer-python``: an interpreter that imports the
reference libreyolo 1.6.0 (``--peer-path`` put first on its path); its b1 predict (cuda_graph=True on
CUDA) is timed in a child process. Writes JSON to bench/results/ (``--json``).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# the size measured per family (the three slow ones at the sizes it quotes); imgsz: the model's own
SIZES = {"yolo9": "s", "yolox": "s", "rtdetr": "r34", "dfine": "s", "segformer": "b1", "rtmdet": "s",
         "yolo9_e2e": "s", "rtdetrv2": "r34", "deim": "s", "rtdetrv4": "s", "vit": "s", "deit": "s", "swin": "t",
         "swinir": "s", "deimv2": "s", "rfdetr": "s", "lwdetr": "s"}
PEER_CLASSES = {"yolo9": "LibreYOLO9", "yolox": "LibreYOLOX", "rtdetr": "LibreRTDETR", "dfine": "LibreDFINE",
                "segformer": "LibreSegformer", "rtmdet": "LibreRTMDet", "yolo9_e2e": "LibreYOLO9E2E",
                "rtdetrv2": "LibreRTDETRv2", "deim": "LibreDEIM", "rtdetrv4": "LibreRTDETRv4", "vit": "LibreViT",
                "deit": "LibreDeiT", "swin": "LibreSwin", "swinir": "LibreSwinIR", "deimv2": "LibreDEIMv2",
                "rfdetr": "LibreRFDETR", "lwdetr": "LibreLWDETR"}


def _frame(family: str, task: str) -> Any:
    import numpy as np

    shape = (96, 96, 3) if task == "restore" else (480, 640, 3)  # restore upscales: a small image
    return (np.random.RandomState(0).rand(*shape) * 255).astype(np.uint8)


def _median_ms(fn: Any, n: int, warmup: int, sync: Any) -> float:
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times) * 1e3, 4)


# --- one tree, in this process ------------------------------------------------------------------
def _cpu_host(args: argparse.Namespace) -> dict[str, Any]:
    """predict(b1) on the CPU with the network stubbed: the host's own work per call."""
    import torch

    torch.set_num_threads(1)
    return {name: _cpu_row(name, args) for name in args.families}


def _cpu_row(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from torch import nn

    from libreyolo.data.sources import array_source
    from libreyolo.graphs.parity import seeded_model

    model = seeded_model(name, args.size or ("t" if name == "yolo9" else SIZES[name]), device="cpu")
    task = model.family.task
    frame = _frame(name, task)[: args.frame, : args.frame * 4 // 3]
    imgsz = args.imgsz or model.imgsz
    pre = model.family.letterbox(imgsz)
    batch, _ = pre([array_source(frame, "bgr", "frame").to_device(torch.device("cpu"))], dtype=torch.float32)
    with torch.inference_mode():
        raw = model.net(batch)  # the real outputs for this input, returned by the stub at no cost

    class Stub(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.anchor = nn.Parameter(torch.zeros(1), requires_grad=False)
            self.raw = raw

        def forward(self, x: torch.Tensor) -> Any:
            return self.raw

    net_ms = _median_ms(lambda: model.net(batch), max(5, args.n // 20), 2, lambda: None)
    model.net = Stub()
    kw = {"imgsz": imgsz, **({"conf": args.conf} if task == "detect" else {})}
    boxes = getattr(model.predict(frame, **kw), "boxes", None)
    host_ms = _median_ms(lambda: model.predict(frame, **kw), args.n, 20, lambda: None)
    return {"size": model.size, "imgsz": imgsz, "frame": list(frame.shape), "predict_host_ms": host_ms,
            "network_ms": net_ms, "boxes": None if boxes is None else len(boxes)}


def _cuda_graphed(args: argparse.Namespace) -> dict[str, Any]:
    """Graphed b1 predict, fp32 and fp16, against the graphed forward alone, per family."""
    import torch

    rows: dict[str, Any] = {}
    for name in args.families:
        rows[name] = _cuda_row(name, args.size or SIZES[name], args.n)
        torch.cuda.empty_cache()
    return rows


def _cuda_row(name: str, size: str, n: int) -> dict[str, Any]:
    import torch

    from libreyolo.data.sources import array_source
    from libreyolo.graphs.parity import seeded_model

    sync, dev = torch.cuda.synchronize, torch.device("cuda")
    try:
        model = seeded_model(name, size, device="cuda")
    except Exception as exc:  # noqa: BLE001 - one family's failure is recorded, the others still run
        return {"size": size, "error": repr(exc)[:300]}
    if not model.family.SUPPORTS_CUDA_GRAPH:
        return {"size": size, "skipped": "CUDA graphs are not enabled for this family"}
    task = model.family.task
    frame, imgsz = _frame(name, task), model.imgsz
    kw = {"conf": 0.25} if task == "detect" else {}
    row: dict[str, Any] = {"size": size, "imgsz": imgsz, "frame": list(frame.shape)}
    pre = model.family.letterbox(imgsz)
    for half in (False, True):
        tag = "fp16" if half else "fp32"
        try:
            x, _ = pre([array_source(frame, "bgr", "frame").to_device(dev)],
                       dtype=torch.float16 if half else torch.float32)
            fwd = _median_ms(lambda x=x: model.graph_forward(x, True), n, 10, sync)
            pred = _median_ms(lambda half=half: model.predict(frame, half=half, cuda_graph=True, **kw), n, 10, sync)
            row[tag] = {"predict_graph_ms": pred, "forward_graph_ms": fwd, "host_over_ms": round(pred - fwd, 4)}
        except Exception as exc:  # noqa: BLE001
            row[tag] = {"error": repr(exc)[:300]}
    return row


PEER_CODE = r"""
import json, statistics, sys, time
cfg = json.loads(sys.argv[1]); sys.path.insert(0, cfg["path"])
import numpy as np, torch, libreyolo
out = {}
for fam, (cls, size, task) in cfg["families"].items():
    try:
        shape = (96, 96, 3) if task == "restore" else (480, 640, 3)
        img = (np.random.RandomState(0).rand(*shape) * 255).astype(np.uint8)
        m = getattr(libreyolo, cls)(None, size=size, device=cfg["device"])
        kw = {"conf": 0.25} if task == "detect" else {}
        row = {}
        for half in (False, True):
            def run():
                m(img, cuda_graph=cfg["device"] == "cuda", half=half, **kw)
                if cfg["device"] == "cuda": torch.cuda.synchronize()
            try:
                for _ in range(10): run()
                ts = []
                for _ in range(cfg["n"]):
                    t = time.perf_counter(); run(); ts.append((time.perf_counter() - t) * 1e3)
                row["fp16" if half else "fp32"] = {"predict_ms": round(statistics.median(ts), 4)}
            except Exception as exc:
                row["fp16" if half else "fp32"] = {"error": repr(exc)[:300]}
        out[fam] = row
    except Exception as exc:
        out[fam] = {"error": repr(exc)[:300]}
print("PEER_JSON " + json.dumps(out))
"""


def _child(args: argparse.Namespace, src: Path) -> dict[str, Any]:
    """This script's measurement, run by ``src``'s libreyolo in a child process."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--device", args.device, "--n", str(args.n),
           "--families", *args.families, "--frame", str(args.frame), "--conf", str(args.conf)]
    if args.imgsz:
        cmd += ["--imgsz", str(args.imgsz)]
    if args.size:
        cmd += ["--size", args.size]
    env = {**os.environ, "PYTHONPATH": str(src)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(src), timeout=args.timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ROWS_JSON ")]
    if proc.returncode != 0 or not lines:
        return {"error": f"rc {proc.returncode}", "stderr_tail": proc.stderr[-2000:]}
    return json.loads(lines[-1][len("ROWS_JSON "):])


def _merge(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per family and metric, the median over the rounds (and the rounds' values)."""
    ok = [r for r in rounds if "error" not in r]
    if not ok:
        return rounds[-1] if rounds else {}

    def walk(items: list[Any]) -> Any:
        first = items[0]
        if isinstance(first, dict):
            return {k: walk([i[k] for i in items if isinstance(i, dict) and k in i]) for k in first}
        if isinstance(first, float):
            return {"median": round(statistics.median(items), 4), "rounds": items}
        return first

    return walk(ok)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--families", nargs="+", default=None, help="'all' (CUDA default) or names (CPU default: yolo9)")
    ap.add_argument("--size", default=None, help="one size for every family (default: SIZES; CPU yolo9: t)")
    ap.add_argument("--imgsz", type=int, default=None, help="CPU: network input (default: the model's)")
    ap.add_argument("--frame", type=int, default=48, help="CPU: the input image's height (width 4/3 of it)")
    ap.add_argument("--conf", type=float, default=0.9, help="CPU, detect: the threshold (default 0.9: the seeded "
                    "head's few top scores, so NMS's own time does not hide the rest)")
    ap.add_argument("--n", type=int, default=200, help="timed calls per figure (median)")
    ap.add_argument("--rounds", type=int, default=3, help="turns per tree when a baseline is given")
    ap.add_argument("--baseline-src", type=Path, default=None)
    ap.add_argument("--peer-python", default=None)
    ap.add_argument("--peer-path", default=".peer")
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.families in (None, ["all"]):
        if args.families is None and args.device == "cpu":
            args.families = ["yolo9"]
        else:
            from libreyolo.models.registry import families

            args.families = list(families())
    if args.device == "cpu" and args.imgsz is None:
        args.imgsz = 64
    measure = _cpu_host if args.device == "cpu" else _cuda_graphed
    if args.child:
        print("ROWS_JSON " + json.dumps(measure(args)))
        return
    import torch

    out: dict[str, Any] = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
                           "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                           "torch": torch.__version__, "python": platform.python_version(),
                           "machine": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
                           "load_avg_1_5_15": [round(v, 2) for v in os.getloadavg()],
                           "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
                           "method": ("predict() host time, network stubbed (its real outputs returned at no cost)"
                                      if args.device == "cpu" else
                                      "graphed b1 predict vs graphed forward alone (Model.graph_forward)")}
    if args.baseline_src is not None:
        this, base = [], []
        for _ in range(args.rounds):
            this.append(_child(args, ROOT))
            base.append(_child(args, args.baseline_src.resolve()))
        out["this"], out["baseline"] = _merge(this), _merge(base)
        out["baseline_src"] = str(args.baseline_src)
    else:
        out["this"] = measure(args)
    if args.peer_python:
        fams = {f: (PEER_CLASSES[f], args.size or SIZES[f], _task(f)) for f in args.families if f in PEER_CLASSES}
        cfg = json.dumps({"path": args.peer_path, "families": fams, "device": args.device, "n": args.n})
        proc = subprocess.run([args.peer_python, "-c", PEER_CODE, cfg], capture_output=True, text=True,
                              timeout=args.timeout)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PEER_JSON ")]
        out["reference"] = (json.loads(lines[-1][len("PEER_JSON "):]) if lines else
                            {"error": f"rc {proc.returncode}", "stderr_tail": proc.stderr[-2000:]})
    text = json.dumps(out, indent=1)
    print(text)
    path = args.json or ROOT / "bench" / "results" / f"{dt.date.today()}-host-overhead-{args.device}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(path)
    print(f"wrote {path}", file=sys.stderr)


def _task(family: str) -> str:
    from libreyolo.models.registry import get_family

    return get_family(family).task


if __name__ == "__main__":
    main()
