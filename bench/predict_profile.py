"""Where predict() time goes on CUDA: each stage timed with a device sync after it.

    PYTHONPATH=. python3 bench/predict_profile.py [--cuda-graph] [--n 100] [--json PATH]

The syncs make the sum larger than a real predict() (which overlaps host and device work);
this is for finding the slow stage, not for reporting latency.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from libreyolo import LibreYOLO  # noqa: E402
from libreyolo.data import load_sources  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cuda-graph", action="store_true")
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    model = LibreYOLO("LibreYOLO9t.yaml", device=dev)
    img = (np.random.RandomState(0).rand(480, 640, 3) * 255).astype(np.uint8)
    lb = model.family.letterbox(640)
    stages: dict[str, list[float]] = {k: [] for k in ("load", "upload", "letterbox", "forward", "post", "predict")}
    for i in range(args.n + 10):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        src = load_sources(img)
        t1 = time.perf_counter()
        x = [s.to_device(dev) for s in src]
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        batch, metas = lb(x)
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        out = model._forward(batch, cuda_graph=args.cuda_graph)
        torch.cuda.synchronize()
        t4 = time.perf_counter()
        model.family.postprocess(out, metas, conf=0.25, iou=0.45, max_det=300, classes=None)
        torch.cuda.synchronize()
        t5 = time.perf_counter()
        model(img, cuda_graph=args.cuda_graph)
        torch.cuda.synchronize()
        t6 = time.perf_counter()
        if i >= 10:
            for k, v in zip(stages, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5), strict=True):
                stages[k].append(v * 1e3)
    row = {k: round(statistics.median(v), 3) for k, v in stages.items()}
    row.update(cuda_graph=args.cuda_graph, gpu=torch.cuda.get_device_name(), torch=torch.__version__,
               command=" ".join(sys.argv))
    print(json.dumps(row))
    if args.json:
        Path(args.json).write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
