"""AOTInductor runtime: runs a ``.pt2`` package compiled by ``format=aoti`` through the shared predict().

The package says what it is (``extra/libreyolo_metadata.json``) and which device it was
compiled for (``export_args.device``): it runs there, calls serialised by a lock.

CUDA packages are loaded once in a child process first (:func:`probe_cuda_load`): the loader of
torch 2.11 segfaulted on the H200 for CUDA packages, which would take the caller's process down.

CUDA graphs: a CUDA package is loaded in AOTInductor's single-threaded mode. Its default runner
checks, on every call, with CUDA events whether a model instance is free, and event queries are
illegal inside a stream capture; the single-threaded runner drops that check (calls here are
serialised by a lock anyway), so ``predict(cuda_graph=True)`` captures the compiled forward and,
where the family allows it, the whole pipeline (decoding, candidates, NMS) into one graph, through
a :class:`~libreyolo.engine.pipeline.PipelineExecutor` as the eager model's. CPU packages run
the compiled call (``cuda_graph=True`` logs one line).

Verification (``verify=True``, the default): the package bytes and the metadata are checked
against the hashes stored at export, and the metadata against the graph's recorded shapes.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch

from libreyolo.engine.graph_state import GraphState
from libreyolo.engine.pipeline import PipelineExecutor
from libreyolo.engine.plan import RUNTIME
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
from libreyolo.utils.log import LOGGER

GRAPH_MODES = (False, True, "auto")
NO_GRAPH_REASON = ("CUDA graphs apply to CUDA packages; this AOTInductor package runs on the CPU: running the compiled "
                   "call")


class AotiPredictor(ArtifactPredictor):
    format = "aoti"

    def __init__(self, path: Path, meta: dict[str, Any], compiled: Any, device: torch.device,
                 build: dict[str, Any], *, graphable: bool = False) -> None:
        super().__init__(path, meta)
        self.compiled = compiled
        self._device = device
        self.build = build
        self._call_lock = threading.Lock()  # one call at a time through the compiled runner
        self._told = False
        self._graphable = graphable  # loaded single-threaded on CUDA: a stream capture can hold a call
        self._runner: Any = None
        self._runner_lock = threading.Lock()
        self._graphs = GraphState()  # the graph backend (set_graph_backend) and graphs kept
        # the whole-pipeline graph; the letterbox stays outside a package's graph: the letterbox-inside
        # program is verified on a GPU for the eager model only (tests/test_stream_pipeline.py)
        self._pipeline = PipelineExecutor(self.family, lambda: self.nc, self._graphs, self._calls, self._graph_target,
                                          frames=False, reason=None if graphable else NO_GRAPH_REASON)

    @property
    def device(self) -> torch.device:
        return self._device

    def describe(self) -> str:
        return f"aotinductor (torch {torch.__version__}) [{self._device}]"

    # --- the call ----------------------------------------------------------------------------
    def _choose_executor(self, device: torch.device, graph: bool | str) -> str:
        if graph and self._graphable:
            return self._pipeline.executor(self.pipeline_unavailable(device))
        return RUNTIME

    def _forward(self, batch: torch.Tensor, *, cuda_graph: bool | str = False) -> dict[str, torch.Tensor]:
        if cuda_graph and self._graphable:
            self._pipeline.require_support()
            with torch.inference_mode():
                return self._graph_runner()(batch, cuda_graph)
        if cuda_graph and not self._told:
            self._told = True
            LOGGER.info(NO_GRAPH_REASON)
        return self._network(batch)

    def _network(self, batch: torch.Tensor) -> dict[str, torch.Tensor]:
        """The compiled forward with the shared shape handling (what a graph captures)."""
        return ArtifactPredictor._forward(self, batch)

    # --- CUDA graphs (libreyolo.engine.pipeline) -------------------------------------------------
    def set_graph_backend(self, backend: Any) -> None:
        """As :meth:`libreyolo.engine.model.Model.set_graph_backend`."""
        self._graphs.set_backend(backend)

    def pipeline_unavailable(self, device: torch.device | None = None) -> str | None:
        """As :meth:`libreyolo.engine.model.Model.pipeline_unavailable` (a CPU package: why it has no graphs)."""
        return self._pipeline.unavailable(self._device if device is None else device)

    def _graph_runner(self):
        from torch import nn

        with self._runner_lock:
            if self._runner is None:  # a package has no weights to watch: an empty module stands for it
                self._runner = self._graphs.new_runner(nn.Module(), self._network)
            return self._runner

    def _graph_target(self, batch: torch.Tensor) -> tuple[Any, Any]:
        return self._graph_runner(), self._network

    def _call(self, batch: torch.Tensor) -> dict[str, torch.Tensor]:
        with self._call_lock:
            outs = self.compiled(batch)
        outs = (outs,) if isinstance(outs, torch.Tensor) else tuple(outs)
        return dict(zip(self.output_names, outs, strict=True))

    def _run(self, batch: torch.Tensor) -> list[torch.Tensor]:
        named = self._call(batch)
        return [named[n] for n in self.output_names]

    def graph_info(self) -> dict[str, Any]:
        """Schema of ``Model.graph_info()`` (docs/graphs.md); a CPU package says why it has none."""
        if not self._graphable:
            return {"family": self.family.name, "supported": False, "reason": NO_GRAPH_REASON, "captures": 0,
                    "graphs": []}
        info = self._pipeline.info_head(self._device)
        info.update(self._graph_runner().info())
        return info

    def release_graphs(self) -> None:
        if self._runner is not None:
            self._runner.release()

    def info(self) -> dict[str, Any]:
        return {**super().info(), "compile_s": self.build.get("compile_s")}


def _package_device(meta: dict[str, Any], where: str) -> torch.device:
    raw = (meta.get("export_args") or {}).get("device", "cpu")
    try:
        dev = torch.device(str(raw))
    except (RuntimeError, ValueError):
        raise CheckpointError(f"{where}: 'export_args.device' is {raw!r}, not a device; re-export it") from None
    if dev.type not in ("cpu", "cuda"):
        raise CheckpointError(f"{where}: compiled for device {raw!r}; AOTInductor packages run on cpu or cuda")
    return dev


PROBE_ENV = "LIBREYOLO_AOTI_PROBE"
_PROBED: dict[tuple[str, int, int, int], None] = {}  # (path, size, mtime, device index) that loaded in a probe
_PROBE_CODE = ("import sys, torch; torch.zeros(1, device=f'cuda:{sys.argv[2]}'); "
               "torch._inductor.aoti_load_package(sys.argv[1], device_index=int(sys.argv[2]), "
               "run_single_threaded=True)")


def probe_cuda_load(path: Path, index: int, timeout: float = 600.0) -> None:
    """Load a CUDA package once in a child process before loading it here.

    On the H200 with torch 2.11 (2026-12-01), AOTInductor's package loader died with a
    segmentation fault while loading CUDA packages it had just compiled, which kills the whole
    Python process: a server, a notebook, a test session. The cause was the compiler there: it
    linked a private static copy of libstdc++ into the package, whose locale tables clash with
    the process's shared libstdc++ inside ``std::regex``; exports now link the shared one
    (:func:`libreyolo.export.aoti.shared_libstdcxx`), but a package built elsewhere may still
    carry a static copy. The probe turns such a crash into a
    :class:`RuntimeUnavailableError` naming the signal. A package that loaded once in a probe is
    not probed again in this process; ``LIBREYOLO_AOTI_PROBE=0`` skips the probe (a few seconds:
    one more Python process importing torch)."""
    import os
    import signal
    import subprocess
    import sys

    if os.environ.get(PROBE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, index)
    if key in _PROBED:
        return
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE_CODE, str(path), str(index)], capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeUnavailableError(f"AOTInductor did not finish loading {path.name} within {timeout:.0f} s in a "
                                      f"probe process; set {PROBE_ENV}=0 to load it here without the probe") from None
    if proc.returncode < 0:
        try:
            name = signal.Signals(-proc.returncode).name
        except ValueError:
            name = f"signal {-proc.returncode}"
        from libreyolo.export.aoti import carries_static_libstdcxx

        cause = ("Its wrapper library carries a static copy of libstdc++ (it was compiled where the C++ compiler "
                 "found only libstdc++.a), which clashes with this process's shared libstdc++: re-export it with "
                 "this LibreYOLO version, which links the shared one. " if carries_static_libstdcxx(path) else "")
        raise RuntimeUnavailableError(
            f"AOTInductor crashed ({name}) loading {path.name} on cuda:{index} in a probe process, so it was not "
            f"loaded here (it would have killed this process): torch {torch.__version__} cannot run this CUDA "
            f"package on this machine. {cause}Serve the checkpoint with cuda_graph=True, or export format=onnx "
            "or tensorrt instead")
    _PROBED[key] = None  # a Python-level failure is left to the real load below, which words it for the user


def load(path: str | Path, device: str | torch.device | None = None, *, verify: bool = True,
         cuda_graph: bool | str = False, **kw: Any) -> AotiPredictor:
    """Open an AOTInductor ``.pt2`` package on the device it was compiled for.

    ``device``: None, or the same device type as the package (a CUDA package may name another
    GPU index). ``cuda_graph``: accepted (False, True or "auto") like other models'; a CUDA
    package is loaded so that a graph can capture it (module docstring).
    """
    if kw:
        raise TypeError(f"unexpected arguments for an AOTInductor model: {sorted(kw)}")
    verify = parse_bool("verify", verify)
    if cuda_graph not in GRAPH_MODES or not isinstance(cuda_graph, (bool, str)):
        raise ArgumentError(f"cuda_graph must be False, True or 'auto', got {cuda_graph!r}")
    path = check_artifact_file(path, "AOTInductor")
    where = str(path)
    props = read_metadata_strings(path)
    if verify:  # first: a file changed since export is named as such, before any field is interpreted
        check_integrity(props, pt2_content_sha256(path), where)
    meta = decode(props, where)
    family, *_ = check_metadata(meta, where)
    build = read_build_info(path)
    if build.get("inputs") and build.get("outputs"):
        try:
            as_shape = ({k: tuple(v) for k, v in build["inputs"].items()},
                        {k: tuple(v) for k, v in build["outputs"].items()})
        except (AttributeError, TypeError):
            raise CheckpointError(f"{where}: its build record's shapes are damaged; re-export it") from None
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
        probe_cuda_load(path, dev.index)
    index = dev.index if dev.index is not None else -1
    try:
        if dev.type == "cuda":
            compiled = torch._inductor.aoti_load_package(str(path), device_index=index, run_single_threaded=True)
        else:
            compiled = torch._inductor.aoti_load_package(str(path), device_index=index)
    except Exception as exc:  # noqa: BLE001 - a package this torch cannot load is a file problem for the user
        raise CheckpointError(f"AOTInductor cannot load {path} ({type(exc).__name__}: {exc}); it was compiled "
                              f"with torch {build.get('torch', '?')}, this is torch {torch.__version__}: "
                              "re-export it with this version") from None
    return AotiPredictor(path, meta, compiled, dev, build, graphable=dev.type == "cuda")
