"""TensorRT export: an engine built from our ONNX export with the TensorRT Python API.

Steps: argument checks; ONNX export of the same module (fp32 graph, dynamic batch when
``dynamic=True``); then, with ``tensorrt`` and a CUDA GPU, parse it, set fp16 (``half``) and the
workspace limit, add an optimisation profile (batch 1..``batch``, optimum ``batch``), build and
serialise. Without ``tensorrt`` or CUDA the export stops after the ONNX build with an error
that says what is missing; nothing is written. Engines are specific to the GPU model and
TensorRT version that built them. Metadata goes to ``<name>.engine.json``, bound by sha256.
"""
from __future__ import annotations

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


def build_engine(onnx_path: Path, engine_path: Path, opts: ExportOptions, input_name: str) -> None:
    """Parse ``onnx_path`` and serialise a TensorRT engine to ``engine_path``."""
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
        try:
            build_engine(onnx_path, path, opts, module.contract.input_name)
        except MissingDependencyError as exc:
            raise MissingDependencyError(f"{exc}. The ONNX graph the engine is built from was exported fine; "
                                         "on a machine with an NVIDIA GPU run this export again, or export "
                                         "format=onnx and build the engine there with trtexec.") from exc

    def write_metadata(self, path: Path, encoded: dict[str, str], meta: dict[str, Any]) -> None:
        write_sidecar(path, meta)

    def companions(self, path: Path) -> list[Path]:
        return [sidecar_path(path)]

    def not_validated_reason(self, opts: ExportOptions) -> str | None:
        return None  # an engine only exists where TensorRT and a GPU are, and there it is run


EXPORTER = TensorRTExporter()
