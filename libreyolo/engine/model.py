"""The eager PyTorch model: a family's network plus its metadata, with ``predict()`` and ``save()``."""
from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from libreyolo.checkpoint import Checkpoint, load_state, save_checkpoint
from libreyolo.engine.calls import CallState
from libreyolo.engine.compile_state import Compilation
from libreyolo.engine.graph_state import GraphState
from libreyolo.engine.graphed import ForwardGraphs, capture_graph
from libreyolo.engine.inference import CHANNELS_LAST_CHOICES, InferenceCopies, InferenceCopy
from libreyolo.engine.pipeline import PipelineExecutor
from libreyolo.engine.plan import COMPILED as COMPILED_EXECUTOR
from libreyolo.engine.plan import EAGER, CallPlan
from libreyolo.engine.predictor import Predictor
from libreyolo.engine.quantized import Quantization, calibration_batches
from libreyolo.errors import ArgumentError
from libreyolo.models.base import Family

_SETUP_LOCK = threading.Lock()  # makes a model's inference-copy cache exactly once per master network


class Model(Predictor):
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
        self._inference_opts: dict[str, Any] = {"fold_bn": "auto", "channels_last": "auto"}
        # the parts, declared here (none is created behind the model's back), each usable alone:
        self._inference: InferenceCopies | None = None  # the current master's inference copies (first use: _copies)
        self._calls = CallState()  # call plans, staging buffers, frame sizes seen (libreyolo.engine.calls)
        self._graphs = GraphState()  # graph backend, graphs kept, retired counters (libreyolo.engine.graph_state)
        self._compilation = Compilation()  # compile(): the mode, its programs (libreyolo.engine.compile_state)
        self._forward_graphs = ForwardGraphs(self._graphs, self._compilation, family)  # a runner per copy
        self._pipeline = self._pipeline_part()  # the whole-pipeline graph (libreyolo.engine.pipeline)
        self._quant = Quantization()  # quantize(): the simulated recipe (libreyolo.engine.quantized)
        self._train_graph: dict[str, Any] | None = None  # the last train() run's graph use
        self._tracking: Any = None  # the tracks of track(persist=True) (libreyolo.track.tracking.Tracking)
        if device is not None:
            self.to(device)

    @classmethod
    def from_checkpoint(cls, ckpt: Checkpoint, device: str | torch.device | None = None) -> Model:
        model = cls(ckpt.family, ckpt.size, nc=ckpt.nc, names=ckpt.names, imgsz=ckpt.imgsz,
                    state_dict=ckpt.state_dict, source=ckpt.path, device=device)
        if ckpt.meta.get("quantization") is not None:  # a quantized save (docs/quantization.md)
            model.restore_quantization(ckpt.meta["quantization"], ckpt.path or "checkpoint")
        return model

    # what a copy of the model rebuilds on first use instead of copying: the inference-copy cache (with
    # its CUDA graphs and compiled programs) and the pinned staging buffers hold device memory and locks
    _RUNTIME_STATE = ("_inference", "_calls", "_pipeline")

    def __deepcopy__(self, memo: dict[int, Any]) -> Model:
        """``copy.deepcopy(model)``: its own master weights, settings and quantization state; inference
        copies, graphs, compiled programs and staging buffers are made again when the copy runs. A
        graph backend set on the model is shared (it is a strategy, not state: :class:`GraphState`)."""
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            if key in self._RUNTIME_STATE:
                continue
            new.__dict__[key] = copy.deepcopy(value, memo)
        new._calls = CallState()  # and _inference: the class default (None) until the copy runs
        new._pipeline = new._pipeline_part()
        return new

    def _pipeline_part(self) -> PipelineExecutor:
        return PipelineExecutor(self.family, lambda: self.nc, self._graphs, self._calls, self._graph_target)

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
        return (*super()._plan_state(), self._half, self._compilation.mode)

    def _choose_executor(self, device: torch.device, graph: bool | str) -> str:
        if graph:
            return self._pipeline.executor(self.pipeline_unavailable(device))
        return COMPILED_EXECUTOR if self._compilation.on else EAGER

    def _execute(self, batch: torch.Tensor, plan: CallPlan) -> dict[str, torch.Tensor]:
        """The plan's executor on the inference copy for ``batch``'s device and dtype."""
        copy = self._copies().get(batch.device, batch.dtype)
        with copy.kernels().active():  # kernel slots resolved once per copy, not per layer call
            if plan.graphed:  # the forward graph (also where a pipeline capture failed for this input)
                with torch.inference_mode():
                    return self._forward_graphs.runner(copy)(batch, plan.graph)
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
            runners = ForwardGraphs.runners([c])
            live.append({**c.describe(), "graphs": sum(len(r.info()["graphs"]) for r in runners)})
        return {"options": dict(self._inference_opts), "default_dtype": str(self._default_dtype()).replace(
            "torch.", ""), "copies": live, "builds": copies.builds}

    def _default_dtype(self) -> torch.dtype:
        return torch.float16 if self._half else torch.float32

    def _note_retired(self, reason: str, retired: list[InferenceCopy]) -> None:
        """Copies were dropped: their graphs and compiled programs go with them; keep the counters cumulative."""
        self._compilation.retire(retired, reason)
        self._graphs.retire(ForwardGraphs.runners(retired), reason)

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
        self._compilation.set_mode(mode, self._copies().live())
        return self

    def _compiled(self, copy: InferenceCopy, *, in_graph: bool = False):
        """The copy's :class:`~libreyolo.engine.compiled.CompiledForward`, or None when compile is off;
        ``in_graph``: the one our CUDA graphs capture (a mode without Inductor's CUDA graphs)."""
        return self._compilation.program(copy, self.family, in_graph=in_graph)

    def compile_info(self) -> dict[str, Any]:
        """What :meth:`compile` does now: the requested mode, the rule for ``cuda_graph=True``, and per
        live inference copy its mode, whether it serves compiled, the shapes validated (with compile
        seconds and the worst ratio to the allowance), the fallback reason if any, and call counts."""
        return self._compilation.info(self._copies().live())

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
        self._pipeline.require_support()
        return self.graph_forward(batch, cuda_graph)

    def graph_forward(self, batch: torch.Tensor, mode: bool | str = True) -> dict[str, torch.Tensor]:
        """The network's named outputs for a preprocessed ``batch`` by graph replay in ``mode`` (True or
        "auto"), without the family check: what the parity harness verifies a family with, and the
        benchmarks time as the network alone (docs/graphs.md)."""
        return self._forward_graphs.forward(self._copies().get(batch.device, batch.dtype), batch, mode)

    def pipeline_forward(self, batch: torch.Tensor, metas: list, mode: bool | str = True, opts: Any = None,
                         **options: Any) -> dict[str, torch.Tensor]:
        """Padded outputs of the whole-pipeline program (network and device postprocessing) for a
        letterboxed ``batch`` (``metas``: its letterbox records), replayed as a graph (``mode`` True or
        "auto") or run eagerly (False), without the family check: the parity harness and the benchmarks
        use it. ``opts``: the call's :class:`~libreyolo.tasks.TaskOptions`, or the task's options as
        keywords (detect: conf, iou, max_det, ...)."""
        return self._pipeline.forward(batch, metas, mode, self.predict_options(**options) if opts is None else opts)

    def set_graph_backend(self, backend: Any) -> None:
        """Capture and replay graphs through ``backend`` (the parity harness, CPU tests:
        :class:`~libreyolo.graphs.EmulatedGraphBackend`); None: real CUDA graphs. Set it before the
        first graphed call: runners made before keep the backend they were made with."""
        self._graphs.set_backend(backend)

    def pipeline_unavailable(self, device: torch.device | None = None) -> str | None:
        """None if ``predict(cuda_graph=...)`` on ``device`` (default: the model's) runs the whole pipeline
        as one graph, else why it graphs the network forward only (``graph_info()["pipeline"]`` says the same)."""
        return self._pipeline.unavailable(self.device if device is None else device)

    def _graph_runner(self, copy: InferenceCopy | None = None) -> Any:
        """The :class:`~libreyolo.graphs.GraphRunner` of an inference copy (default: the one for the
        model's device and precision): :meth:`ForwardGraphs.runner`."""
        return self._forward_graphs.runner(self.inference_copy() if copy is None else copy)

    def _graph_target(self, batch: torch.Tensor) -> tuple[Any, Any]:
        """(runner, network) of the whole-pipeline graph for ``batch``: the :class:`PipelineExecutor`'s target."""
        runner = self._forward_graphs.runner(self._copies().get(batch.device, batch.dtype))
        return runner, runner.fn

    def graph_options(self, *, max_graphs: int | None = None) -> dict[str, Any]:
        """Set graph options; returns the current ones. ``max_graphs``: graphs kept per inference copy
        (device and precision; LRU, default 16)."""
        return self._forward_graphs.options(self._copies().live(), max_graphs)

    def capture_graph(self, imgsz: int | None = None, batch: int = 1, dtype: torch.dtype | None = None, *,
                      frame_size: Any = None, color_format: str = "bgr", **options: Any) -> dict[str, Any]:
        """Capture what ``predict(cuda_graph=True)`` replays for ``(batch, 3, imgsz, imgsz)`` now, so
        the first request does not pay: the whole pipeline for the task's shape-fixing options
        (detect: ``max_det``, ``max_nms``) where the family supports it (:meth:`pipeline_unavailable`),
        else the network forward.

        ``frame_size=(h, w)``: capture instead the graph that starts from ``batch`` uploaded 8-bit
        frames of that size (arrays in ``color_format``, files, video frames) and letterboxes them
        inside (docs/graphs.md); predict() then uses it from the first such batch.

        ``dtype``: None is the model's precision (see :meth:`half`); ``torch.float16`` captures for
        ``predict(half=True)`` on its float16 inference copy (the model is not converted). Returns
        the graph's entry of :meth:`graph_info`.
        """
        return capture_graph(self, imgsz, batch, dtype, frame_size=frame_size, color_format=color_format, **options)

    def graph_info(self) -> dict[str, Any]:
        """Captured graphs, fallbacks, failures and counters; the schema is in docs/graphs.md.

        Graphs of every inference copy (device and precision) are listed; the counters include
        graphs dropped with copies that were retired because the weights changed.
        """
        head = self._pipeline.info_head(self.device)
        return self._forward_graphs.info(self._copies().live(), head, self.inference_copy)

    def release_graphs(self) -> None:
        """Free every captured graph and its memory; recorded capture failures are forgotten too."""
        self._forward_graphs.release(self._copies().live())

    # --- quantization (libreyolo.engine.quantized, docs/quantization.md) -----------------------
    def quantize(self, recipe: str = "int8", data: Any = None, samples: int = 256, method: str = "minmax",
                 exclude: str | Sequence[str] | None = None) -> Model:
        """Calibrate on ``samples`` images of ``data`` and switch to simulated ``recipe`` numerics.

        ``recipe``: ``int8`` or ``fp8``. ``method``: ``minmax``, ``percentile`` or ``entropy``
        (:mod:`libreyolo.quant.calibrate`). ``exclude``: module-name globs kept in float, on top
        of the family's ``quant_exclude``. A quantized model is calibrated again from float.
        Returns the model.
        """
        self._quant.quantize(self.net, self._copies(), self.calibration_batches,
                             family_exclude=tuple(self.family.quant_exclude), recipe=recipe, data=data,
                             samples=samples, method=method, exclude=exclude)
        return self

    def dequantize(self) -> Model:
        """Back to the float model, exactly as before :meth:`quantize`. Returns the model."""
        self._quant.dequantize(self.net, self._copies())
        return self

    @property
    def is_quantized(self) -> bool:
        return self._quant.active

    def quant_info(self) -> dict[str, Any] | None:
        """recipe, method, samples, the quantized layer names and count, the excluded names with
        the reason, and notes; None for a float model."""
        return self._quant.info(self.net)

    def quant_entry(self) -> dict[str, Any] | None:
        """The checkpoint's ``quantization`` entry (None: float); what export writes for a quantized model."""
        return self._quant.entry(self.net)

    def restore_quantization(self, entry: Any, where: str) -> None:
        """Quantize as a checkpoint's ``quantization`` entry says (``where`` names it in errors)."""
        self._quant.restore(self.net, self._copies(), entry, where)

    def calibration_batches(self, files: list) -> Iterator[torch.Tensor]:
        """The calibration images, preprocessed exactly as predict() does at ``imgsz`` (float32)."""
        return calibration_batches(self._preprocessor(self.imgsz), self.device, files)

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
        entry = self._quant.entry(self.net)
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
    def evaluation(self, device: Any, imgsz: int) -> Iterator[tuple[Any, torch.device]]:
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
