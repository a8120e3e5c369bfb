"""AOTInductor runtime: runs a ``.pt2`` package compiled by ``format=aoti`` through the shared predict().

The package says what it is (``extra/libreyolo_metadata.json``) and which device it was
compiled for (``export_args.device``): it runs there. On CUDA the compiled forward is replayed
from a CUDA graph (:class:`~libreyolo.graphs.GraphRunner`, ``cuda_graph="auto"`` by default:
captured the second time an input shape is seen; a capture that fails falls back to the plain
compiled call, and ``graph_info()`` says why). ``LibreYOLO("x.pt2", cuda_graph=False)`` turns
that off; ``predict(cuda_graph=True)`` asks for it per call. A CUDA package is loaded in
AOTInductor's single-threaded mode (``run_single_threaded``): its default mode checks, on every
call, with CUDA events whether a model instance is free, and those event queries are illegal
inside a stream capture ("operation not permitted when stream is capturing"). Single-threaded
mode drops that bookkeeping, so calls are serialised here by a lock instead.

Verification (``verify=True``, the default): the package bytes and the metadata are checked
against the hashes stored at export, and the metadata against the graph's recorded shapes.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch
from torch import nn

from libreyolo.errors import ArgumentError, CheckpointError
from libreyolo.export.aoti import pt2_content_sha256, read_build_info, read_metadata_strings
from libreyolo.export.metadata import check_integrity, decode
from libreyolo.runtimes.base import (
    ArtifactPredictor,
    RuntimeUnavailableError,
    check_artifact_file,
    check_graph,
    check_metadata,
)
from libreyolo.utils.checks import parse_bool, resolve_device

GRAPH_MODES = (False, True, "auto")


class AotiPredictor(ArtifactPredictor):
    format = "aoti"

    def __init__(self, path: Path, meta: dict[str, Any], compiled: Any, device: torch.device,
                 cuda_graph: bool | str, build: dict[str, Any]) -> None:
        super().__init__(path, meta)
        self.compiled = compiled
        self._device = device
        self.graph_mode = cuda_graph if device.type == "cuda" else False
        self.build = build
        self._graphs = None
        self._graphs_lock = threading.Lock()
        self._call_lock = threading.Lock()  # the compiled model may run one call at a time
        self._local = threading.local()

    @property
    def device(self) -> torch.device:
        return self._device

    def describe(self) -> str:
        graphs = f", CUDA graph {self.graph_mode}" if self.graph_mode else ""
        return f"aotinductor (torch {torch.__version__}) [{self._device}{graphs}]"

    # --- the call ----------------------------------------------------------------------------
    def _forward(self, batch: torch.Tensor, *, cuda_graph: bool | str = False) -> dict[str, torch.Tensor]:
        self._local.mode = cuda_graph if cuda_graph else self.graph_mode
        try:
            return super()._forward(batch)
        finally:
            self._local.mode = False

    def _call(self, batch: torch.Tensor) -> dict[str, torch.Tensor]:
        with self._call_lock:
            outs = self.compiled(batch)
        outs = (outs,) if isinstance(outs, torch.Tensor) else tuple(outs)
        return dict(zip(self.output_names, outs, strict=True))

    def _run(self, batch: torch.Tensor) -> list[torch.Tensor]:
        mode = getattr(self._local, "mode", False)
        named = self._graph_runner()(batch, mode) if mode else self._call(batch)
        return [named[n] for n in self.output_names]

    def _graph_runner(self):
        """The package's :class:`~libreyolo.graphs.GraphRunner` (one per model, made on first use)."""
        if self._graphs is None:
            with self._graphs_lock:
                if self._graphs is None:
                    from libreyolo.graphs import GraphRunner

                    # the compiled model holds its own weights; the runner watches an empty module
                    self._graphs = GraphRunner(nn.Module(), self._call, backend=self.__dict__.get("_graph_backend"))
        return self._graphs

    def graph_info(self) -> dict[str, Any]:
        """Graphs captured of the compiled forward (schema of ``Model.graph_info()``, docs/graphs.md)."""
        return {"family": self.family.name, "supported": True, **self._graph_runner().info()}

    def release_graphs(self) -> None:
        if self._graphs is not None:
            self._graphs.release()

    def info(self) -> dict[str, Any]:
        return {**super().info(), "compile_s": self.build.get("compile_s"), "graph_mode": self.graph_mode}


def _package_device(meta: dict[str, Any], where: str) -> torch.device:
    raw = (meta.get("export_args") or {}).get("device", "cpu")
    try:
        dev = torch.device(str(raw))
    except (RuntimeError, ValueError):
        raise CheckpointError(f"{where}: 'export_args.device' is {raw!r}, not a device; re-export it") from None
    if dev.type not in ("cpu", "cuda"):
        raise CheckpointError(f"{where}: compiled for device {raw!r}; AOTInductor packages run on cpu or cuda")
    return dev


def load(path: str | Path, device: str | torch.device | None = None, *, verify: bool = True,
         cuda_graph: bool | str = "auto", **kw: Any) -> AotiPredictor:
    """Open an AOTInductor ``.pt2`` package on the device it was compiled for.

    ``device``: None, or the same device type as the package (a CUDA package may name another
    GPU index). ``cuda_graph``: "auto" (default), True or False, for CUDA packages.
    """
    if kw:
        raise TypeError(f"unexpected arguments for an AOTInductor model: {sorted(kw)}")
    verify = parse_bool("verify", verify)
    if cuda_graph not in GRAPH_MODES or not isinstance(cuda_graph, (bool, str)):
        raise ArgumentError(f"cuda_graph must be False, True or 'auto', got {cuda_graph!r}")
    path = check_artifact_file(path, "AOTInductor")
    where = str(path)
    props = read_metadata_strings(path)
    meta = decode(props, where)
    family, *_ = check_metadata(meta, where)
    build = read_build_info(path)
    if verify:
        check_integrity(props, pt2_content_sha256(path), where)
    if build.get("inputs") and build.get("outputs"):
        as_shape = {k: tuple(v) for k, v in build["inputs"].items()}, {k: tuple(v) for k, v in build["outputs"].items()}
        check_graph(meta, family, *as_shape, where)
    compiled_for = _package_device(meta, where)
    dev = resolve_device(device) or compiled_for
    if dev.type != compiled_for.type:
        raise ArgumentError(f"{path.name} was compiled for {compiled_for.type} and runs only there; got "
                            f"device={str(dev)!r}. Re-export with device={dev.type} to run it there")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeUnavailableError(f"{path.name} was compiled for CUDA and this machine has no CUDA device")
        dev = torch.device("cuda", dev.index if dev.index is not None else (compiled_for.index or 0))
    try:
        compiled = torch._inductor.aoti_load_package(str(path), run_single_threaded=dev.type == "cuda",
                                                     device_index=dev.index if dev.index is not None else -1)
    except Exception as exc:  # noqa: BLE001 - a package this torch cannot load is a file problem for the user
        raise CheckpointError(f"AOTInductor cannot load {path} ({type(exc).__name__}: {exc}); it was compiled "
                              f"with torch {build.get('torch', '?')}, this is torch {torch.__version__}: "
                              "re-export it with this version") from None
    return AotiPredictor(path, meta, compiled, dev, cuda_graph, build)
