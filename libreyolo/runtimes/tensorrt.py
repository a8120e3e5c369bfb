"""TensorRT runtime: runs a serialised engine on an NVIDIA GPU (TensorRT 10 tensor API).

Inputs and outputs stay in CUDA memory as torch tensors; the engine runs on torch's current
stream. Metadata comes from the ``.engine.json`` sidecar, checked against the engine's sha256.
Not exercised on a GPU in this repository's CI (no GPU there); see docs/export.md.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from libreyolo.errors import ArgumentError, CheckpointError, require
from libreyolo.export.metadata import package_version, read_sidecar
from libreyolo.runtimes.base import ArtifactPredictor, RuntimeUnavailableError, check_artifact_file, check_metadata
from libreyolo.utils.checks import parse_bool, resolve_device

_DTYPES = {"FLOAT": torch.float32, "HALF": torch.float16, "INT32": torch.int32, "INT64": torch.int64,
           "BOOL": torch.bool, "INT8": torch.int8}


class TensorRTPredictor(ArtifactPredictor):
    format = "tensorrt"

    def __init__(self, path: Path, meta: dict[str, Any], engine: Any, trt: Any, device: torch.device) -> None:
        super().__init__(path, meta)
        self.engine = engine
        self.context = engine.create_execution_context()
        self._trt = trt
        self._device = device

    @property
    def device(self) -> torch.device:
        return self._device

    def describe(self) -> str:
        return f"tensorrt {self._trt.__version__} [{torch.cuda.get_device_name(self._device)}]"

    def _run(self, batch: torch.Tensor) -> list[torch.Tensor]:
        batch = batch.to(self._device).contiguous()
        self.context.set_input_shape(self.input_name, tuple(batch.shape))
        self.context.set_tensor_address(self.input_name, batch.data_ptr())
        outs = []
        for name in self.output_names:
            shape = tuple(self.context.get_tensor_shape(name))
            dtype = _DTYPES[self.engine.get_tensor_dtype(name).name]
            out = torch.empty(shape, dtype=dtype, device=self._device)
            self.context.set_tensor_address(name, out.data_ptr())
            outs.append(out)
        stream = torch.cuda.current_stream(self._device)
        if not self.context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError(f"TensorRT failed to run {self.path.name}")
        return outs


def load(path: str | Path, device: str | torch.device | None = None, *, verify: bool = True,
         **kw: Any) -> TensorRTPredictor:
    """Open a serialised TensorRT engine (needs ``tensorrt`` and an NVIDIA GPU).

    With ``verify`` (the default) the engine and its sidecar metadata are checked against the
    hashes recorded at export.
    """
    if kw:
        raise TypeError(f"unexpected arguments for a TensorRT engine: {sorted(kw)}")
    verify = parse_bool("verify", verify)
    text = str(device).strip().lower()
    if device is not None and text.split(":")[0] != "cuda" and not text.isdigit():
        raise ArgumentError(f"TensorRT engines run on an NVIDIA GPU; got device={str(device)!r}")
    path = check_artifact_file(path, "TensorRT")
    meta = read_sidecar(path, verify=verify)
    check_metadata(meta, str(path))
    if not torch.cuda.is_available():
        raise RuntimeUnavailableError(f"{path.name}: TensorRT engines need an NVIDIA GPU with CUDA; none is "
                                      "available here (use the ONNX export on this machine)")
    dev = resolve_device(device) or torch.device("cuda", 0)
    trt = require("tensorrt", "tensorrt", "running a TensorRT engine")
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    with torch.cuda.device(dev):
        engine = runtime.deserialize_cuda_engine(path.read_bytes())
    if engine is None:
        raise CheckpointError(f"{path}: TensorRT could not deserialise the engine (corrupt, or built by another "
                              f"TensorRT version or GPU; this is tensorrt {package_version('tensorrt')})")
    return TensorRTPredictor(path, meta, engine, trt, dev)
