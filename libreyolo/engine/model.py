"""The eager PyTorch model: a family's network plus its metadata, with ``predict()`` and ``save()``."""
from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from libreyolo.checkpoint import Checkpoint, load_state, save_checkpoint
from libreyolo.engine.graphed import COMPILED, COMPILED_IN_GRAPH, GRAPHS_COMPILED, RUNNERS, ModelGraphs
from libreyolo.engine.inference import CHANNELS_LAST_CHOICES, InferenceCopies, InferenceCopy
from libreyolo.engine.pipeline import PipelineGraphs
from libreyolo.engine.plan import COMPILED as COMPILED_EXECUTOR
from libreyolo.engine.plan import EAGER, CallPlan
from libreyolo.engine.predictor import CallState, Predictor
from libreyolo.engine.quantized import Quantizable
from libreyolo.errors import ArgumentError
from libreyolo.models.base import Family

_SETUP_LOCK = threading.Lock()  # makes a model's inference-copy cache exactly once per master network


class Model(Quantizable, ModelGraphs, PipelineGraphs, Predictor):
    """An eager model. Build with :func:`libreyolo.LibreYOLO`."""

    _inference: InferenceCopies | None = None  # the inference copies of the current master (see _copies)

    def __init__(self, family: Family, size: str, *, nc: int, names: dict[int, str], imgsz: int,
                 state_dict: dict[str, torch.Tensor] | None = None, source: str | None = None,
                 device: str | torch.device | None = None) -> None:
        self.family = family
        self.size = size
        self.nc = nc
        self.names = dict(names)
        self.imgsz = imgsz
        self.source = source
        # untrained builds are the same on every machine and run (the demo and tests rely on it);
        # the caller's RNG state is left untouched
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.net: nn.Module = family.build(size, nc)
        if state_dict is not None:
            load_state(self.net, family.inference_state(state_dict), source or f"{family.name}-{size} weights")
        self.net.eval()
        self._half = False  # the default precision of predict() and capture_graph(); the master stays fp32
        self._max_graphs: int | None = None
        self._inference_opts: dict[str, Any] = {"fold_bn": "auto", "channels_last": "auto"}
        self._graph_totals: dict[str, Any] = {"captures": 0, "evictions": 0, "invalidations": 0,
                                              "last_invalidation": None}
        self._compile: bool | str = False  # LibreYOLO(..., compile=...) / compile(): off, True or a mode
        self._compile_totals: dict[str, Any] = {"retired": 0, "last_retired": None}
        # the parts, declared here (none is created behind the model's back): the inference copies of the
        # current master (made on first use: _copies), plans and staging buffers, quantization, the last
        # training run's graph use, the graph backend (None: CUDA), the tracks of track(persist=True)
        self._inference: InferenceCopies | None = None
        self._calls = CallState()
        self._quant: dict[str, Any] | None = None
        self._train_graph: dict[str, Any] | None = None
        self._graph_backend: Any = None
        self._tracking: Any = None
        if device is not None:
            self.to(device)

    @classmethod
    def from_checkpoint(cls, ckpt: Checkpoint, device: str | torch.device | None = None) -> Model:
        model = cls(ckpt.family, ckpt.size, nc=ckpt.nc, names=ckpt.names, imgsz=ckpt.imgsz,
                    state_dict=ckpt.state_dict, source=ckpt.path, device=device)
        if ckpt.meta.get("quantization") is not None:  # a quantized save (docs/quantization.md)
            model._restore_quantization(ckpt.meta["quantization"], ckpt.path or "checkpoint")
        return model

    # what a copy of the model rebuilds on first use instead of copying: the inference-copy cache (with
    # its CUDA graphs and compiled programs) and the pinned staging buffers hold device memory and locks
    _RUNTIME_STATE = ("_inference", "_calls")

    def __deepcopy__(self, memo: dict[int, Any]) -> Model:
        """``copy.deepcopy(model)``: its own master weights, settings and quantization state; inference
        copies, graphs, compiled programs and staging buffers are made again when the copy runs. A
        graph backend set on the model is shared (it is a strategy, not state)."""
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            if key in self._RUNTIME_STATE:
                continue
            new.__dict__[key] = value if key == "_graph_backend" else copy.deepcopy(value, memo)
        new._calls = CallState()  # and _inference: the class default (None) until the copy runs
        return new

    # --- device and precision ----------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """Where the master weights live: predict() runs here unless given ``device=``."""
        p = next(self.net.parameters(), None)
        return p.device if p is not None else torch.device("cpu")

    @property
    def task(self) -> str:
        return self.family.task

    def to(self, device: str | torch.device) -> Model:
        from libreyolo.utils.checks import resolve_device

        if device is None:
            raise ArgumentError("to() needs a device: cpu, cuda, cuda:N or mps")
        device = resolve_device(device)  # refuses 'meta' (it would drop the weights) and unusable devices
        copies = self._copies()
        with copies.mutating():  # no copy is built from a half-moved master
            before = self.device
            self.net.to(device)
            if self.device != before:
                copies.invalidate(f"parameters or buffers moved (model.to({str(device)!r}))")
        return self

    def half(self) -> Model:
        """Make float16 the default precision of ``predict()`` and ``capture_graph()`` (CUDA).

        The master weights are not converted: calls run on a float16 inference copy, and
        :meth:`float` goes back to float32 with the weights exactly as they were.
        """
        self._half = True
        return self

    def float(self) -> Model:
        """Make float32 the default precision again (and the master float32, if it was changed by hand)."""
        self._half = False
        if any(t.is_floating_point() and t.dtype != torch.float32
               for t in list(self.net.parameters()) + list(self.net.buffers())):
            copies = self._copies()
            with copies.mutating():
                self.net.float()
                copies.invalidate("parameters or buffers moved (master converted to float32)")
        return self

    def _call_settings(self, device: torch.device | None, half: bool | None) -> tuple[torch.device, bool]:
        """The device and precision one predict() runs with; the model itself is left as it is."""
        run = self.device if device is None else device
        half = self._half if half is None else bool(half)
        if half and run.type == "cpu":
            raise ArgumentError("half=True (or model.half()) needs a CUDA device; on the CPU run in float32 "
                                "(half=False, or model.float())")
        return run, half

    def _prepare(self, device: torch.device | None, half: bool | None) -> None:
        self._call_settings(device, half)

    # --- the call plan (libreyolo.engine.plan) -----------------------------------------------
    def _plan_state(self) -> tuple:
        return (*super()._plan_state(), self._half, self._compile)

    def _choose_executor(self, device: torch.device, graph: bool | str) -> str:
        if graph:
            return self._graph_executor(device)
        return EAGER if self._compile is False else COMPILED_EXECUTOR

    def _execute(self, batch: torch.Tensor, plan: CallPlan) -> dict[str, torch.Tensor]:
        """The plan's executor on the inference copy for ``batch``'s device and dtype."""
        copy = self._copies().get(batch.device, batch.dtype)
        with copy.kernels().active():  # kernel slots resolved once per copy, not per layer call
            if plan.graphed:  # the forward graph (also where a pipeline capture failed for this input)
                with torch.inference_mode():
                    return self._graph_runner(copy)(batch, plan.graph)
            compiled = self._compiled(copy) if plan.executor == COMPILED_EXECUTOR else None
            with torch.inference_mode():
                if compiled is not None:
                    return compiled(batch)
                return self.family.named_outputs(copy.module(batch))

    # --- inference copies (docs/inference.md) ----------------------------------------------
    def _copies(self) -> InferenceCopies:
        """The inference-copy cache of the current master network (made anew if ``net`` is replaced)."""
        copies = self._inference
        if copies is None or copies.master is not self.net:
            with _SETUP_LOCK:
                copies = self._inference
                if copies is None or copies.master is not self.net:
                    if copies is not None:
                        self._note_retired("the network module was replaced", copies.live())
                        copies.release()
                    copies = InferenceCopies(self.net, on_retire=self._note_retired, **self._inference_opts)
                    self._inference = copies
        return copies

    def inference_copy(self, device: str | torch.device | None = None,
                       dtype: torch.dtype | None = None) -> InferenceCopy:
        """The current inference copy for ``device`` (default: the model's) and ``dtype`` (default:
        the model's precision), built from the master weights if needed.

        This is the hook for code that runs or captures the network for inference (CUDA graphs,
        a whole-pipeline graph): run ``copy.module``, and attach anything derived from it with
        ``copy.attached(name, factory)`` so that it is released when the copy is retired
        (whenever the master's weights change).
        """
        device = self.device if device is None else torch.device(device)
        dtype = self._default_dtype() if dtype is None else dtype
        return self._copies().get(device, dtype)

    def inference_module(self, device: str | torch.device | None = None,
                         dtype: torch.dtype | None = None) -> nn.Module:
        """The module predict() runs for ``device``/``dtype`` (see :meth:`inference_copy`). Read-only."""
        return self.inference_copy(device, dtype).module

    def inference_options(self, *, fold_bn: bool | str | None = None,
                          channels_last: bool | str | None = None) -> dict[str, Any]:
        """Set how inference copies are derived; returns the current options.

        ``fold_bn`` (default "auto": on CUDA only): fold each Conv-BN pair into one convolution
        (changes float rounding: see docs/inference.md for the measured numerics); False runs the
        master's exact arithmetic, True folds on every device. ``channels_last`` (default "auto":
        float16 on CUDA only): the memory format. Changing an option retires the current copies
        (and their CUDA graphs).
        """
        if fold_bn is not None and not isinstance(fold_bn, bool) and fold_bn != "auto":
            raise ArgumentError(f"fold_bn must be True, False or 'auto', got {fold_bn!r}")
        if channels_last is not None and channels_last not in CHANNELS_LAST_CHOICES:
            raise ArgumentError(f"channels_last must be True, False or 'auto', got {channels_last!r}")
        if fold_bn is not None:
            self._inference_opts["fold_bn"] = fold_bn
        if channels_last is not None:
            self._inference_opts["channels_last"] = channels_last
        self._copies().set_options(fold_bn=fold_bn, channels_last=channels_last)
        return dict(self._inference_opts)

    def inference_info(self) -> dict[str, Any]:
        """The options, the live inference copies (key, folded pairs, graphs) and how many were built."""
        copies = self._copies()
        live = []
        for c in copies.live():
            runners = [r for r in (c.attachment(n) for n in RUNNERS) if r is not None]
            live.append({**c.describe(), "graphs": sum(len(r.info()["graphs"]) for r in runners)})
        return {"options": dict(self._inference_opts), "default_dtype": str(self._default_dtype()).replace(
            "torch.", ""), "copies": live, "builds": copies.builds}

    def _default_dtype(self) -> torch.dtype:
        return torch.float16 if self._half else torch.float32

    def _note_retired(self, reason: str, retired: list[InferenceCopy]) -> None:
        """Copies were dropped: their graphs and compiled programs go with them; keep the counters cumulative."""
        had_graphs = False
        for c in retired:
            if c.attachment(COMPILED) is not None or c.attachment(COMPILED_IN_GRAPH) is not None:
                self._compile_totals["retired"] += 1
                self._compile_totals["last_retired"] = reason
            for runner in (c.attachment(n) for n in RUNNERS):
                if runner is None:
                    continue
                info = runner.info()
                had_graphs |= bool(info["graphs"] or info["failures"] or info["pending"])
                for k in ("captures", "evictions", "invalidations"):
                    self._graph_totals[k] += info[k]
        if had_graphs:
            self._graph_totals["invalidations"] += 1
            self._graph_totals["last_invalidation"] = reason

    # --- torch.compile of the inference copies (libreyolo.engine.compiled, docs/inference.md) ---
    def compile(self, mode: bool | str = True) -> Model:  # noqa: A003 - the name torch users know
        """Run the network of ``predict()`` through torch.compile of the inference copy (or stop).

        ``mode``: ``True`` is torch.compile's "reduce-overhead" on CUDA (Inductor's own CUDA graphs)
        and "default" on the CPU; a string picks the mode ("default", "reduce-overhead",
        "max-autotune", "max-autotune-no-cudagraphs"); ``False`` runs the eager copy again. Compiled
        lazily, per inference copy and input shape (fixed shapes), and compared with the eager copy
        on the first batch of each shape with the export validator's tolerances; where compiling
        fails or the comparison does, one warning, and that copy runs eagerly. :meth:`compile_info`
        shows the state. ``predict(cuda_graph=True)`` captures the network compiled in the mode's
        counterpart without Inductor's CUDA graphs inside our graphs (docs/inference.md).
        """
        from libreyolo.engine.options import COMPILE_OPTION

        mode = COMPILE_OPTION.check("compile", mode)
        if mode != self._compile:
            self._compile = mode
            for c in self._copies().live():
                for name in (COMPILED, GRAPHS_COMPILED, COMPILED_IN_GRAPH):
                    c.detach(name)
        return self

    def _compiled(self, copy: InferenceCopy, *, in_graph: bool = False):
        """The copy's :class:`~libreyolo.engine.compiled.CompiledForward`, or None when compile is off;
        ``in_graph``: the one our CUDA graphs capture (a mode without Inductor's CUDA graphs)."""
        if self._compile is False:
            return None
        from libreyolo.engine.compiled import CompiledForward, in_graph_mode, resolve_mode

        mode = resolve_mode(self._compile, copy.key.device)
        name = COMPILED_IN_GRAPH if in_graph else COMPILED
        if in_graph:
            mode = in_graph_mode(mode)
        family, device = self.family, copy.key.device
        found = copy.attached(name, lambda module: CompiledForward(module, family, device, mode))
        if found.mode != mode:  # switched by compile() in another thread meanwhile
            copy.detach(name)
            found = copy.attached(name, lambda module: CompiledForward(module, family, device, mode))
        return found

    def compile_info(self) -> dict[str, Any]:
        """What :meth:`compile` does now: the requested mode, the rule for ``cuda_graph=True``, and per
        live inference copy its mode, whether it serves compiled, the shapes validated (with compile
        seconds and the worst ratio to the allowance), the fallback reason if any, and call counts."""
        from libreyolo.engine.compiled import CUDA_GRAPH_RULE

        copies = []
        for c in self._copies().live():
            for name, used_by in ((COMPILED, "predict(cuda_graph=False)"), (COMPILED_IN_GRAPH, "CUDA graphs")):
                found = c.attachment(name)
                if found is not None:
                    copies.append({**c.key.describe(), "used_by": used_by, **found.info()})
        return {"mode": self._compile, "cuda_graph": CUDA_GRAPH_RULE, "copies": copies,
                "retired": self._compile_totals["retired"], "last_retired": self._compile_totals["last_retired"]}

    # --- forward and CUDA graphs (docs/graphs.md) ------------------------------------------
    def _forward(self, batch: torch.Tensor, *, cuda_graph: bool | str = False) -> dict[str, torch.Tensor]:
        """The family's named outputs for ``batch``, from the inference copy for its device and dtype
        (through its compiled program when :meth:`compile` is on)."""
        if not cuda_graph:
            copy = self._copies().get(batch.device, batch.dtype)
            compiled = self._compiled(copy)
            with torch.inference_mode():
                if compiled is not None:
                    return compiled(batch)
                return self.family.named_outputs(copy.module(batch))
        self._require_graph_support()
        return self._graph_forward(batch, cuda_graph)

    # --- weights -----------------------------------------------------------------------------
    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> Model:
        copies = self._copies()
        with copies.mutating():
            load_state(self.net, self.family.inference_state(state_dict), "load_weights()")
            copies.invalidate("weights were modified in place (load_weights)")
        return self

    def set_fused_attention(self, enabled: bool = True) -> int:
        """Switch every attention module of the network to fused SDPA (``enabled``) or the manual
        path; returns how many modules it switched (0: no switchable attention). The inference
        copies and their graphs are rebuilt on the next predict (docs/kernels.md)."""
        from libreyolo.kernels.attention.sdpa import set_fused_attention
        from libreyolo.utils.checks import parse_bool

        enabled = parse_bool("enabled", enabled)
        copies = self._copies()
        with copies.mutating():
            switched = set_fused_attention(self.net, enabled)
            if switched:
                copies.invalidate(f"attention switched to {'fused' if enabled else 'manual'}")
        return switched

    def save(self, path: str | Path) -> str:
        """Write a reference-format (schema 1.0) checkpoint atomically. A quantized model's float
        weights go under the usual keys, its scales in a ``quantization`` entry (docs/quantization.md)."""
        entry = self._quant_entry()
        return str(save_checkpoint(path, self.net, family=self.family, size=self.size, nc=self.nc,
                                   names=self.names, imgsz=self.imgsz,
                                   extra=None if entry is None else {"quantization": entry}))

    def train(self, **kwargs: Any) -> dict[str, Any]:
        """Train on a dataset: ``model.train(data="data.yaml", epochs=100, imgsz=640, batch=16)``.

        Options and defaults: :class:`libreyolo.train.args.TrainArgs` (docs/training.md). Writes
        ``runs/train/<name>/`` (weights/last.pt and best.pt, results.csv/json/png); the model ends
        holding the trained (EMA) weights. Returns a summary (paths, last metrics, best fitness).
        """
        from libreyolo.train.trainer import train

        if self.is_quantized:
            raise ArgumentError("training a quantized model is not supported yet; call model.dequantize() first")
        summary = train(self, **kwargs)
        self._train_graph = summary.get("graph")
        return summary

    def train_graph_info(self) -> dict[str, Any] | None:
        """CUDA-graph use of the last :meth:`train` run: requested, captured shapes, replays, eager
        batches and the reason when nothing was captured (None before any run)."""
        return self._train_graph

    @contextlib.contextmanager
    def _evaluation(self, device: Any, imgsz: int) -> Iterator[tuple[Any, torch.device]]:
        """The master network in eval mode for :meth:`val`, on ``device`` (default as for training:
        the model's GPU, else cuda:0 when there is one, else the model's device)."""
        from libreyolo.train.trainer import training_device
        from libreyolo.utils.checks import resolve_device

        run = resolve_device(device) if device is not None else training_device(self.device)
        self.to(run)
        net, family = self.net, self.family
        was_training = net.training
        net.eval()
        try:
            yield (lambda x: family.named_outputs(net(x))), run
        finally:
            net.train(was_training)

    def export(self, format: str = "onnx", **opts: Any):  # noqa: A002 - the name users know
        """Export to ``onnx``/``executorch``/``coreml``/``tensorrt``/``aoti``/``triton``, validated against this model.
        ``int8=True, data=...`` (or a quantized model) writes an INT8 artifact (docs/quantization.md).

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
