"""TensorRT export (TensorRT 10 and 11): a strongly typed engine built from our ONNX export.

TensorRT 11 removed weak typing: ``BuilderFlag.FP16``/``INT8``, ``config.int8_calibrator`` and
``platform_has_fast_fp16``/``int8`` are gone, and every network is strongly typed (NVIDIA's 10.x to
11.x migration guide). So the precision lives in the ONNX graph, for both versions:

- fp32: the float32 ONNX; TF32 is switched off (``BuilderFlag.TF32`` cleared where it exists), so
  the engine is the float32 program the validation compares (with TF32 off on both sides);
- ``half=True``: the ONNX traced in float16 on CUDA (the driver casts the network, as for
  ``format=onnx half=True``), float16 input included;
- ``int8=True``: the Q/DQ ONNX of quantize()'s simulated layers (:attr:`Exporter.int8_mode`
  ``"qdq"``, the graph ``format=onnx int8=True`` writes), with exactly quantize()'s scales, which
  the driver checks against the graph's Q/DQ parameters bit for bit.

The network is created with ``NetworkDefinitionCreationFlag.STRONGLY_TYPED`` (required for a
strongly typed build on 10.x, accepted and ignored on 11.x); no precision builder flag is set on
either version (a strongly typed 10.x network refuses them). A timing cache and an engine cache
live in :func:`cache_dir` (``LIBREYOLO_TENSORRT_CACHE``, default ``~/.cache/libreyolo/tensorrt``):
the engine cache is keyed by the ONNX file's sha256, the TensorRT version, the GPU name and the
build options, so the same export on the same GPU copies the engine instead of building it. Build
progress goes to the console through ``IProgressMonitor`` where the TensorRT build has it.

Not validated here: no machine this was written on has TensorRT and an NVIDIA GPU. The build code
is tested against stand-ins shaped like TensorRT 10's and 11's documented Python API
(``tests/test_export_tensorrt.py``); where an engine is built, it is validated like every artifact.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from libreyolo.errors import ArgumentError, MissingDependencyError, require
from libreyolo.export.base import Exporter, ExportError, ExportOptions
from libreyolo.export.formats import get_format
from libreyolo.export.metadata import sidecar_path, write_sidecar
from libreyolo.export.onnx import EXPORTER as ONNX
from libreyolo.export.onnx import check_opset, export_onnx
from libreyolo.utils.log import LOGGER

EXTRA = get_format("tensorrt").extra
DEFAULT_WORKSPACE_GIB = 4.0
SUPPORTED_MAJORS = (10, 11)  # the API generations this module is written for (pyproject: tensorrt>=10.0,<12)
CACHE_ENV = "LIBREYOLO_TENSORRT_CACHE"
SOURCE_SUFFIX = ".source.onnx"  # the ONNX the engine is built from, in the build's work folder


def cache_dir() -> Path:
    """Where the timing cache and the engine cache live."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "libreyolo" / "tensorrt")


def trt_major(trt: Any) -> int:
    """The major version of the imported TensorRT, refused outside :data:`SUPPORTED_MAJORS`."""
    version = str(getattr(trt, "__version__", "0"))
    try:
        major = int(version.split(".")[0])
    except ValueError:
        major = 0
    if major not in SUPPORTED_MAJORS:
        raise MissingDependencyError(f"this LibreYOLO builds TensorRT engines with TensorRT 10 or 11, found tensorrt "
                                     f"{version}: pip install 'libreyolo[{EXTRA}]' (tensorrt>=10.0,<12)")
    return major


def engine_key(onnx_sha256: str, trt_version: str, gpu: str, opts: ExportOptions) -> str:
    """The engine cache key: what decides the engine's bytes."""
    spec = {"onnx": onnx_sha256, "tensorrt": trt_version, "gpu": gpu, "batch": opts.batch, "imgsz": opts.imgsz,
            "dynamic": opts.dynamic, "precision": opts.precision,
            "workspace": opts.workspace if opts.workspace is not None else DEFAULT_WORKSPACE_GIB}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def network_flags(trt: Any) -> int:
    """``create_network`` flags: strongly typed (10.x: opt-in; 11.x: always, the flag is ignored)."""
    flag = getattr(getattr(trt, "NetworkDefinitionCreationFlag", None), "STRONGLY_TYPED", None)
    return 1 << int(flag) if flag is not None else 0


def progress_monitor(trt: Any) -> Any:
    """An ``IProgressMonitor`` logging each build phase to the console, or None where TensorRT has none."""
    base = getattr(trt, "IProgressMonitor", None)
    if base is None:
        return None

    class ConsoleProgress(base):
        def __init__(self) -> None:
            super().__init__()
            self.started: dict[str, float] = {}

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            self.started[phase_name] = time.perf_counter()
            indent = "  " if parent_phase else ""
            LOGGER.info("TensorRT build: %s%s (%d steps)", indent, phase_name, num_steps)

        def step_complete(self, phase_name: str, step: int) -> bool:
            return True  # never cancels

        def phase_finish(self, phase_name: str) -> None:
            took = time.perf_counter() - self.started.pop(phase_name, time.perf_counter())
            LOGGER.info("TensorRT build: %s done in %.1f s", phase_name, took)

    return ConsoleProgress()


def _atomic_bytes(path: Path, data: bytes) -> None:
    from libreyolo.checkpoint import atomic_write

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: tmp.write_bytes(data))


def build_engine(onnx_path: Path, engine_path: Path, opts: ExportOptions, input_name: str, *,
                 trt: Any = None, gpu: str | None = None, cache: Path | None = None) -> dict[str, Any]:
    """Build (or take from the engine cache) a strongly typed engine of ``onnx_path`` at ``engine_path``.

    ``trt``/``gpu``/``cache`` default to the installed ``tensorrt``, the current CUDA device's name and
    :func:`cache_dir` (tests pass stand-ins). Returns what happened (for the metadata)."""
    if trt is None:
        trt = require("tensorrt", EXTRA, "building a TensorRT engine")
    major = trt_major(trt)
    if gpu is None:
        if not torch.cuda.is_available():
            raise ArgumentError("building a TensorRT engine needs an NVIDIA GPU with CUDA; none is available here")
        gpu = torch.cuda.get_device_name(opts.device if opts.device.type == "cuda" else None)
    cache = cache_dir() if cache is None else Path(cache)
    data = Path(onnx_path).read_bytes()
    version = str(trt.__version__)
    key = engine_key(hashlib.sha256(data).hexdigest(), version, gpu, opts)
    info: dict[str, Any] = {"tensorrt": version, "gpu": gpu, "strongly_typed": True, "engine_cache_key": key}
    cached = cache / "engines" / f"{key}.engine"
    if cached.is_file():
        shutil.copyfile(cached, engine_path)
        LOGGER.info("TensorRT engine taken from the engine cache (%s)", cached)
        return {**info, "engine_cache": "hit"}
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(network_flags(trt))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(data):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ExportError(f"TensorRT could not parse the ONNX graph: {errors}")
    config = builder.create_builder_config()
    workspace = opts.workspace if opts.workspace is not None else DEFAULT_WORKSPACE_GIB
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace * (1 << 30)))
    tf32 = getattr(trt.BuilderFlag, "TF32", None)
    if opts.precision == "fp32" and tf32 is not None:
        config.clear_flag(tf32)  # true float32, as the validation compares
    timing_file = cache / f"timing-{version}-{gpu.replace(' ', '_').replace('/', '_')}.cache"
    timing = config.create_timing_cache(timing_file.read_bytes() if timing_file.is_file() else b"")
    config.set_timing_cache(timing, False)
    monitor = progress_monitor(trt)
    if monitor is not None:
        config.progress_monitor = monitor
    else:
        LOGGER.info("TensorRT %s: building the engine (this TensorRT reports no progress)", version)
    if opts.dynamic:
        shape = (opts.batch, 3, opts.imgsz, opts.imgsz)
        profile = builder.create_optimization_profile()
        profile.set_shape(input_name, (1, *shape[1:]), shape, shape)
        config.add_optimization_profile(profile)
    start = time.perf_counter()
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ExportError("TensorRT failed to build the engine (see the TensorRT log above)")
    engine = bytes(serialized)
    engine_path.write_bytes(engine)
    _atomic_bytes(timing_file, bytes(timing.serialize()))
    _atomic_bytes(cached, engine)
    return {**info, "engine_cache": "miss", "build_seconds": round(time.perf_counter() - start, 1),
            "api": f"TensorRT {major}"}


class TensorRTExporter(Exporter, format="tensorrt"):
    toolchain = ("tensorrt", "onnx")

    def check(self, opts: ExportOptions) -> None:
        require("onnx", "onnx", "TensorRT export (the engine is built from an ONNX graph)")
        check_opset(opts)
        if opts.device.type == "cpu" and opts.device_explicit:
            raise ArgumentError("TensorRT engines are built and run on an NVIDIA GPU; device=cpu is not possible")
        if opts.dynamic and opts.batch < 2:
            raise ArgumentError("dynamic=True for tensorrt builds an engine for batch 1..batch: pass the largest "
                                "batch you will run (batch >= 2)")

    def build(self, module: torch.nn.Module, example: torch.Tensor, path: Path, opts: ExportOptions,
              work: Path) -> None:
        onnx_path = path.with_name(path.stem + SOURCE_SUFFIX)
        export_onnx(module, example, onnx_path, opts)
        try:
            info = build_engine(onnx_path, path, opts, module.contract.input_name)
        except MissingDependencyError as exc:
            raise MissingDependencyError(f"{exc}. The ONNX graph the engine is built from was exported fine; "
                                         "on a machine with an NVIDIA GPU run this export again, or export "
                                         "format=onnx and build the engine there with trtexec.") from exc
        LOGGER.info("TensorRT engine: %s", ", ".join(f"{k} {v}" for k, v in info.items()))

    def write_metadata(self, path: Path, encoded: dict[str, str], meta: dict[str, Any]) -> None:
        write_sidecar(path, meta)

    def int8_parameters(self, path: Path) -> dict[str, Any]:
        """The Q/DQ parameters of the ONNX graph the engine was built from (kept in the work folder)."""
        return ONNX.int8_parameters(path.with_name(path.stem + SOURCE_SUFFIX))

    def int8_metadata(self, path: Path, opts: ExportOptions) -> dict[str, Any]:
        return {"tensorrt": "strongly typed INT8 engine from the Q/DQ ONNX of quantize()'s layers (explicit "
                            "quantization: quantize()'s scales)"}

    def companions(self, path: Path) -> list[Path]:
        return [sidecar_path(path)]

    def not_validated_reason(self, opts: ExportOptions) -> str | None:
        return None  # an engine only exists where TensorRT and a GPU are, and there it is run


EXPORTER = TensorRTExporter()
