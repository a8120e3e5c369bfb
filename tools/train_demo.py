"""Train the demo checkpoint: YOLOv9-t from scratch on the synthetic shapes dataset.

    python tools/train_demo.py --out runs/demo            # on a GPU: a few minutes
    python tools/train_demo.py --out runs/demo --install  # then copy it into libreyolo/assets/

It writes the dataset (libreyolo.train.shapes, seed 0), trains ``LibreYOLO9t.yaml`` with 3
classes (square, circle, triangle), validates the best checkpoint on the synthetic val split and
writes ``demo_record.json`` (arguments, mAP, time, versions). ``--install`` copies the best weights
to ``libreyolo/assets/LibreYOLO9t-shapes.pt`` and draws ``libreyolo/assets/shapes.jpg``, a held-out
image (its own seed, never in the training set) for ``make demo``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from libreyolo import LibreYOLO
from libreyolo.train.shapes import make_shapes_dataset, sample_image

ASSETS = Path(__file__).resolve().parent.parent / "libreyolo" / "assets"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/demo", help="run folder (dataset, training run, record)")
    p.add_argument("--n-train", type=int, default=2000)
    p.add_argument("--n-val", type=int, default=200)
    p.add_argument("--imgsz", type=int, default=320)
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--device", default=None)
    p.add_argument("--optimizer", default="AdamW", help="AdamW suits a short from-scratch schedule (default)")
    p.add_argument("--lr0", type=float, default=0.002)
    p.add_argument("--nbs", type=int, default=16, help="nominal batch (no gradient accumulation at batch 16)")
    p.add_argument("--cuda-graph", action="store_true")
    p.add_argument("--no-val", action="store_true", help="skip the per-epoch validation (the best weights are then "
                   "the last; the final checkpoint is validated once at the end)")
    p.add_argument("--install", action="store_true", help="copy the weights and the sample image into the package")
    a = p.parse_args(argv)
    out = Path(a.out)
    t0 = time.time()
    data = make_shapes_dataset(out / "shapes", n_train=a.n_train, n_val=a.n_val, imgsz=a.imgsz, seed=0)
    made = time.time() - t0
    model = LibreYOLO("LibreYOLO9t.yaml", device=a.device) if a.device else LibreYOLO("LibreYOLO9t.yaml")
    t1 = time.time()
    summary = model.train(data=str(data), epochs=a.epochs, imgsz=a.imgsz, batch=a.batch, workers=a.workers,
                          project=str(out), name="train", exist_ok=True, close_mosaic=max(1, a.epochs // 8),
                          cuda_graph=a.cuda_graph, seed=0, val=not a.no_val, optimizer=a.optimizer, lr0=a.lr0,
                          nbs=a.nbs)
    trained = time.time() - t1
    best = LibreYOLO(summary["best"])
    metrics = best.val(data=str(data), imgsz=a.imgsz, batch=a.batch, workers=a.workers)
    record = {"what": "YOLOv9-t trained from scratch on the synthetic shapes dataset (libreyolo.train.shapes)",
              "command": "python tools/train_demo.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "dataset": {"n_train": a.n_train, "n_val": a.n_val, "imgsz": a.imgsz, "seed": 0,
                          "classes": list(model.names.values())},
              "train": {"epochs": a.epochs, "batch": a.batch, "optimizer": a.optimizer, "lr0": a.lr0,
                        "nbs": a.nbs, "imgsz": a.imgsz, "cuda_graph": a.cuda_graph,
                        "seconds": round(trained, 1), "dataset_seconds": round(made, 1),
                        "graph": summary.get("graph")},
              "val_metrics_best": metrics, "last_epoch": summary.get("last_metrics"),
              "torch": torch.__version__, "python": platform.python_version(),
              "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu"}
    (out / "demo_record.json").write_text(json.dumps(record, indent=2))
    print(json.dumps(record, indent=2))
    if a.install:
        _atomic_copy(Path(summary["best"]), ASSETS / "LibreYOLO9t-shapes.pt")
        sample_image(seed=12345, imgsz=640).save(ASSETS / "shapes.jpg", quality=92)
        (ASSETS / "LibreYOLO9t-shapes.json").write_text(json.dumps(record, indent=2))


def _atomic_copy(src: Path, dst: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=dst.name, suffix=".tmp")
    os.close(fd)
    shutil.copyfile(src, tmp)
    os.chmod(tmp, 0o644)
    os.replace(tmp, dst)


if __name__ == "__main__":
    main()
