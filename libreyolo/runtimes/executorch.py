"""ExecuTorch runtime: runs a ``.pte`` (XNNPACK-delegated) on the CPU.

Metadata comes from the ``.pte.json`` sidecar, checked against the program's sha256.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from libreyolo.errors import ArgumentError, CheckpointError, require
from libreyolo.export.metadata import package_version, read_sidecar
from libreyolo.runtimes.base import ArtifactPredictor, check_artifact_file, check_graph, check_metadata
from libreyolo.utils.checks import parse_bool, resolve_device


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


def load(path: str | Path, device: str | torch.device | None = None, *, verify: bool = True,
         **kw: Any) -> ExecuTorchPredictor:
    """Open an exported ``.pte`` with the ExecuTorch runtime (CPU only).

    With ``verify`` (the default) the program and its sidecar metadata are checked against the
    hashes recorded at export; the metadata is checked against the program's tensor shapes.
    """
    if kw:
        raise TypeError(f"unexpected arguments for an ExecuTorch model: {sorted(kw)}")
    verify = parse_bool("verify", verify)
    dev = resolve_device(device)
    if dev is not None and dev.type != "cpu":
        raise ArgumentError(f"ExecuTorch programs run on the CPU here; got device={str(dev)!r}")
    path = check_artifact_file(path, "ExecuTorch")
    meta = read_sidecar(path, verify=verify)
    family, *_ = check_metadata(meta, str(path))
    runtime = require("executorch.runtime", "executorch", "running an ExecuTorch program")
    try:
        program = runtime.Runtime.get().load_program(str(path))
        info = program.metadata("forward")
        inputs = [tuple(info.input_tensor_meta(i).sizes()) for i in range(info.num_inputs())]
        outputs = [tuple(info.output_tensor_meta(i).sizes()) for i in range(info.num_outputs())]
        method = program.load_method("forward")
    except Exception as exc:
        raise CheckpointError(f"ExecuTorch cannot load {path}: {exc}") from None
    if len(inputs) != 1 or len(outputs) != len(meta["output_names"]):
        raise CheckpointError(f"{path}: the program takes {len(inputs)} input(s) and returns {len(outputs)} "
                              f"output(s), but its metadata names 1 input and {len(meta['output_names'])} outputs; "
                              "re-export it")
    check_graph(meta, family, {meta["input_name"]: inputs[0]}, dict(zip(meta["output_names"], outputs, strict=True)),
                str(path))
    return ExecuTorchPredictor(path, meta, method, package_version("executorch") or "unknown")
