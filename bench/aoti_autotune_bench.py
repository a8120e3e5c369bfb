"""The autotuned AOTInductor artifact at batch 1: compile time, and predict() through it.

    PYTHONPATH=. python3 bench/aoti_autotune_bench.py --model <checkpoint> \
        --json bench/results/<date>-aoti-autotune-h200.json

Exports ``format=aoti, autotune=True`` (Inductor max-autotune: kernel configurations benchmarked
at compile time) in fp16 at batch 1 on CUDA, then times, in the same process: ``predict()`` of
the sample image (640x480 at 640) through the package, eagerly and graphed (the package replayed
from our whole-pipeline CUDA graph), and the eager model's graphed fp16 predict for comparison.
With ``--compare-default`` the package
compiled without autotune is exported and timed the same way after. Median ms over ``--n`` calls
after ``--warmup``. CUDA only (autotune applies to CUDA packages).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from libreyolo import SAMPLE_IMAGE, LibreYOLO  # noqa: E402


def timed(call, n: int, warmup: int) -> float:
    for _ in range(warmup):
        call()
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e3)
    return round(statistics.median(times), 3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="LibreYOLO9t.yaml")
    ap.add_argument("--out-dir", default="/tmp/aoti-autotune")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--json", required=True)
    ap.add_argument("--compare-default", action="store_true",
                    help="after timing, export the same package without autotune and time it the same way")
    ap.add_argument("--time-after", default=None, metavar="FILE",
                    help="after the export, wait (at most 15 min) until FILE exists before timing: lets other "
                         "device work started beside the export finish first")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("aoti_autotune_bench needs CUDA (autotune applies to CUDA packages)")
    import numpy as np
    from PIL import Image

    frame = np.asarray(Image.open(SAMPLE_IMAGE).convert("RGB").resize((640, 480)))[:, :, ::-1].copy()
    model = LibreYOLO(args.model, device="cuda")
    rows: dict[str, object] = {}
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every stage: a run stopped by its time limit keeps what it measured
        report_json = {"command": " ".join([sys.executable, *sys.argv]), "gpu": torch.cuda.get_device_name(0),
                       "torch": torch.__version__, "model": args.model, "rows": rows}
        out.write_text(json.dumps(report_json, indent=1, default=str) + "\n")

    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    report = model.export(format="aoti", device="cuda", half=True, autotune=True,
                          output=Path(args.out_dir) / "yolo9-autotune-fp16.pt2", verbose=False)
    rows["export_s"] = round(time.perf_counter() - t0, 1)
    rows["validation"] = report.validation.status
    print(f"export (autotune) {rows['export_s']} s, validation {rows['validation']}", flush=True)
    save()
    if args.time_after:
        waited = time.perf_counter()
        while not Path(args.time_after).exists() and time.perf_counter() - waited < 900:
            time.sleep(1)
        rows["waited_before_timing_s"] = round(time.perf_counter() - waited, 1)
        print(f"waited {rows['waited_before_timing_s']} s for {args.time_after}", flush=True)
    art = LibreYOLO(str(report.path), device="cuda")
    from libreyolo.export.aoti import read_build_info

    rows["build"] = read_build_info(report.path)
    # timed after the export (the compile's kernel benchmarking and any job started beside it are over)
    rows["eager_model_graph_fp16_ms"] = timed(lambda: model(frame, half=True, cuda_graph=True), args.n, args.warmup)
    print(f"eager model, graphed fp16 b1: {rows['eager_model_graph_fp16_ms']} ms", flush=True)
    rows["aoti_autotune_fp16_ms"] = timed(lambda: art(frame), args.n, args.warmup)
    rows["aoti_autotune_fp16_graph_ms"] = timed(lambda: art(frame, cuda_graph=True), args.n, args.warmup)
    same = [len(model(frame, half=True).boxes), len(art(frame).boxes), len(art(frame, cuda_graph=True).boxes)]
    rows["detections_eager_aoti_aoti_graph"] = same
    for k in ("aoti_autotune_fp16_ms", "aoti_autotune_fp16_graph_ms"):
        print(f"{k}: {rows[k]} ms (target <= 1.5 ms)", flush=True)
    save()
    if args.compare_default:
        t0 = time.perf_counter()
        plain = model.export(format="aoti", device="cuda", half=True, output=Path(args.out_dir) / "yolo9-fp16.pt2",
                             verbose=False)
        rows["default_export_s"] = round(time.perf_counter() - t0, 1)
        rows["default_validation"] = plain.validation.status
        default_art = LibreYOLO(str(plain.path), device="cuda")
        rows["aoti_default_fp16_ms"] = timed(lambda: default_art(frame), args.n, args.warmup)
        rows["aoti_default_fp16_graph_ms"] = timed(lambda: default_art(frame, cuda_graph=True), args.n, args.warmup)
        print(f"without autotune: export {rows['default_export_s']} s, {rows['aoti_default_fp16_ms']} ms, "
              f"graphed {rows['aoti_default_fp16_graph_ms']} ms", flush=True)
    save()
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
