"""TensorRT export: an engine built from our ONNX export with the TensorRT Python API.

Steps: argument checks; ONNX export of the same module (fp32 graph, dynamic batch when
``dynamic=True``); then, with ``tensorrt`` and a CUDA GPU, parse it, set fp16 (``half``) and the
workspace limit, add an optimisation profile (batch 1..``batch``, optimum ``batch``), build and
serialise. Without ``tensorrt`` or CUDA the export stops after the ONNX build with an error
that says what is missing; nothing is written. Engines are specific to the GPU model and
TensorRT version that built them. Metadata goes to ``<name>.engine.json``, bound by sha256.

INT8 (``int8=True``, :attr:`Exporter.int8_mode` ``"own"``): the float ONNX graph is built with
``BuilderFlag.INT8`` and an ``IInt8EntropyCalibrator2`` that feeds no batches and hands TensorRT a
calibration cache written from quantize()'s scales (:func:`calibration_cache`): for each quantized
Conv/Gemm, the dynamic range of its input tensor, as TensorRT's symmetric scale ``amax / 127``.
TensorRT folds BatchNorm and picks the weight scales itself (per output channel); tensors without
a cache entry (the layers quantize() keeps in float) stay in float. The cache text is stored in the
metadata (``quantization.tensorrt_calibration_cache``), so ``trtexec --calib`` can reuse it. Not
validated here: TensorRT cannot be installed on the machines this was written on; where it is,
the engine is validated and gated like every INT8 artifact.
"""
from __future__ import annotations

import re
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from libreyolo.errors import ArgumentError, MissingDependencyError, require
from libreyolo.export.base import Exporter, ExportError, ExportOptions
from libreyolo.export.metadata import sidecar_path, write_sidecar
from libreyolo.export.onnx import check_opset, export_onnx

EXTRA = "tensorrt"
DEFAULT_WORKSPACE_GIB = 4.0
CALIBRATOR = "EntropyCalibration2"  # the cache header names the calibrator that reads it
CACHE_NAME = "calibration.cache"     # in the build's work folder
WEIGHT_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def version_tag(version: str) -> str:
    """TensorRT's ``NV_TENSORRT_VERSION`` of a version string, as calibration caches name it:
    ``8.6.1`` -> ``8601`` (major*1000 + minor*100 + patch), ``10.3.0`` -> ``100300`` (from 10 on,
    major*10000 + minor*100 + patch)."""
    parts = [int(p) for p in re.findall(r"\d+", str(version))[:3]]
    if not parts:
        raise ArgumentError(f"not a TensorRT version: {version!r}; pass e.g. '10.3.0'")
    major, minor, patch = (parts + [0, 0])[:3]
    return str(major * (10000 if major >= 10 else 1000) + minor * 100 + patch)


def hex_scale(scale: float) -> str:
    """A float32 as the cache writes it: the big-endian hex of its IEEE-754 bits (``0.5`` -> ``3f000000``)."""
    return struct.pack(">f", float(scale)).hex()


def input_amax(scale: float, zero_point: int) -> float:
    """The largest magnitude of quantize()'s per-tensor affine int8 input range (codes -128..127)."""
    low, high = (-128 - int(zero_point)) * float(scale), (127 - int(zero_point)) * float(scale)
    return max(abs(low), abs(high))


def node_module(node_name: str, prefix: str = "net") -> str | None:
    """The module path of a TorchScript-exported ONNX node: ``/net/a/b/b.0/conv/Conv`` -> ``a.b.0.conv``.

    The exporter names a node by its module scopes, where a child of a container is written
    ``<parent>.<index>`` after its parent's own scope; the last part is the op (``Conv``, ``Conv_1``)."""
    parts = [p for p in node_name.split("/") if p][:-1]
    if not parts or parts[0] != prefix:
        return None
    path: list[str] = []
    previous = parts[0]
    for part in parts[1:]:
        name = part[len(previous) + 1:] if part.startswith(previous + ".") else part
        path.append(name)
        previous = part
    return ".".join(path)


def quantized_inputs(quantized_net: torch.nn.Module, onnx_path: str | Path, prefix: str = "net"
                     ) -> dict[str, tuple[float, list[str]]]:
    """``{ONNX tensor name: (amax, [layers])}``: the input tensor of each quantized layer's
    Conv/Gemm node in the float ONNX graph and its dynamic range (the widest, where several
    quantized layers read one tensor). Raises :class:`ExportError` naming a quantized layer that
    has no node in the graph (the cache would silently leave it in float)."""
    onnx = require("onnx", "onnx", "reading an ONNX graph")
    from libreyolo.quant.simulate import QuantConv2d, QuantLinear

    layers = {name: m for name, m in quantized_net.named_modules() if isinstance(m, (QuantConv2d, QuantLinear))}
    if not layers:
        raise ExportError("the quantized model has no quantized layer: there is no TensorRT calibration cache to write")
    graph = onnx.load(str(onnx_path)).graph
    nodes: dict[str, list[Any]] = {}
    for node in graph.node:
        if node.op_type in WEIGHT_OPS:
            module = node_module(node.name, prefix)
            if module is not None:
                nodes.setdefault(module, []).append(node)
    found: dict[str, tuple[float, list[str]]] = {}
    missing = []
    for name, m in layers.items():
        if name not in nodes:
            missing.append(name)
            continue
        amax = input_amax(float(m.quant_input_scale), int(m.quant_input_zero_point))
        for node in nodes[name]:  # a module called twice has one node per call
            tensor = node.input[0]
            old, names = found.get(tensor, (0.0, []))
            found[tensor] = (max(old, amax), [*names, name])
    if missing:
        raise ExportError(f"{len(missing)} quantized layer(s) have no Conv/Gemm node in the ONNX graph the TensorRT "
                          f"engine is built from (first: {', '.join(missing[:3])}), so the calibration cache cannot "
                          "cover them; this is a bug, please report it")
    return found


def calibration_cache(quantized_net: torch.nn.Module, onnx_path: str | Path, version: str,
                      prefix: str = "net") -> str:
    """A TensorRT calibration cache (text) from quantize()'s input ranges: a header line
    ``TRT-<NV_TENSORRT_VERSION>-EntropyCalibration2``, then ``<tensor>: <hex of amax/127>`` per
    tensor that a quantized layer reads. Not validated here (no TensorRT on this machine)."""
    lines = [f"TRT-{version_tag(version)}-{CALIBRATOR}"]
    for tensor, (amax, _) in quantized_inputs(quantized_net, onnx_path, prefix).items():
        lines.append(f"{tensor}: {hex_scale(amax / 127.0)}")
    return "\n".join(lines) + "\n"


def _calibrator(trt: Any, cache: bytes) -> Any:
    """An ``IInt8EntropyCalibrator2`` that feeds no batches and returns ``cache``."""

    class CachedCalibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self) -> None:
            super().__init__()

        def get_batch_size(self) -> int:
            return 1

        def get_batch(self, names: Any) -> None:
            return None  # no batches: every range comes from the cache

        def read_calibration_cache(self) -> bytes:
            return cache

        def write_calibration_cache(self, data: Any) -> None:
            return None

    return CachedCalibrator()


def build_engine(onnx_path: Path, engine_path: Path, opts: ExportOptions, input_name: str,
                 cache: str | Path | None = None) -> None:
    """Parse ``onnx_path`` and serialise a TensorRT engine to ``engine_path`` (``opts.int8``: INT8
    from the calibration cache file ``cache``, see :func:`calibration_cache`)."""
    trt = require("tensorrt", EXTRA, "building a TensorRT engine")
    if not torch.cuda.is_available():
        raise ArgumentError("building a TensorRT engine needs an NVIDIA GPU with CUDA; none is available here")
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ExportError(f"TensorRT could not parse the ONNX graph: {errors}")
    config = builder.create_builder_config()
    workspace = opts.workspace if opts.workspace is not None else DEFAULT_WORKSPACE_GIB
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace * (1 << 30)))
    if opts.half:
        if not builder.platform_has_fast_fp16:
            raise ArgumentError("half=True: this GPU has no fast fp16 path in TensorRT; export in float32")
        config.set_flag(trt.BuilderFlag.FP16)
    if opts.int8:
        if cache is None:
            raise ArgumentError("int8=True: building an INT8 TensorRT engine needs the calibration cache")
        if not builder.platform_has_fast_int8:
            raise ArgumentError("int8=True: this GPU has no fast int8 path in TensorRT; export in float32 or fp16")
        config.set_flag(trt.BuilderFlag.INT8)
        calibrator = _calibrator(trt, Path(cache).read_bytes())  # a local: kept alive until the build
        config.int8_calibrator = calibrator
    shape = (opts.batch, 3, opts.imgsz, opts.imgsz)
    if opts.dynamic:
        profile = builder.create_optimization_profile()
        profile.set_shape(input_name, (1, *shape[1:]), shape, shape)
        config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ExportError("TensorRT failed to build the engine (see the TensorRT log above)")
    engine_path.write_bytes(bytes(serialized))


class TensorRTExporter(Exporter):
    name = "tensorrt"
    suffix = ".engine"
    runtime = "tensorrt"
    extra = EXTRA
    toolchain = ("tensorrt", "onnx")
    dynamic_shapes = True  # dynamic batch through an optimisation profile
    dynamic_spatial = False  # the engine's input size is fixed
    half = "any"           # a builder flag: the ONNX stays float32
    embedded_nms = True
    onnx_options = True
    workspace_option = True
    int8_mode = "own"  # int8=True: BuilderFlag.INT8 with a calibration cache of quantize()'s ranges

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
        onnx_path = work / (path.stem + ".source.onnx")
        export_onnx(module, example.float(), onnx_path, replace(opts, half=False))
        cache = None
        if opts.int8:
            cache = work / CACHE_NAME
            cache.write_text(calibration_cache(opts.calibration.quantized.net, onnx_path, _trt_version()))
        try:
            build_engine(onnx_path, path, opts, module.contract.input_name, cache)
        except MissingDependencyError as exc:
            raise MissingDependencyError(f"{exc}. The ONNX graph the engine is built from was exported fine; "
                                         "on a machine with an NVIDIA GPU run this export again, or export "
                                         "format=onnx and build the engine there with trtexec.") from exc

    def write_metadata(self, path: Path, encoded: dict[str, str], meta: dict[str, Any]) -> None:
        write_sidecar(path, meta)

    def int8_metadata(self, path: Path, opts: ExportOptions) -> dict[str, Any]:
        cache = (path.parent / CACHE_NAME).read_text()
        return {"tensorrt": "INT8 engine (BuilderFlag.INT8) from a calibration cache of quantize()'s input ranges; "
                            "weight scales chosen by TensorRT",
                "tensorrt_calibration_cache": cache}

    def companions(self, path: Path) -> list[Path]:
        return [sidecar_path(path)]

    def not_validated_reason(self, opts: ExportOptions) -> str | None:
        return None  # an engine only exists where TensorRT and a GPU are, and there it is run


def _trt_version() -> str:
    """The installed TensorRT's version (the cache header names it); ``0`` where it is absent (the build
    then stops with the error naming the extra)."""
    try:
        import tensorrt as trt
    except ImportError:
        return "0"
    return str(trt.__version__)


EXPORTER = TensorRTExporter()
