"""What every artifact runtime shares: metadata checks, static-shape handling, the family view.

A runtime subclass implements ``_run`` (one batch through the runtime, exactly the artifact's
input shape) and ``describe``; ``predict()`` is the eager pipeline from
:class:`~libreyolo.engine.predictor.Predictor`, with the family's own letterbox and
postprocessing. An artifact with embedded NMS is decoded by the decoder its family's export
contract names, never by a per-family branch here.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, ClassVar

import torch

from libreyolo.engine.predictor import Predictor
from libreyolo.errors import ArgumentError, CheckpointError, LibreYOLOError
from libreyolo.models.base import Family
from libreyolo.models.registry import get_family


class RuntimeUnavailableError(LibreYOLOError, RuntimeError):
    """The artifact is fine but cannot run on this machine (OS, GPU, missing runtime)."""


class DecodedFamily:
    """A family whose ``postprocess`` is an artifact's embedded-NMS decoder; the rest delegates."""

    def __init__(self, family: Family, decoder: Any) -> None:
        self._family = family
        self._decoder = decoder

    def postprocess(self, outputs: dict[str, torch.Tensor], metas: list, **kw: Any) -> list[dict]:
        return self._decoder(outputs, metas, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._family, name)


class ArtifactPredictor(Predictor):
    """An exported artifact with the eager model's ``predict()``."""

    format: ClassVar[str]

    def __init__(self, path: str | Path, meta: dict[str, Any]) -> None:
        self.path = Path(path)
        self.metadata = meta
        family = get_family(meta["family"])
        self.size = meta["size"]
        self.names = dict(meta["names"])
        self.nc = int(meta.get("nc", len(self.names)))
        self.imgsz = int(meta["imgsz"])
        self.batch = int(meta["batch"])
        self.input_name = meta["input_name"]
        self.output_names = tuple(meta["output_names"])
        axes = meta.get("dynamic_axes") or {}
        self.dynamic_batch = "0" in axes.get(self.input_name, {})
        self.dynamic_spatial = "2" in axes.get(self.input_name, {})
        self.dtype = torch.float16 if meta["input_dtype"] == "float16" else torch.float32
        box = family.letterbox(self.imgsz)
        stored = meta["letterbox"]
        if (box.placement, float(box.pad_value)) != (stored.get("placement"), float(stored.get("pad_value", -1))):
            raise CheckpointError(
                f"{self.path}: exported with letterbox {stored}, but family {family.name} now letterboxes with "
                f"placement={box.placement!r}, pad_value={box.pad_value}; re-export it with this version"
            )
        if meta.get("nms"):
            module_name, _, attr = family.export.nms_decoder.partition(":")
            decoder = getattr(importlib.import_module(module_name), attr)(meta["nms"])
            self.family = DecodedFamily(family, decoder)  # type: ignore[assignment]
        else:
            self.family = family

    # --- to implement ------------------------------------------------------------------------
    def _run(self, batch: torch.Tensor) -> list[torch.Tensor]:
        """Outputs for one batch of exactly the artifact's input shape, in ``output_names`` order."""
        raise NotImplementedError

    def describe(self) -> str:
        return self.format

    # --- shared ------------------------------------------------------------------------------
    @property
    def validation(self) -> dict[str, Any]:
        return self.metadata.get("validation", {"status": "unknown"})

    @property
    def task(self) -> str:
        return self.metadata["task"]

    def _input_dtype(self, half: bool) -> torch.dtype:
        return self.dtype

    def _prepare(self, device: torch.device | None, half: bool) -> None:
        if device is not None and device.type != self.device.type:
            raise ArgumentError(f"this {self.format} model runs on {self.device}; load it with "
                                f"LibreYOLO(path, device={str(device)!r}) instead of passing device to predict()")
        if half and self.dtype != torch.float16:
            raise ArgumentError("half=True needs an artifact exported with half=True; this one is float32")

    def _forward(self, batch: torch.Tensor, *, cuda_graph: bool | str = False) -> dict[str, torch.Tensor]:
        if cuda_graph:
            raise NotImplementedError(f"cuda_graph applies to eager models; a {self.format} artifact runs "
                                      "through its own runtime")
        h, w = int(batch.shape[2]), int(batch.shape[3])
        if not self.dynamic_spatial and (h, w) != (self.imgsz, self.imgsz):
            raise ArgumentError(f"this {self.format} model was exported for imgsz={self.imgsz} (static shape); "
                                f"got {h}x{w}: predict with imgsz={self.imgsz} or re-export with that size")
        batch = batch.to(self.dtype).contiguous()
        n = int(batch.shape[0])
        if self.dynamic_batch or n == self.batch:
            outs = self._run(batch)
        else:  # static batch: run in chunks of the exported size, padding the last one
            parts = []
            for start in range(0, n, self.batch):
                chunk = batch[start:start + self.batch]
                if chunk.shape[0] < self.batch:
                    pad = chunk.new_zeros((self.batch - chunk.shape[0], *chunk.shape[1:]))
                    chunk = torch.cat((chunk, pad))
                parts.append(self._run(chunk))
            outs = [torch.cat([p[i] for p in parts])[:n] for i in range(len(self.output_names))]
        return dict(zip(self.output_names, outs, strict=True))

    def info(self) -> dict[str, Any]:
        return {"format": self.format, "path": str(self.path), "family": self.family.name, "size": self.size,
                "task": self.task, "imgsz": self.imgsz, "batch": self.batch, "precision": self.metadata["precision"],
                "dynamic_axes": self.metadata.get("dynamic_axes"), "device": str(self.device),
                "runtime": self.describe(), "validation": self.validation.get("summary", self.validation.get("status"))}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path.name}, {self.family.name}-{self.size}, device={self.device})"


def check_artifact_file(path: str | Path, fmt: str) -> Path:
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{fmt} model not found: {path}")
    return path
