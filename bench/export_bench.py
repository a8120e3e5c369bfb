"""Time each artifact's predict() next to eager predict() and the bare runtime forward.

    python bench/export_bench.py [--model LibreYOLO9t.yaml] [--imgsz 640] [--runs 20]
                                 [--formats onnx,executorch,aoti] [--json bench/results/DATE-export-cpu.json]

Rows: eager PyTorch predict() (which runs the Conv-BN-folded inference copy), the master
network's forward and the inference copy's forward; for each artifact its predict() (letterbox
+ runtime + decode, the same pipeline) and the bare runtime call on a prepared input (ONNX
Runtime ``session.run``, ExecuTorch ``method.execute``, the AOTInductor compiled model's call),
so the overhead of predict() over the runtime is visible (target: within 1.2x). ``aoti`` rows
also record the package's compile time. On a machine with CUDA, ONNX Runtime on the GPU is
added. Median of ``--runs`` after ``--warmup`` runs, one image (the bundled sample), batch 1.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.export.metadata import package_version


def timed(fn: Any, runs: int, warmup: int) -> dict[str, Any]:
    """Median/min wall time; for predict() also the median of each stage it reports in ``speed``."""
    for _ in range(warmup):
        fn()
    samples, stages = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        samples.append((time.perf_counter() - t0) * 1e3)
        if hasattr(out, "speed"):
            stages.append(out.speed)
    row: dict[str, Any] = {"median_ms": statistics.median(samples), "min_ms": min(samples), "runs": runs}
    if stages:
        row["stages_median_ms"] = {k: statistics.median(s[k] for s in stages) for k in stages[0]}
    return row


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gcc_version() -> str | None:
    import subprocess

    try:
        return subprocess.run(["c++", "--version"], capture_output=True, text=True, timeout=10).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return None


def bare_forward(runtime: Any, batch: torch.Tensor) -> Any:
    """The runtime's own call on a ready input, without our pre/post-processing."""
    if runtime.format == "onnx":
        feed = {runtime.input_name: batch.numpy()}
        return lambda: runtime.session.run(None, feed)
    if runtime.format == "executorch":
        return lambda: runtime.method.execute([batch])
    if runtime.format == "aoti":
        return lambda: runtime.compiled(batch)
    return lambda: runtime._run(batch)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="LibreYOLO9t.yaml")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--conf", type=float, default=0.25)
    parser.add_argument("--formats", default="onnx,executorch")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    model = LibreYOLO(args.model)
    formats = [f for f in args.formats.split(",") if f]
    rows: list[dict[str, Any]] = []
    kw = {"conf": args.conf, "imgsz": args.imgsz}
    rows.append({"name": "eager predict()", "device": "cpu",
                 **timed(lambda: model.predict(SAMPLE_IMAGE, **kw), args.runs, args.warmup)})
    batch, _ = model.family.letterbox(args.imgsz)([__import__("libreyolo.data.sources", fromlist=["x"])
                                                   .load_sources(SAMPLE_IMAGE)[0].data])
    with torch.inference_mode():
        rows.append({"name": "eager network forward", "device": "cpu",
                     **timed(lambda: model.net(batch), args.runs, args.warmup)})
        copy = model.inference_copy()
        rows.append({"name": "eager inference-copy forward", "device": "cpu", "folded": copy.folded,
                     **timed(lambda: copy.module(batch), args.runs, args.warmup)})
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in formats:
            suffix = {"onnx": ".onnx", "executorch": ".pte", "aoti": ".pt2"}[fmt]
            try:
                report = model.export(format=fmt, imgsz=args.imgsz, output=Path(tmp) / f"m{suffix}", verbose=False)
            except Exception as exc:  # a missing toolchain is a row, not a crash
                rows.append({"name": f"{fmt}: not run", "device": "-", "error": str(exc).splitlines()[0]})
                continue
            devices = ["cpu"]
            if fmt == "onnx" and torch.cuda.is_available():
                import onnxruntime

                if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
                    devices.append("cuda")
                else:
                    rows.append({"name": "onnx predict()", "device": "cuda",
                                 "error": "not run: this onnxruntime has no CUDA provider (onnxruntime-gpu)"})
            for dev in devices:
                runtime = LibreYOLO(report.path, device=dev)

                def run(r: Any = runtime) -> Any:
                    return r.predict(SAMPLE_IMAGE, conf=args.conf)

                extra = {"compile_s": runtime.build.get("compile_s")} if fmt == "aoti" else {}
                rows.append({"name": f"{fmt} predict()", "device": dev, "runtime": runtime.describe(), **extra,
                             **timed(run, args.runs, args.warmup)})
                if dev == "cpu":
                    rows.append({"name": f"{fmt} bare runtime forward", "device": dev, "runtime": runtime.describe(),
                                 **timed(bare_forward(runtime, batch.contiguous()), args.runs, args.warmup)})
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%d"), "model": args.model, "imgsz": args.imgsz, "batch": 1,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "onnxruntime": package_version("onnxruntime"), "executorch": package_version("executorch"),
                     "gcc": _gcc_version()},
        "cpu": cpu_name(), "cpu_threads": torch.get_num_threads(),
        # OpenMP spin-waiting (torch eager and AOTInductor CPU kernels) collapses on a shared machine:
        # record how it was set (ONNX Runtime's spinning is turned off by our loader)
        "env": {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")},
        "load_average": os.getloadavg(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "rows": rows,
    }
    print(f"{'what':<32} {'device':<6} {'median ms':>10} {'min ms':>8}  pre / inference / post ms")
    for row in rows:
        if "median_ms" in row:
            st = row.get("stages_median_ms")
            parts = " / ".join(f"{st[k]:.1f}" for k in ("preprocess", "inference", "postprocess")) if st else ""
            print(f"{row['name']:<32} {row['device']:<6} {row['median_ms']:>10.1f} {row['min_ms']:>8.1f}  {parts}")
        else:
            print(f"{row['name']:<32} {row['device']:<6} {row.get('error', '')}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
