"""The eager PyTorch model: a family's network plus its metadata, with ``predict()`` and ``save()``."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch
from torch import nn

from libreyolo.checkpoint import Checkpoint, load_state, save_checkpoint
from libreyolo.engine.predictor import Predictor
from libreyolo.errors import ArgumentError
from libreyolo.models.base import Family

_GRAPH_SETUP_LOCK = threading.Lock()  # makes a model's graph runner exactly once


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

    # --- forward and CUDA graphs (docs/graphs.md) ------------------------------------------
    def _forward(self, batch: torch.Tensor, *, cuda_graph: bool | str = False) -> dict[str, torch.Tensor]:
        if not cuda_graph:
            with torch.inference_mode():
                return self.family.named_outputs(self.net(batch))
        self._require_graph_support()
        return self._graph_forward(batch, cuda_graph)

    def _require_graph_support(self) -> None:
        if not self.family.SUPPORTS_CUDA_GRAPH:
            from libreyolo.graphs import GraphNotSupportedError

            raise GraphNotSupportedError(
                f"CUDA graphs are not enabled for family {self.family.name!r}: it has not passed the graph "
                "parity check (python -m libreyolo.graphs.parity), and replaying an unverified forward could "
                "return wrong numbers without any warning. Use cuda_graph=False."
            )

    def _graph_forward(self, batch: torch.Tensor, mode: bool | str) -> dict[str, torch.Tensor]:
        """Graph replay without the family check (the parity harness uses it to verify a family)."""
        with torch.inference_mode():
            return self._graph_runner()(batch, mode)

    def _graph_runner(self):
        """This model's :class:`~libreyolo.graphs.GraphRunner`, made on first use (and anew if ``net`` is replaced)."""
        runner = self.__dict__.get("_graphs")
        if runner is None or runner.module is not self.net:
            with _GRAPH_SETUP_LOCK:
                runner = self.__dict__.get("_graphs")
                if runner is None or runner.module is not self.net:
                    from libreyolo.graphs import DEFAULT_MAX_GRAPHS, GraphRunner

                    net, family = self.net, self.family

                    def network(x: torch.Tensor) -> dict[str, torch.Tensor]:
                        return family.named_outputs(net(x))

                    max_graphs = runner.max_graphs if runner is not None else DEFAULT_MAX_GRAPHS
                    runner = GraphRunner(net, network, backend=self.__dict__.get("_graph_backend"),
                                         max_graphs=max_graphs)
                    self._graphs = runner
        return runner

    def graph_options(self, *, max_graphs: int | None = None) -> dict[str, Any]:
        """Set graph options; returns the current ones. ``max_graphs``: graphs kept (LRU, default 16)."""
        runner = self._graph_runner()
        if max_graphs is not None:
            runner.set_max_graphs(max_graphs)
        return {"max_graphs": runner.max_graphs}

    def capture_graph(self, imgsz: int | None = None, batch: int = 1,
                      dtype: torch.dtype | None = None) -> dict[str, Any]:
        """Capture the forward for ``(batch, 3, imgsz, imgsz)`` now, so the first request does not pay.

        ``dtype``: None keeps the model's precision; ``torch.float16`` captures for
        ``predict(half=True)`` (and converts the model to half, as that call would). Returns the
        graph's entry of :meth:`graph_info`.
        """
        from libreyolo.engine.predictor import _check_positive_int, check_imgsz
        from libreyolo.graphs import GraphUnavailableError

        self._require_graph_support()
        imgsz = check_imgsz(self.imgsz if imgsz is None else imgsz, self.family.stride)
        batch = _check_positive_int("batch", batch)
        runner = self._graph_runner()
        why_not = runner.backend.unavailable(self.device)
        if why_not is not None:
            raise GraphUnavailableError(f"capture_graph() needs a CUDA device: {why_not}")
        if dtype is not None:
            if dtype not in (torch.float32, torch.float16):
                raise ArgumentError(f"dtype must be torch.float32 or torch.float16, got {dtype!r}")
            self._prepare(None, dtype == torch.float16)
        pad = self.family.letterbox(imgsz).pad_value / 255.0
        x = torch.full((batch, 3, imgsz, imgsz), pad, dtype=self._input_dtype(self._half), device=self.device)
        with torch.inference_mode():
            return runner.capture(x)

    def graph_info(self) -> dict[str, Any]:
        """Captured graphs, fallbacks, failures and counters; the schema is in docs/graphs.md."""
        info: dict[str, Any] = {"family": self.family.name, "supported": bool(self.family.SUPPORTS_CUDA_GRAPH)}
        info.update(self._graph_runner().info())
        return info

    def release_graphs(self) -> None:
        """Free every captured graph and its memory; recorded capture failures are forgotten too."""
        runner = self.__dict__.get("_graphs")
        if runner is not None:
            runner.release()

    # --- weights -----------------------------------------------------------------------------
    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> Model:
        load_state(self.net, state_dict, "load_weights()")
        return self

    def save(self, path: str | Path) -> str:
        """Write a reference-format (schema 1.0) checkpoint atomically."""
        return str(save_checkpoint(path, self.net, family=self.family, size=self.size, nc=self.nc,
                                   names=self.names, imgsz=self.imgsz))

    def export(self, format: str = "onnx", **opts: Any):  # noqa: A002 - the name users know
        """Export to ``onnx``/``executorch``/``coreml``/``tensorrt``, validated against this model.

        Returns an :class:`~libreyolo.export.ExportReport` (``str(report)`` is the artifact path).
        Options: see :func:`libreyolo.export.export` and docs/export.md.
        """
        from libreyolo.export import export

        return export(self, format, **opts)

    def info(self) -> dict[str, Any]:
        return {"family": self.family.name, "size": self.size, "task": self.family.task, "nc": self.nc,
                "imgsz": self.imgsz, "device": str(self.device),
                "parameters": sum(p.numel() for p in self.net.parameters())}

    def __repr__(self) -> str:
        return f"Model({self.family.name}-{self.size}, nc={self.nc}, device={self.device})"
