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
from libreyolo.export.metadata import check_integrity, decode, mlpackage_content_sha256, package_version
from libreyolo.runtimes.base import ArtifactPredictor, RuntimeUnavailableError, check_artifact_file, check_metadata
from libreyolo.utils.checks import parse_bool, resolve_device


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
            if self.family.export.image_input:
                # the letterbox gives whole grey levels, so 8-bit RGB carries the input exactly
                arr = (img.float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
                feed: Any = Image.fromarray(np.ascontiguousarray(arr))
            else:  # a normalised tensor input (contract.image_input False)
                feed = img[None].float().numpy()
            out = self.mlmodel.predict({self.input_name: feed})
            for i, name in enumerate(self.output_names):
                per_output[i].append(torch.from_numpy(np.asarray(out[name], dtype=np.float32)))
        return [torch.cat(parts) for parts in per_output]


def read_metadata(path: Path, verify: bool = True) -> dict[str, Any]:
    ct = require("coremltools", "coreml", "reading a CoreML package")
    try:
        mlmodel = ct.models.MLModel(str(path), skip_model_load=True)
        content = mlpackage_content_sha256(path)
    except Exception as exc:
        raise CheckpointError(f"{path} is not a readable CoreML package ({type(exc).__name__}: {exc})") from None
    props = dict(mlmodel.user_defined_metadata)
    if verify:  # first: a file changed since export is named as such, before any field is interpreted
        check_integrity(props, content, str(path))
    meta = decode(props, str(path))
    check_metadata(meta, str(path))
    return meta


def load(path: str | Path, device: str | torch.device | None = None, *, verify: bool = True,
         **kw: Any) -> CoreMLPredictor:
    """Open an exported ``.mlpackage`` (prediction needs macOS).

    With ``verify`` (the default) the package and its metadata are checked against the hashes
    recorded at export.
    """
    if kw:
        raise TypeError(f"unexpected arguments for a CoreML model: {sorted(kw)}")
    verify = parse_bool("verify", verify)
    dev = resolve_device(device) if str(device).strip().lower() != "mps" else None
    if dev is not None and dev.type != "cpu":
        raise ArgumentError(f"CoreML chooses its compute units itself; pass no device (got {str(device)!r})")
    path = check_artifact_file(path, "CoreML", folder=True)
    meta = read_metadata(path, verify)
    if sys.platform != "darwin":
        raise RuntimeUnavailableError(f"{path.name}: CoreML runs only on macOS (this is {sys.platform}); the "
                                      "package and its metadata are fine. Use the ONNX export on this machine.")
    ct = require("coremltools", "coreml", "running a CoreML model")
    return CoreMLPredictor(path, meta, ct.models.MLModel(str(path)))
