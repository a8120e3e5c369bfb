"""CoreML runtime (macOS only): runs a ``.mlpackage`` one image at a time.

Elsewhere ``load`` still checks the package and its metadata, then says that CoreML runs only
on macOS.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from libreyolo.errors import ArgumentError, CheckpointError, require
from libreyolo.export.metadata import decode, package_version
from libreyolo.runtimes.base import ArtifactPredictor, RuntimeUnavailableError, check_artifact_file


class CoreMLPredictor(ArtifactPredictor):
    format = "coreml"

    def __init__(self, path: Path, meta: dict[str, Any], mlmodel: Any) -> None:
        super().__init__(path, meta)
        self.mlmodel = mlmodel

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def describe(self) -> str:
        return f"coremltools {package_version('coremltools')} [CoreML]"

    def _run(self, batch: torch.Tensor) -> list[torch.Tensor]:
        from PIL import Image

        per_output: list[list[torch.Tensor]] = [[] for _ in self.output_names]
        for img in batch:
            # the letterbox gives whole grey levels, so 8-bit RGB carries the input exactly
            arr = (img.float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
            out = self.mlmodel.predict({self.input_name: Image.fromarray(np.ascontiguousarray(arr))})
            for i, name in enumerate(self.output_names):
                per_output[i].append(torch.from_numpy(np.asarray(out[name], dtype=np.float32)))
        return [torch.cat(parts) for parts in per_output]


def read_metadata(path: Path) -> dict[str, Any]:
    ct = require("coremltools", "coreml", "reading a CoreML package")
    try:
        mlmodel = ct.models.MLModel(str(path), skip_model_load=True)
    except Exception as exc:
        raise CheckpointError(f"{path} is not a readable CoreML package ({type(exc).__name__}: {exc})") from None
    return decode(dict(mlmodel.user_defined_metadata), str(path))


def load(path: str | Path, device: str | torch.device | None = None, **kw: Any) -> CoreMLPredictor:
    """Open an exported ``.mlpackage`` (prediction needs macOS)."""
    if kw:
        raise TypeError(f"unexpected arguments for a CoreML model: {sorted(kw)}")
    if device is not None and torch.device(device).type != "cpu":
        raise ArgumentError(f"CoreML chooses its compute units itself; pass no device (got {device!r})")
    path = check_artifact_file(path, "CoreML")
    meta = read_metadata(path)
    if sys.platform != "darwin":
        raise RuntimeUnavailableError(f"{path.name}: CoreML runs only on macOS (this is {sys.platform}); the "
                                      "package and its metadata are fine. Use the ONNX export on this machine.")
    ct = require("coremltools", "coreml", "running a CoreML model")
    return CoreMLPredictor(path, meta, ct.models.MLModel(str(path)))
