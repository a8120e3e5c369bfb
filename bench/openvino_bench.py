"""OpenVINO fp32 and INT8 against ONNX Runtime fp32 on the demo detector, forward ms/image on this CPU.

    python bench/openvino_bench.py [--imgsz 640] [--runs 30] [--threads N] [--out bench/results/...json]

Each artifact is exported through ``model.export``: OpenVINO fp32 and INT8 validated against eager,
the ONNX baseline not (CI validates it); INT8 calibrated on a generated shapes train split and judged
by the accuracy gate on its val split at the default max_drop 0.02 (reported; the IR is written
whatever the gate says, so that its speed is measured). Each is loaded with ``LibreYOLO(path)`` and
timed on the letterboxed sample image at batch 1: the artifact's forward (``_forward``: the runtime
call plus the tensor hand-over), median of ``--runs`` after warm-up, the three interleaved call by
call so that a shared machine's load falls on each alike. Also recorded: OpenVINO
compiling the Q/DQ INT8 ONNX (``format=onnx int8=True``) with its CPU defaults and with the f32
hint, and the export report's measurement of what the CPU's default inference precision would
change. Prints a table and writes JSON with the CPU, the versions and the command. The machine may
be shared: the load average before and after is recorded.
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

import torch

ROOT = Path(__file__).resolve().parents[1]
GATE_MAX_DROP = 0.02  # the INT8 export's default accuracy gate
sys.path.insert(0, str(ROOT))


def cpu_info() -> dict:
    info = {"machine": platform.machine(), "cores": os.cpu_count()}
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        info["model"] = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
        flags = next(line.split(":", 1)[1].split() for line in lines if line.startswith("flags"))
        info["flags"] = sorted(f for f in flags if f.startswith(("avx512", "amx", "avx2", "avx_vnni")))
    except (OSError, StopIteration):
        pass
    return info


def time_forwards(runtimes: list, x: torch.Tensor, runs: int) -> list[dict]:
    """Forward ms of each runtime, interleaved call by call (round ``i`` runs every runtime once), so
    that a shared machine's changing load falls on all of them alike."""
    for runtime in runtimes:
        for _ in range(3):
            runtime._forward(x)
    times: list[list[float]] = [[] for _ in runtimes]
    for _ in range(runs):
        for runtime, bucket in zip(runtimes, times, strict=True):
            t = time.perf_counter()
            runtime._forward(x)
            bucket.append((time.perf_counter() - t) * 1000.0)
    return [{"median_ms": statistics.median(t), "min_ms": min(t), "runs": runs} for t in times]


def qdq_onnx_in_openvino(model, data: str, imgsz: int, folder: Path) -> dict:
    """Compile the Q/DQ INT8 ONNX with OpenVINO's CPU defaults and with the f32 hint."""
    import openvino as ov

    report = model.export(format="onnx", imgsz=imgsz, int8=True, data=data, output=folder / "qdq.onnx",
                          validate=False, verbose=False)
    out = {}
    for name, config in (("defaults", {}), ("f32 hint", {"INFERENCE_PRECISION_HINT": "f32"})):
        try:
            ov.Core().compile_model(str(report.path), "CPU", config)
            out[name] = "compiles"
        except Exception as exc:  # what OpenVINO says
            out[name] = f"fails: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (validation side)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from libreyolo import LibreYOLO, __version__
    from libreyolo.export.metadata import package_version
    from libreyolo.export.validate import sample_batch
    from libreyolo.train.shapes import make_shapes_dataset

    load_before = os.getloadavg()
    model = LibreYOLO("LibreYOLO9t-shapes.pt")
    rows, runtimes, extra = [], [], {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        data = str(make_shapes_dataset(folder / "shapes", n_train=16, n_val=8, imgsz=args.imgsz, seed=3))
        x, _ = sample_batch(model.family, args.imgsz)
        # the ONNX baseline is validated by CI (tests/test_export_onnx.py); the INT8 IR is written whatever its
        # gate says (max_drop=1), so that its speed is measured, and the gate at the default 0.02 is reported
        specs = [("onnxruntime fp32", "onnx", {"validate": False}, "demo.onnx"),
                 ("openvino fp32", "openvino", {}, "demo_openvino_model"),
                 ("openvino int8", "openvino", {"int8": True, "data": data, "max_drop": 1.0},
                  "demo-int8_openvino_model")]
        for label, fmt, opts, name in specs:
            start = time.perf_counter()
            report = model.export(format=fmt, imgsz=args.imgsz, output=folder / name, verbose=False, **opts)
            export_s = time.perf_counter() - start
            runtime = LibreYOLO(report.path)
            runtimes.append(runtime)
            row = {"artifact": label, "runtime": runtime.describe(), "validation": report.validation.status,
                   "export_s": round(export_s, 1)}
            gate = report.metadata["validation"].get("accuracy")
            if gate:
                row["gate"] = {k: gate[k] for k in ("metric", "float", "int8", "drop")}
                row["gate"].update(max_drop=GATE_MAX_DROP, passed=gate["drop"] <= GATE_MAX_DROP)
            finding = report.metadata["validation"].get("findings", {}).get("cpu_default_precision")
            if finding:
                row["cpu_default_precision"] = finding["line"]
            rows.append(row)
            print(f"{label}: exported in {export_s:.0f} s ({row['validation']})", flush=True)
        for row, timing in zip(rows, time_forwards(runtimes, x, args.runs), strict=True):
            row.update(timing)
        extra["qdq_onnx_in_openvino"] = qdq_onnx_in_openvino(model, data, args.imgsz, folder)
    base = rows[0]["median_ms"]
    for row in rows:
        row["speedup_vs_onnxruntime_fp32"] = round(base / row["median_ms"], 2)
    print(f"\n{'artifact':<18} {'forward ms/image':>17} {'vs ORT fp32':>12}  validation / gate")
    for row in rows:
        gate = row.get("gate")
        gate_text = f", gate {gate['metric']} {gate['float']:.4f} -> {gate['int8']:.4f} " \
                    f"({'passed' if gate['passed'] else 'FAILED'})" if gate else ""
        print(f"{row['artifact']:<18} {row['median_ms']:>17.1f} {row['speedup_vs_onnxruntime_fp32']:>11.2f}x  "
              f"{row['validation']}{gate_text}")
    print(f"Q/DQ INT8 ONNX in OpenVINO: {extra['qdq_onnx_in_openvino']}")
    result = {"what": "demo detector (LibreYOLO9t-shapes.pt) forward ms/image, batch 1", "imgsz": args.imgsz,
              "command": " ".join([Path(sys.executable).name, *sys.argv]), "cpu": cpu_info(),
              "load_average_before": load_before, "load_average_after": os.getloadavg(),
              "note": "the CPU is shared with other jobs (see the load averages): timings are indicative",
              "torch_threads": torch.get_num_threads(),
              "versions": {"libreyolo": __version__, "python": platform.python_version(),
                           **{p: package_version(p) for p in ("torch", "openvino", "nncf", "onnxruntime", "onnx")}},
              "rows": rows, **extra}
    out = Path(args.out or ROOT / "bench" / "results" / f"{time.strftime('%Y-%m-%d')}-openvino-cpu.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
