"""Time predict() (pre / inference / post) of YOLOv9 at batch 1, eager, on CPU and CUDA.

    python bench/predict_bench.py [--device cpu|cuda] [--size t] [--imgsz 640] [--n 50] [--weights CKPT]
                                  [--json PATH] [--peer]

--peer also times the reference library (libreyolo 1.6.0, unpacked under .peer/) in a
subprocess on the same image and device, and reports ratios (reference / ours).
Prints a table and writes JSON with the device name, torch version and command.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

PEER_CODE = r"""
import json, sys, time
sys.path.insert(0, ".peer")
import numpy as np, torch, libreyolo
dev, size, n, graph = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
img = (np.random.RandomState(0).rand(480, 640, 3) * 255).astype(np.uint8)
m = libreyolo.LibreYOLO9(None, size=size, device=dev); m.model.eval()
def run():
    m(img, conf=0.25, cuda_graph=graph) if graph else m(img, conf=0.25)
    if dev == "cuda": torch.cuda.synchronize()
for _ in range(10): run()
ts = []
for _ in range(n):
    t = time.perf_counter(); run(); ts.append((time.perf_counter() - t) * 1e3)
ts.sort(); print(json.dumps({"predict_ms": ts[len(ts) // 2]}))
"""


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def bench_ours(device: str, size: str, imgsz: int, n: int, graph: bool = False, weights: str | None = None) -> dict:
    import torch

    sys.path.insert(0, str(ROOT))
    from libreyolo import LibreYOLO

    img = (np.random.RandomState(0).rand(480, 640, 3) * 255).astype(np.uint8)
    model = LibreYOLO(weights or f"LibreYOLO9{size}.yaml", device=device)
    for _ in range(10):
        model(img, conf=0.25, imgsz=imgsz, cuda_graph=graph)
    _sync(device)
    total, pre, inf, post = [], [], [], []
    for _ in range(n):
        t = time.perf_counter()
        r = model(img, conf=0.25, imgsz=imgsz, cuda_graph=graph)
        _sync(device)
        total.append((time.perf_counter() - t) * 1e3)
        pre.append(r.speed["preprocess"])
        inf.append(r.speed["inference"])
        post.append(r.speed["postprocess"])
    med = statistics.median
    return {"predict_ms": med(total), "preprocess_ms": med(pre), "inference_ms": med(inf),
            "postprocess_ms": med(post), "n_det": len(r), "torch": torch.__version__}


def bench_peer(device: str, size: str, n: int, graph: bool = False) -> dict:
    if not (ROOT / ".peer" / "libreyolo").is_dir():
        return {"error": "reference package not found under .peer/"}
    cmd = [sys.executable, "-c", PEER_CODE, device, size, str(n), "1" if graph else "0"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else {"error": proc.stderr[-500:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--size", default="t")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--weights", default=None,
                    help="checkpoint for our side (e.g. ../shared/bench/dense-yolo9t.pt); default: untrained --size")
    ap.add_argument("--json", default=None)
    ap.add_argument("--peer", action="store_true")
    ap.add_argument("--cuda-graph", action="store_true", help="predict(cuda_graph=True), both libraries")
    args = ap.parse_args()
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name() if device.startswith("cuda") else (platform.processor() or platform.machine())
    row = {"device": device, "device_name": name, "size": args.size, "imgsz": args.imgsz, "batch": 1,
           "cuda_graph": args.cuda_graph,
           "weights": args.weights,
           "ours": bench_ours(device, args.size, args.imgsz, args.n, args.cuda_graph, args.weights)}
    if args.peer:
        row["reference"] = bench_peer(device, args.size, args.n, args.cuda_graph)
        if "predict_ms" in row["reference"]:
            row["speedup_vs_reference"] = round(row["reference"]["predict_ms"] / row["ours"]["predict_ms"], 2)
    row["command"] = " ".join(sys.argv)
    print(f"{'what':<28}{'ms':>10}")
    for k in ("predict_ms", "preprocess_ms", "inference_ms", "postprocess_ms"):
        print(f"{'ours ' + k:<28}{row['ours'][k]:>10.2f}")
    if "reference" in row and "predict_ms" in row["reference"]:
        print(f"{'reference predict_ms':<28}{row['reference']['predict_ms']:>10.2f}")
        print(f"{'speedup (ref/ours)':<28}{row['speedup_vs_reference']:>10.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
