"""ExecuTorch runtime: runs a ``.pte`` (XNNPACK-delegated) on the CPU.

Metadata comes from the ``.pte.json`` sidecar, checked against the program's sha256.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from libreyolo.errors import ArgumentError, CheckpointError, require
from libreyolo.export.metadata import package_version, read_sidecar
from libreyolo.runtimes.base import ArtifactPredictor, check_artifact_file


class ExecuTorchPredictor(ArtifactPredictor):
    format = "executorch"

    def __init__(self, path: Path, meta: dict[str, Any], method: Any, version: str) -> None:
        super().__init__(path, meta)
        self.method = method
        self._version = version

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def describe(self) -> str:
        return f"executorch {self._version} [XNNPACK, CPU]"

    def _run(self, batch: torch.Tensor) -> list[torch.Tensor]:
        outs = self.method.execute([batch.contiguous()])
        return [o.clone() if isinstance(o, torch.Tensor) else torch.as_tensor(o) for o in outs]


def load(path: str | Path, device: str | torch.device | None = None, **kw: Any) -> ExecuTorchPredictor:
    """Open an exported ``.pte`` with the ExecuTorch runtime (CPU only)."""
    if kw:
        raise TypeError(f"unexpected arguments for an ExecuTorch model: {sorted(kw)}")
    if device is not None and torch.device(device).type != "cpu":
        raise ArgumentError(f"ExecuTorch programs run on the CPU here; got device={device!r}")
    path = check_artifact_file(path, "ExecuTorch")
    meta = read_sidecar(path)
    runtime = require("executorch.runtime", "executorch", "running an ExecuTorch program")
    try:
        program = runtime.Runtime.get().load_program(str(path))
        method = program.load_method("forward")
    except Exception as exc:
        raise CheckpointError(f"ExecuTorch cannot load {path}: {exc}") from None
    return ExecuTorchPredictor(path, meta, method, package_version("executorch") or "unknown")
