"""The eager PyTorch model: a family's network plus its metadata, with ``predict()`` and ``save()``."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from libreyolo.checkpoint import Checkpoint, load_state, save_checkpoint
from libreyolo.engine.predictor import Predictor
from libreyolo.errors import ArgumentError
from libreyolo.models.base import Family


class Model(Predictor):
    """An eager model. Build with :func:`libreyolo.LibreYOLO`."""

    def __init__(self, family: Family, size: str, *, nc: int, names: dict[int, str], imgsz: int,
                 state_dict: dict[str, torch.Tensor] | None = None, source: str | None = None,
                 device: str | torch.device | None = None) -> None:
        self.family = family
        self.size = size
        self.nc = nc
        self.names = dict(names)
        self.imgsz = imgsz
        self.source = source
        self.net: nn.Module = family.build(size, nc)
        if state_dict is not None:
            load_state(self.net, state_dict, source or f"{family.name}-{size} weights")
        self.net.eval()
        self._half = False
        if device is not None:
            self.to(device)

    @classmethod
    def from_checkpoint(cls, ckpt: Checkpoint, device: str | torch.device | None = None) -> Model:
        return cls(ckpt.family, ckpt.size, nc=ckpt.nc, names=ckpt.names, imgsz=ckpt.imgsz,
                   state_dict=ckpt.state_dict, source=ckpt.path, device=device)

    # --- device and precision ----------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        p = next(self.net.parameters(), None)
        return p.device if p is not None else torch.device("cpu")

    @property
    def task(self) -> str:
        return self.family.task

    def to(self, device: str | torch.device) -> Model:
        device = torch.device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ArgumentError(f"device {str(device)!r} requested but CUDA is not available on this machine")
        self.net.to(device)
        return self

    def half(self) -> Model:
        self.net.half()
        self._half = True
        return self

    def float(self) -> Model:
        self.net.float()
        self._half = False
        return self

    def _prepare(self, device: torch.device | None, half: bool) -> None:
        current = self.device
        if device is not None and (device.type != current.type or
                                   (device.index is not None and device.index != current.index)):
            self.to(device)
        if half and self.device.type == "cpu":
            raise ArgumentError("half=True needs a CUDA device; on the CPU run in float32 (half=False)")
        if half != self._half:
            self.half() if half else self.float()

    def _forward(self, batch: torch.Tensor, *, cuda_graph: bool | str = False) -> dict[str, torch.Tensor]:
        if cuda_graph:
            raise NotImplementedError(
                f"cuda_graph={cuda_graph!r} is not available for family {self.family.name!r} in this build"
            )
        with torch.inference_mode():
            return self.family.named_outputs(self.net(batch))

    # --- weights -----------------------------------------------------------------------------
    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> Model:
        load_state(self.net, state_dict, "load_weights()")
        return self

    def save(self, path: str | Path) -> str:
        """Write a reference-format (schema 1.0) checkpoint atomically."""
        return str(save_checkpoint(path, self.net, family=self.family, size=self.size, nc=self.nc,
                                   names=self.names, imgsz=self.imgsz))

    def info(self) -> dict[str, Any]:
        return {"family": self.family.name, "size": self.size, "task": self.family.task, "nc": self.nc,
                "imgsz": self.imgsz, "device": str(self.device),
                "parameters": sum(p.numel() for p in self.net.parameters())}

    def __repr__(self) -> str:
        return f"Model({self.family.name}-{self.size}, nc={self.nc}, device={self.device})"
