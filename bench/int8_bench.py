"""INT8 artifacts on the CPU: size, predict() latency and mAP50-95 of INT8 against float32.

    PYTHONPATH=. python bench/int8_bench.py [--imgsz 640] [--runs 30] [--warmup 5] [--threads N]
                                            [--calib-images 64] [--val-images 32]
                                            [--json bench/results/<date>-int8-cpu.json]
    PYTHONPATH=. python bench/int8_bench.py --quick     # smoke test: imgsz 160, 2 runs, few images; no JSON

The goal (README, Quantization): an INT8 ONNX artifact (``export(format="onnx", int8=True,
data=...)``) is >= 3.5x smaller than the float32 one, its ``predict()`` on ONNX Runtime's CPU
provider >= 1.5x faster, and its mAP50-95 at most 0.02 lower. This script measures those three
figures; where the CPU's INT8 kernels (ONNX Runtime's QLinear/QDQ fusions on AVX2, AVX512-VNNI,
AVX-VNNI or AMX) cannot reach the goal it reports the measured figure, and the ``goal`` entries
of the JSON say which part was met.

Models (``--models``): the demo detector ``LibreYOLO9t-shapes.pt`` (YOLOv9-t trained on the
shapes dataset) and the untrained YOLOv9-t ``LibreYOLO9t.yaml`` (nc=80). The untrained one has
no meaningful mAP: only its sizes and latencies are reported, and its accuracy gate compares 0
with 0 (drop 0; noted in the table).

Data: a shapes dataset generated here (:func:`libreyolo.train.shapes.make_shapes_dataset`),
``--calib-images`` train images (the INT8 calibration, ours and the reference's) and
``--val-images`` val images (the accuracy gate and the mAP columns).

Rows per model, all on the CPU, batch 1, one shapes val image:

- ``onnx fp32`` / ``onnx int8``: file size (MiB), ``predict(image, conf=0.25)`` latency
  (median and p90 of ``--runs`` calls after ``--warmup``, with the median pre/inference/post
  stages that predict() reports), the bare ``session.run`` on a letterboxed input, and
  mAP50-95 from ``val()`` (demo only). The INT8 export runs with ``max_drop=1`` so the artifact
  is always written and measured; its own gate result is recorded and compared with 0.02 here.
  Should it fail validation against the quantized eager model, it is exported again with
  ``validate=False`` and measured anyway, the failure recorded (``validation_failures``) and the
  row's validation marked FAILED. The untrained model's export and gate use the shapes images
  with 80 class names (its nc).
- ``ort quantize_static``: a reference point, ONNX Runtime's own static quantization of the fp32
  ONNX (QDQ, QUInt8 activations, QInt8 per-channel weights, MinMax), calibrated on the same
  train images preprocessed as predict() does (the artifact's letterbox), the nodes after the
  last convolutions (box decoding; boxes in pixels and scores in [0, 1] concatenated) left in
  float (``--no-ort-keep-tail-float``: quantize them too, as its defaults do); timed on the bare
  ``session.run`` like the two above (apples to apples), and also through predict()/val() when
  our loader accepts the file (``verify=False``: the quantizer rewrites the graph, so the
  export-time hash no longer matches).
- ``pte fp32`` / ``pte int8``: ExecuTorch XNNPACK programs, size and predict() latency; the INT8
  row says why when ``format="executorch", int8=True`` is not available.

Threads: ``--threads`` (default: every core this process may use). ONNX Runtime: our loader
(:func:`libreyolo.runtimes.onnx.load`) has no thread option, so each loaded predictor's session
is replaced by one built from the same bytes and options (spinning off) plus
``intra_op_num_threads``; torch (pre/post-processing, eager val) ``torch.set_num_threads``;
ExecuTorch's XNNPACK threadpool ``_unsafe_reset_threadpool``. What was set is in the JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from libreyolo import LibreYOLO  # noqa: E402
from libreyolo.export.metadata import package_version  # noqa: E402
from libreyolo.train.shapes import CLASSES as NAMES  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from int8_report import GOAL, print_table, summary  # noqa: E402

MODELS = {"demo": ("LibreYOLO9t-shapes.pt", {}), "yolo9t-untrained": ("LibreYOLO9t.yaml", {"nc": 80})}
INT8_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")
MIB = 2 ** 20


# --- the machine --------------------------------------------------------------------------------
def cpu_info() -> dict[str, Any]:
    """lscpu's model name (else /proc/cpuinfo's), core counts and the INT8-relevant ISA flags."""
    import subprocess

    info: dict[str, Any] = {"model": platform.processor() or platform.machine()}
    flags: set[str] = set()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        info["model"] = fields.get("Model name", info["model"])
        for key in ("CPU(s)", "Thread(s) per core", "Core(s) per socket", "Socket(s)"):
            if key in fields:
                info[key] = fields[key]
        flags = set(fields.get("Flags", "").split())
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    if not flags:
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name") and info["model"] in ("", platform.machine()):
                    info["model"] = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
        except OSError:
            pass
    info["int8_flags"] = {f: f in flags for f in INT8_FLAGS}
    info["logical_cpus"] = os.cpu_count()
    info["usable_cpus"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return info


def set_threads(n: int) -> dict[str, Any]:
    torch.set_num_threads(n)
    used: dict[str, Any] = {"requested": n, "torch": torch.get_num_threads(), "onnxruntime_intra_op": n,
                            "onnxruntime_inter_op": 1,
                            "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}}
    try:
        from executorch.extension.pybindings import portable_lib

        portable_lib._unsafe_reset_threadpool(n)
        used["executorch_threadpool"] = portable_lib._threadpool_get_thread_count()
    except Exception as exc:  # noqa: BLE001 - no ExecuTorch, or no threadpool knob: recorded
        used["executorch_threadpool"] = f"not set: {type(exc).__name__}: {exc}"[:300]
    return used


def ort_session(path: Path, threads: int) -> Any:
    """A CPU session as :func:`libreyolo.runtimes.onnx.load` makes it, with ``threads`` intra-op threads."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(Path(path).read_bytes(), sess_options=options, providers=["CPUExecutionProvider"])


def onnx_anatomy(path: Path, threads: int) -> dict[str, Any]:
    """Where an ONNX file's bytes are (initializer MiB per data type) and the op types of the graph
    ONNX Runtime runs after its optimizations (QLinearConv/ConvInteger there: the QDQ pairs were
    fused into integer kernels; Conv with DequantizeLinear: they were not)."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(path))
    by_type: dict[str, float] = {}
    for t in model.graph.initializer:
        name = onnx.TensorProto.DataType.Name(t.data_type)
        by_type[name] = by_type.get(name, 0.0) + len(t.raw_data or onnx.numpy_helper.to_array(t).tobytes()) / MIB
    out: dict[str, Any] = {"initializer_mib": by_type,
                           "metadata_mib": sum(len(p.key) + len(p.value) for p in model.metadata_props) / MIB}
    try:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        optimized = Path(path).with_suffix(".ort-optimized.onnx")
        options.optimized_model_filepath = str(optimized)
        ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
        ops: dict[str, int] = {}
        for node in onnx.load(str(optimized)).graph.node:
            ops[node.op_type] = ops.get(node.op_type, 0) + 1
        out["ort_optimized_ops"] = dict(sorted(ops.items(), key=lambda kv: -kv[1]))
        optimized.unlink()
    except Exception as exc:  # noqa: BLE001 - recorded
        out["ort_optimized_ops"] = f"not read: {fail(exc)}"
    return out


def load_onnx(path: Path, threads: int, verify: bool = True) -> Any:
    runtime = LibreYOLO(path, device="cpu", verify=verify)
    runtime.session = ort_session(path, threads)
    runtime.providers = runtime.session.get_providers()
    return runtime


# --- timing -------------------------------------------------------------------------------------
def timed(fn: Any, runs: int, warmup: int) -> dict[str, Any]:
    """Median, p90 and min wall ms of ``fn()``; for predict() also the median of each stage."""
    for _ in range(warmup):
        fn()
    samples, stages = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        samples.append((time.perf_counter() - t0) * 1e3)
        r = out[0] if isinstance(out, list) and out and hasattr(out[0], "speed") else out
        if hasattr(r, "speed"):
            stages.append(r.speed)
    row: dict[str, Any] = {"median_ms": statistics.median(samples), "p90_ms": percentile(samples, 90),
                           "min_ms": min(samples), "runs": runs, "warmup": warmup}
    if stages:
        row["stages_median_ms"] = {k: statistics.median(s[k] for s in stages) for k in stages[0]}
    return row


def percentile(xs: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default)."""
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q))


def file_mib(path: Path) -> float:
    p = Path(path)
    return (sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size) / MIB


def letterboxed(runtime: Any, files: list[Path], imgsz: int) -> torch.Tensor:
    """``files`` preprocessed exactly as ``runtime.predict()`` does at ``imgsz`` (float32, NCHW)."""
    from libreyolo.data.sources import load_sources

    pre = runtime._preprocessor(imgsz)
    batches = []
    for i in range(0, len(files), 8):
        images = load_sources([str(f) for f in files[i:i + 8]])
        batch, _ = pre([img.to_device(torch.device("cpu")) for img in images], dtype=torch.float32)
        batches.append(batch)
    return torch.cat(batches).contiguous()


def bgr(path: Path) -> np.ndarray:
    from PIL import Image

    return np.ascontiguousarray(np.asarray(Image.open(path).convert("RGB"))[:, :, ::-1])


def fail(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:600]


# --- the rows -----------------------------------------------------------------------------------
class Bench:
    def __init__(self, args: argparse.Namespace, work: Path, data: Path, result: dict) -> None:
        self.args, self.work, self.data, self.result = args, work, data, result
        self.val_kw = {"data": str(data), "imgsz": args.imgsz, "batch": 8, "workers": 0}
        split = data.parent
        # the untrained YOLOv9-t has 80 classes: the same images with 80 names (labels use 0..2)
        self.data80 = split / "data80.yaml"
        head = data.read_text().split("names:")[0]
        self.data80.write_text(head + "names:\n" + "".join(f"  {i}: {NAMES[i] if i < len(NAMES) else f'c{i}'}\n"
                                                           for i in range(80)))
        self.val_files = sorted((split / "images" / "val").glob("*"))
        self.image = bgr(self.val_files[0])

    def predict_row(self, runtime: Any) -> dict[str, Any]:
        a = self.args
        return timed(lambda: runtime.predict(self.image, conf=a.conf), a.runs, a.warmup)

    def raw_row(self, session: Any, x: np.ndarray) -> dict[str, Any]:
        name = session.get_inputs()[0].name
        feed = {name: x}
        return timed(lambda: session.run(None, feed), self.args.runs, self.args.warmup)

    def val_map(self, runtime: Any) -> float:
        return float(runtime.val(**self.val_kw)["mAP50-95"])

    def model_rows(self, key: str) -> dict[str, Any]:
        a = self.args
        name, kw = MODELS[key]
        trained = key == "demo"
        out: dict[str, Any] = {"model": name, "trained": trained, "imgsz": a.imgsz, "rows": {}, "errors": []}
        rows = out["rows"]
        model = LibreYOLO(name, device="cpu", **kw)
        d = self.work / key
        d.mkdir(parents=True, exist_ok=True)

        def step(label: str, fn: Any) -> Any:
            print(f"  [{key}] {label}", flush=True)
            t0 = time.perf_counter()
            try:
                return fn()
            except Exception as exc:  # noqa: BLE001 - a failed row is recorded, the run goes on
                out["errors"].append({"step": label, "error": fail(exc), "traceback": traceback.format_exc()[-2500:]})
                print(f"  [{key}] {label} FAILED: {fail(exc)}", flush=True)
                return None
            finally:
                out.setdefault("step_s", {})[label] = round(time.perf_counter() - t0, 2)

        # fp32 and INT8 ONNX
        fp32 = step("export onnx fp32", lambda: model.export(format="onnx", imgsz=a.imgsz, output=d / "fp32.onnx",
                                                             verbose=False))
        data = str(self.data if trained else self.data80)
        int8 = step("export onnx int8", lambda: self.export_int8(model, "onnx", data, d / "int8.onnx", out))
        x = None
        if fp32 is not None:
            rt = load_onnx(fp32.path, a.threads)
            x = letterboxed(rt, self.val_files[:1], a.imgsz).numpy()
            rows["onnx fp32"] = row = {"path": fp32.path.name, "mib": file_mib(fp32.path),
                                       "export_s": fp32.seconds, "runtime": rt.describe(),
                                       "validation": fp32.metadata.get("validation", {}).get("status")}
            row["anatomy"] = step("anatomy onnx fp32", lambda: onnx_anatomy(fp32.path, a.threads))
            row["predict"] = step("predict onnx fp32", lambda: self.predict_row(rt))
            row["raw_session_run"] = step("raw onnx fp32", lambda: self.raw_row(rt.session, x))
            if trained:
                row["mAP50-95"] = step("val onnx fp32", lambda: self.val_map(rt))
            del rt
        if int8 is not None:
            rt = load_onnx(int8.path, a.threads)
            if x is None:
                x = letterboxed(rt, self.val_files[:1], a.imgsz).numpy()
            meta = int8.metadata
            gate = dict(meta.get("validation", {}).get("accuracy") or {})
            gate.pop("distance_from_float", None)
            status = meta.get("validation", {}).get("status")
            if meta.get("validation_failed_then_unvalidated"):
                status = "FAILED (then exported with validate=False)"
            rows["onnx int8"] = row = {"path": int8.path.name, "mib": file_mib(int8.path),
                                       "export_s": int8.seconds, "runtime": rt.describe(), "validation": status,
                                       "quantization": meta.get("quantization"), "export_gate": gate}
            row["anatomy"] = step("anatomy onnx int8", lambda: onnx_anatomy(int8.path, a.threads))
            row["predict"] = step("predict onnx int8", lambda: self.predict_row(rt))
            row["raw_session_run"] = step("raw onnx int8", lambda: self.raw_row(rt.session, x))
            if trained:
                row["mAP50-95"] = step("val onnx int8", lambda: self.val_map(rt))
            del rt
        # ONNX Runtime's own static quantization of the fp32 file
        if fp32 is not None:
            samples = ((int8.metadata.get("quantization") or {}).get("samples") if int8 is not None else None) \
                or a.calib_images
            ref = step("ort quantize_static", lambda: self.ort_reference(fp32.path, d / "ort_static.onnx",
                                                                         int(samples)))
            if ref is not None:
                rows["ort quantize_static"] = ref
                sess = ort_session(ref["file"], a.threads)
                ref["anatomy"] = step("anatomy ort static", lambda: onnx_anatomy(ref["file"], a.threads))
                ref["raw_session_run"] = step("raw ort static", lambda: self.raw_row(sess, x))
                rt = step("load ort static (verify=False)", lambda: load_onnx(ref["file"], a.threads, verify=False))
                if rt is not None:
                    ref["predict"] = step("predict ort static", lambda: self.predict_row(rt))
                    if trained:
                        ref["mAP50-95"] = step("val ort static", lambda: self.val_map(rt))
                ref["file"] = Path(ref["file"]).name
        # ExecuTorch
        if "executorch" in a.formats:
            self.pte_rows(model, d, rows, step, data, out)
        out["summary"] = summary(rows, trained)
        return out

    def export_int8(self, model: Any, fmt: str, data: str, path: Path, out: dict) -> Any:
        """``export(int8=True)`` with ``max_drop=1`` (always written; the drop is judged here). When the
        artifact fails validation against the quantized eager model it is exported again with
        ``validate=False`` so it can still be measured, and the failure is recorded."""
        from libreyolo.export.base import ExportError

        kw = {"format": fmt, "int8": True, "data": data, "imgsz": self.args.imgsz, "max_drop": 1.0,
              "output": path, "verbose": False}
        try:
            return model.export(**kw)
        except ExportError as exc:
            if type(exc).__name__ != "ValidationFailed":
                raise
            out.setdefault("validation_failures", {})[fmt] = str(exc)[:4000]
            print(f"  {fmt} int8: validation FAILED ({fail(exc)}); re-exported with validate=False to measure it",
                  flush=True)
            report = model.export(**kw, validate=False)
            report.metadata["validation_failed_then_unvalidated"] = True
            return report

    def ort_reference(self, fp32_path: Path, out_path: Path, samples: int) -> dict[str, Any]:
        from onnxruntime.quantization import (
            CalibrationDataReader,
            CalibrationMethod,
            QuantFormat,
            QuantType,
            quantize_static,
        )

        from libreyolo.quant.calibrate import calibration_images

        files, origin = calibration_images(str(self.data))
        files = files[:samples]
        rt = LibreYOLO(fp32_path, device="cpu")
        batch = letterboxed(rt, files, self.args.imgsz).numpy()

        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self.items = iter([{rt.input_name: batch[i:i + 1]} for i in range(batch.shape[0])])

            def get_next(self) -> dict | None:
                return next(self.items, None)

        exclude = decode_tail(fp32_path) if self.args.ort_keep_tail_float else []
        import logging

        logging.getLogger().setLevel(logging.ERROR)  # one "Expected bias ... initializer" line per Conv
        t0 = time.perf_counter()
        quantize_static(str(fp32_path), str(out_path), Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True,
                        calibrate_method=CalibrationMethod.MinMax, nodes_to_exclude=exclude)
        return {"file": str(out_path), "mib": file_mib(out_path), "quantize_s": time.perf_counter() - t0,
                "calibration": {"images": len(files), "origin": origin, "method": "MinMax",
                                "format": "QDQ", "activations": "QUInt8 per-tensor",
                                "weights": "QInt8 per-channel"},
                "nodes_kept_float": len(exclude),
                "kept_float_ops": sorted({op for op in decode_tail(fp32_path, ops=True)}) if exclude else []}

    def pte_rows(self, model: Any, d: Path, rows: dict, step: Any, data: str, out: dict) -> None:
        a = self.args
        for tag in ("pte fp32", "pte int8"):
            def export(tag: str = tag) -> Any:
                if tag == "pte int8":
                    return self.export_int8(model, "executorch", data, d / "int8.pte", out)
                return model.export(format="executorch", imgsz=a.imgsz, output=d / "fp32.pte", verbose=False)

            try:
                print(f"  export {tag}", flush=True)
                report = export()
            except Exception as exc:  # noqa: BLE001 - ArgumentError/ExportError: the row says why
                rows[tag] = {"not_available": fail(exc)}
                print(f"  {tag}: not available: {fail(exc)}", flush=True)
                continue
            rt = LibreYOLO(report.path, device="cpu")
            row = rows[tag] = {"path": report.path.name, "mib": file_mib(report.path), "export_s": report.seconds,
                               "runtime": rt.describe(),
                               "validation": report.metadata.get("validation", {}).get("status")}
            if tag == "pte int8":
                gate = dict(report.metadata.get("validation", {}).get("accuracy") or {})
                gate.pop("distance_from_float", None)
                row["export_gate"] = gate
            row["predict"] = step(f"predict {tag}", lambda rt=rt: self.predict_row(rt))
            x = letterboxed(rt, self.val_files[:1], a.imgsz)
            row["raw_method_execute"] = step(f"raw {tag}", lambda rt=rt, x=x: timed(
                lambda: rt.method.execute([x]), a.runs, a.warmup))


def decode_tail(path: Path, ops: bool = False) -> list[str]:
    """The nodes after the last convolutions (no Conv downstream of them: box decoding, sigmoid,
    the concatenation of boxes in pixels with scores in [0, 1]), which ONNX Runtime's quantizer
    would otherwise put through one uint8 range. Their names (op types with ``ops``)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    feeds: dict[int, bool] = {}

    def feeds_conv(node: Any) -> bool:
        key = id(node)
        if key not in feeds:
            feeds[key] = False
            feeds[key] = any(c.op_type == "Conv" or feeds_conv(c) for o in node.output for c in consumers.get(o, []))
        return feeds[key]

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))
    tail = [n for n in graph.node if n.op_type != "Conv" and not feeds_conv(n)]
    return [n.op_type for n in tail] if ops else [n.name for n in tail]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="default: every core this process may use")
    ap.add_argument("--calib-images", type=int, default=64, help="train split: the INT8 calibration")
    ap.add_argument("--val-images", type=int, default=32, help="val split: the accuracy gate and mAP")
    ap.add_argument("--conf", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=0, help="of the generated shapes dataset")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--ort-keep-tail-float", action=argparse.BooleanOptionalAction, default=True,
                    help="ORT reference: leave the nodes after the last convolutions (box decoding) in float")
    ap.add_argument("--formats", default="onnx,executorch", help="executorch: add the .pte rows")
    ap.add_argument("--json", type=Path, default=None,
                    help="default bench/results/<date>-int8-cpu.json (none with --quick)")
    ap.add_argument("--quick", action="store_true", help="smoke test: imgsz 160, 2 runs, few images, no JSON "
                                                         "unless --json")
    args = ap.parse_args(argv)
    if args.quick:
        args.imgsz, args.runs, args.warmup, args.calib_images, args.val_images = 160, 2, 1, 4, 4
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    args.threads = args.threads or usable
    if args.json is None and not args.quick:
        args.json = ROOT / "bench" / "results" / f"{time.strftime('%Y-%m-%d')}-int8-cpu.json"
    models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        ap.error(f"unknown --models {unknown}; choose from {sorted(MODELS)}")
    threads = set_threads(args.threads)
    from libreyolo import __version__

    result: dict[str, Any] = {
        "schema": 1, "date": time.strftime("%Y-%m-%d"), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "quick": args.quick, "cpu": cpu_info(), "threads": threads, "load_average": os.getloadavg(),
        "gpu": None, "device": "cpu",
        "versions": {"python": platform.python_version(), "libreyolo": __version__, "torch": torch.__version__,
                     "onnxruntime": package_version("onnxruntime"), "onnx": package_version("onnx"),
                     "executorch": package_version("executorch")},
        "goal": GOAL, "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "models": {}}
    from libreyolo.train.shapes import make_shapes_dataset

    with tempfile.TemporaryDirectory(prefix="int8_bench_") as tmp:
        work = Path(tmp)
        data = Path(make_shapes_dataset(work / "shapes", n_train=args.calib_images, n_val=args.val_images,
                                        imgsz=args.imgsz, seed=args.seed))
        result["data"] = {"dataset": "shapes (generated)", "train_images": args.calib_images,
                          "val_images": args.val_images, "imgsz": args.imgsz, "seed": args.seed}
        bench = Bench(args, work, data, result)
        for key in models:
            print(f"[{key}]", flush=True)
            result["models"][key] = bench.model_rows(key)
            if args.json:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print_table(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, default=str) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
