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
from libreyolo.export.metadata import decode
from libreyolo.runtimes.base import ArtifactPredictor, check_artifact_file


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
        elem = np.float16 if batch.dtype == torch.float16 else np.float32
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


def load(path: str | Path, device: str | torch.device | None = None, *, providers: list | None = None,
         **kw: Any) -> OnnxPredictor:
    """Open an exported ``.onnx`` with ONNX Runtime. ``providers`` overrides the automatic choice."""
    if kw:
        raise TypeError(f"unexpected arguments for an ONNX model: {sorted(kw)}")
    path = check_artifact_file(path, "ONNX")
    ort = require("onnxruntime", "onnx", "running an ONNX model")
    onnx = require("onnx", "onnx", "reading ONNX metadata")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise CheckpointError(f"{path} is not a readable ONNX file ({type(exc).__name__}: {exc})") from None
    meta = decode({p.key: p.value for p in model.metadata_props}, str(path))
    dev = torch.device(device) if device is not None else None
    try:
        options = ort.SessionOptions()
        # ORT's worker threads otherwise spin after each run and starve the torch pre/post-
        # processing that follows on the same cores (seen: predict() 3.6x the bare forward)
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        session = ort.InferenceSession(str(path), sess_options=options, providers=_providers(ort, dev, providers))
    except Exception as exc:
        raise CheckpointError(f"ONNX Runtime cannot load {path}: {exc}") from None
    return OnnxPredictor(path, meta, session, ort)
