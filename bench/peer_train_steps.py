"""The reference library's training time per step, as a black box: its own ``train()`` on a tiny
synthetic dataset, per-epoch seconds read back from the run's ``metrics.jsonl``/``results.csv``.

    python3 bench/peer_train_steps.py --peer .peer --tiny .gpushared/make_tiny_dataset.py \
        --runs yolo9:t:2,yolo9:t:8,yolox:n:8,dfine:n:8 [--imgsz 640 --epochs 3 --images 256]

Prints one JSON line per (run, cuda_graph): ``epoch_s`` (every epoch) and ``step_ms``, the mean of
the epochs after the first divided by the batches per epoch (the first epoch holds warm-up and
capture). Run by ``bench/train_bench.py --sections loop`` with the reference's interpreter.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLASSES = {"yolo9": "LibreYOLO9", "yolox": "LibreYOLOX", "dfine": "LibreDFINE", "rtdetr": "LibreRTDETR",
           "rtmdet": "LibreRTMDet"}


def epoch_seconds(run_dir: Path) -> list[float]:
    jsonl = run_dir / "metrics.jsonl"
    out: list[float] = []
    if jsonl.exists():
        for line in jsonl.read_text().splitlines():
            row = json.loads(line)
            for key in ("epoch_seconds", "time"):
                if isinstance(row.get(key), (int, float)):
                    out.append(float(row[key]))
                    break
    if not out and (run_dir / "results.csv").exists():
        with open(run_dir / "results.csv") as f:
            out = [float(r["time"]) for r in csv.DictReader(f) if r.get("time")]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peer", default=".peer", help="folder holding the reference's unpacked package")
    p.add_argument("--tiny", required=True, help="the dataset writer (make_tiny_dataset.py)")
    p.add_argument("--runs", default="yolo9:t:2,yolo9:t:8,yolo9:t:16,yolox:n:8,dfine:n:8")
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--images", type=int, default=256)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    sys.path.insert(0, a.peer)
    import libreyolo  # the reference

    tmp = tempfile.mkdtemp()
    yaml = subprocess.check_output([sys.executable, a.tiny, os.path.join(tmp, "ds"), str(a.images)]).decode().strip()
    for spec in a.runs.split(","):
        family, size, batch = spec.split(":")
        for graph in (False, True):
            row = {"family": f"{family}-{size}", "batch": int(batch), "imgsz": a.imgsz, "cuda_graph": graph,
                   "images": a.images, "epochs": a.epochs}
            try:
                model = getattr(libreyolo, CLASSES[family])(None, size=size, device=a.device)
                name = f"{family}{size}-b{batch}-g{int(graph)}"
                t = time.time()
                model.train(data=yaml, epochs=a.epochs, batch=int(batch), imgsz=a.imgsz, cuda_graph=graph,
                            workers=a.workers, project=tmp, name=name, plots=False, val=False, seed=0)
                row["wall_s"] = round(time.time() - t, 2)
                runs = sorted(Path(tmp).glob(f"{name}*"), key=lambda q: q.stat().st_mtime)
                secs = epoch_seconds(runs[-1]) if runs else []
                row["epoch_s"] = [round(s, 3) for s in secs]
                steps = math.ceil(a.images / int(batch))
                if len(secs) > 1:
                    row["step_ms"] = round(sum(secs[1:]) / len(secs[1:]) / steps * 1e3, 2)
            except Exception as exc:  # noqa: BLE001 - a black box: report what it raised
                row["error"] = f"{type(exc).__name__}: {exc}"[:400]
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
