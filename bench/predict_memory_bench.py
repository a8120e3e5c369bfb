"""Peak memory (RSS) of predict() over a folder of many images, with the default settings.

Writes N small synthetic JPEGs (random sizes between 320x240 and 800x600, seeded) to a temporary
folder, then runs each mode in a fresh child process so that its peak RSS is its own:

- ``list``: ``model.predict(folder)``, the default call, which returns a list of Results;
- ``stream``: ``for r in model.predict(folder, stream=True)``, consuming each result.

The model is the untrained YOLOv9-t (``LibreYOLO("LibreYOLO9t.yaml")``); untrained weights
give few detections, which does not change the memory picture (decoded images, the batch, the
forward). Prints a table and writes JSON to ``bench/results/`` with the torch version, the
command and the machine. The acceptance bound is 1.5 GB (1.5e9 bytes) of peak RSS.

    OMP_NUM_THREADS=1 python bench/predict_memory_bench.py --images 1000 --imgsz 320
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LIMIT_BYTES = 1.5e9
ROOT = Path(__file__).resolve().parents[1]


def _status_kib(field: str) -> int:
    """A /proc/self/status field in KiB (VmRSS, VmHWM); 0 where /proc is not available."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _peak_kib() -> int:
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak // 1024 if sys.platform == "darwin" else peak


def make_images(folder: Path, n: int, seed: int = 0) -> None:
    import numpy as np
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    for i in range(n):
        w, h = int(rng.integers(320, 801)), int(rng.integers(240, 601))
        img = Image.new("RGB", (w, h), tuple(int(c) for c in rng.integers(0, 256, 3)))
        draw = ImageDraw.Draw(img)
        for _ in range(6):
            x0, y0 = int(rng.integers(0, w - 20)), int(rng.integers(0, h - 20))
            x1, y1 = x0 + int(rng.integers(10, w // 2)), y0 + int(rng.integers(10, h // 2))
            draw.rectangle((x0, y0, x1, y1), fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
        img.save(folder / f"img{i:05d}.jpg", quality=90)


def child(args: argparse.Namespace) -> None:
    """One mode in this process; prints one JSON line."""
    import torch

    from libreyolo import LibreYOLO

    model = LibreYOLO("LibreYOLO9t.yaml")
    kw = {} if args.imgsz is None else {"imgsz": args.imgsz}
    if args.batch is not None:
        kw["batch"] = args.batch
    rss_model = _status_kib("VmRSS")
    start = time.perf_counter()
    count = boxes = 0
    if args.mode == "stream":
        for r in model.predict(args.folder, stream=True, progress=False, **kw):
            count += 1
            boxes += len(r)
        rss_end = _status_kib("VmRSS")
    else:
        results = model.predict(args.folder, progress=False, **kw)
        count, boxes = len(results), sum(len(r) for r in results)
        rss_end = _status_kib("VmRSS")  # with every Results still held
    seconds = time.perf_counter() - start
    print(json.dumps({
        "mode": args.mode, "images": count, "boxes": boxes, "seconds": round(seconds, 2),
        "images_per_s": round(count / seconds, 2), "rss_after_model_mb": round(rss_model / 1024, 1),
        "rss_end_mb": round(rss_end / 1024, 1), "peak_rss_mb": round(max(_peak_kib(), _status_kib("VmHWM")) / 1024, 1),
        "imgsz": args.imgsz or model.imgsz, "batch": args.batch or model.default_batch,
        "torch_threads": torch.get_num_threads(),
    }))


def machine() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            info["cpu"] = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
        with open("/proc/meminfo", encoding="ascii") as f:
            info["mem_total_gb"] = round(int(f.readline().split()[1]) / 1024**2, 1)
    except OSError:
        pass
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--imgsz", type=int, default=None, help="network input size (default: the model's, 640)")
    ap.add_argument("--batch", type=int, default=None, help="predict batch (default: predict()'s default)")
    ap.add_argument("--modes", nargs="+", default=["list", "stream"], choices=["list", "stream"])
    ap.add_argument("--out", type=Path, default=None, help="JSON path (default: bench/results/<date>-...json)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="list", help=argparse.SUPPRESS)
    ap.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return

    import torch

    rows = []
    with tempfile.TemporaryDirectory(prefix="predict-memory-") as tmp:
        folder = Path(tmp)
        t = time.perf_counter()
        make_images(folder, args.images)
        print(f"wrote {args.images} images to {folder} in {time.perf_counter() - t:.1f} s", flush=True)
        for mode in args.modes:
            cmd = [sys.executable, __file__, "--child", "--mode", mode, "--folder", str(folder)]
            cmd += [] if args.imgsz is None else ["--imgsz", str(args.imgsz)]
            cmd += [] if args.batch is None else ["--batch", str(args.batch)]
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            if out.returncode:
                sys.exit(f"{mode} run failed:\n{out.stderr}")
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["within_limit"] = row["peak_rss_mb"] * 1024**2 <= LIMIT_BYTES
            rows.append(row)
            print(f"{mode}: done in {row['seconds']} s", flush=True)

    head = f"{'mode':<8}{'images':>8}{'imgsz':>7}{'batch':>7}{'peak RSS MB':>13}{'RSS model MB':>14}" \
           f"{'RSS end MB':>12}{'img/s':>8}{'<= 1.5 GB':>11}"
    print(head)
    for r in rows:
        print(f"{r['mode']:<8}{r['images']:>8}{r['imgsz']:>7}{r['batch']:>7}{r['peak_rss_mb']:>13}"
              f"{r['rss_after_model_mb']:>14}{r['rss_end_mb']:>12}{r['images_per_s']:>8}{str(r['within_limit']):>11}")
    record = {
        "benchmark": "predict_memory_bench", "date": datetime.date.today().isoformat(),
        "command": " ".join(([f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}"] if "OMP_NUM_THREADS" in os.environ
                             else []) + ["python", *sys.argv]),
        "torch": torch.__version__, "machine": machine(), "model": "LibreYOLO9t.yaml (untrained)",
        "images": args.images, "image_sizes": "random 320..800 x 240..600 JPEG, seed 0", "limit_bytes": LIMIT_BYTES,
        "rows": rows,
    }
    path = args.out or ROOT / "bench" / "results" / f"{record['date']}-predict-memory-cpu.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
