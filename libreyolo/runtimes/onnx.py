"""ONNX Runtime: CUDA (and TensorRT) execution providers when present, else the CPU.

On a CUDA session whose input already lives on the GPU, inputs and outputs are bound in
device memory (IO binding), so no image travels through the host.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from libreyolo.errors import ArgumentError, CheckpointError, require
from libreyolo.export.metadata import check_integrity, decode, onnx_content_sha256
from libreyolo.runtimes.base import ArtifactPredictor, check_artifact_file, check_graph, check_metadata
from libreyolo.utils.checks import parse_bool, resolve_device


def _providers(ort: Any, device: torch.device | None, requested: list | None) -> list:
    available = ort.get_available_providers()
    if requested:
        missing = [p if isinstance(p, str) else p[0] for p in requested
                   if (p if isinstance(p, str) else p[0]) not in available]
        if missing:
            raise ArgumentError(f"ONNX Runtime providers {missing} are not available here; available: {available}")
        return requested
    if device is not None and device.type == "cpu":
        return ["CPUExecutionProvider"]
    gpu = [p for p in ("TensorrtExecutionProvider", "CUDAExecutionProvider") if p in available]
    if device is not None and device.type == "cuda":
        if "CUDAExecutionProvider" not in available:
            raise ArgumentError("device=cuda needs onnxruntime with the CUDA provider (pip install onnxruntime-gpu); "
                                f"this onnxruntime offers {available}")
        index = device.index or 0
        return [(p, {"device_id": index}) for p in gpu] + ["CPUExecutionProvider"]
    return gpu + ["CPUExecutionProvider"]


class OnnxPredictor(ArtifactPredictor):
    format = "onnx"

    def __init__(self, path: Path, meta: dict[str, Any], session: Any, ort: Any) -> None:
        super().__init__(path, meta)
        self.session = session
        self._ort = ort
        self.providers = session.get_providers()
        on_gpu = self.providers[0] in ("CUDAExecutionProvider", "TensorrtExecutionProvider")
        self._device = torch.device("cuda", self._device_id()) if on_gpu and torch.cuda.is_available() \
            else torch.device("cpu")

    def _device_id(self) -> int:
        opts = self.session.get_provider_options().get("CUDAExecutionProvider", {})
        return int(opts.get("device_id", 0))

    @property
    def device(self) -> torch.device:
        return self._device

    def describe(self) -> str:
        return f"onnxruntime {self._ort.__version__} [{self.providers[0]}]"

    def _run(self, batch: torch.Tensor) -> list[torch.Tensor]:
        if batch.is_cuda:
            return self._run_bound(batch)
        outs = self.session.run(list(self.output_names), {self.input_name: batch.numpy()})
        return [torch.from_numpy(np.ascontiguousarray(o)) for o in outs]

    def _run_bound(self, batch: torch.Tensor) -> list[torch.Tensor]:
        binding = self.session.io_binding()
        elem = {torch.float16: np.float16, torch.uint8: np.uint8}.get(batch.dtype, np.float32)
        binding.bind_input(self.input_name, "cuda", batch.device.index or 0, elem, tuple(batch.shape),
                           batch.data_ptr())
        for name in self.output_names:
            binding.bind_output(name, "cuda", batch.device.index or 0)
        self.session.run_with_iobinding(binding)
        outs = []
        for value in binding.get_outputs():
            try:  # zero-copy hand-over where this onnxruntime build exports DLPack
                outs.append(torch.from_dlpack(value.to_dlpack()))
            except (AttributeError, RuntimeError, TypeError):
                outs.append(torch.from_numpy(value.numpy()).to(batch.device))
        return outs


def _shapes(values: Any) -> dict[str, tuple]:
    """{name: shape} of graph inputs or outputs; None for a symbolic (dynamic) axis."""
    out = {}
    for v in values:
        dims = v.type.tensor_type.shape.dim
        out[v.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in dims)
    return out


_ONNX_FLOATS = {1: "float32", 10: "float16", 2: "uint8"}  # TensorProto.DataType


def _check_input_dtype(meta: dict[str, Any], inputs: list, where: str) -> None:
    """The metadata's ``input_dtype`` is the graph's: predict() feeds what the metadata says."""
    for v in inputs:
        if v.name == meta["input_name"]:
            graph = _ONNX_FLOATS.get(v.type.tensor_type.elem_type, f"ONNX type {v.type.tensor_type.elem_type}")
            if graph != meta["input_dtype"]:
                raise CheckpointError(f"{where}: 'input_dtype' is {meta['input_dtype']!r} but the graph's input "
                                      f"{v.name!r} is {graph}; the metadata does not describe this artifact (edited "
                                      "or damaged): re-export it")


def load(path: str | Path, device: str | torch.device | None = None, *, providers: list | None = None,
         verify: bool = True, **kw: Any) -> OnnxPredictor:
    """Open an exported ``.onnx`` with ONNX Runtime. ``providers`` overrides the automatic choice.

    The metadata is checked against the graph's input and output shapes; with ``verify`` (the
    default) the model bytes and the metadata are checked against the hashes stored at export.
    The session is created from the bytes that were checked.
    """
    if kw:
        raise TypeError(f"unexpected arguments for an ONNX model: {sorted(kw)}")
    verify = parse_bool("verify", verify)
    dev = resolve_device(device)
    path = check_artifact_file(path, "ONNX")
    ort = require("onnxruntime", "onnx", "running an ONNX model")
    onnx = require("onnx", "onnx", "reading ONNX metadata")
    try:
        data = path.read_bytes()
        model = onnx.load_from_string(data)
        content = onnx_content_sha256(data)
    except Exception as exc:
        raise CheckpointError(f"{path} is not a readable ONNX file ({type(exc).__name__}: {exc})") from None
    props = {p.key: p.value for p in model.metadata_props}
    if verify:  # first: a file changed since export is named as such, before any field is interpreted
        check_integrity(props, content, str(path))
    meta = decode(props, str(path))
    family, *_ = check_metadata(meta, str(path))
    initializers = {t.name for t in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in initializers]
    check_graph(meta, family, _shapes(inputs), _shapes(model.graph.output), str(path))
    _check_input_dtype(meta, inputs, str(path))
    del model
    try:
        options = ort.SessionOptions()
        # ORT's worker threads otherwise spin after each run and starve the torch pre/post-
        # processing that follows on the same cores (seen: predict() 3.6x the bare forward)
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        session = ort.InferenceSession(data, sess_options=options, providers=_providers(ort, dev, providers))
    except Exception as exc:
        raise CheckpointError(f"ONNX Runtime cannot load {path}: {exc}") from None
    return OnnxPredictor(path, meta, session, ort)
