"""The forward CUDA graphs of a :class:`~libreyolo.engine.model.Model`: :class:`ForwardGraphs`, the part
that keeps one :class:`~libreyolo.graphs.GraphRunner` per inference copy (device and precision; with
``compile`` on, another whose graphs hold the compiled network), and :func:`capture_graph`, what the
model's ``capture_graph()`` runs (docs/graphs.md). The whole-pipeline programs they replay are
the model's :class:`~libreyolo.engine.pipeline.PipelineExecutor`'s."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from libreyolo.engine.inference import InferenceCopy
from libreyolo.errors import ArgumentError

GRAPHS = "graphs"  # the name a copy's GraphRunner is attached under (docs/inference.md)
COMPILED = "compiled"  # ... and its torch.compile program (libreyolo.engine.compiled)
GRAPHS_COMPILED = "graphs:compiled"  # with compile on: the GraphRunner whose graphs hold the compiled network
COMPILED_IN_GRAPH = "compiled:in-graph"  # ... and that network (a mode without Inductor CUDA graphs)
RUNNERS = (GRAPHS, GRAPHS_COMPILED)


class ForwardGraphs:
    """The graph runners of a model's inference copies (a part of the model, usable alone).

    ``state``: the model's :class:`~libreyolo.engine.graph_state.GraphState` (backend, graphs kept,
    counters); ``compilation``: its :class:`~libreyolo.engine.compile_state.Compilation` (with compile
    on, graphs capture the copy's compiled network); ``family``: names the network's outputs.
    Runners are attached to the copies, so they go when the copies are retired."""

    def __init__(self, state: Any, compilation: Any, family: Any) -> None:
        self.state = state
        self.compilation = compilation
        self.family = family

    def network(self, module: nn.Module) -> Callable[[torch.Tensor], dict[str, torch.Tensor]]:
        """``module``'s forward with the family's output names (what a runner captures)."""
        family = self.family

        def network(x: torch.Tensor) -> dict[str, torch.Tensor]:
            return family.named_outputs(module(x))

        return network

    def runner(self, copy: InferenceCopy) -> Any:
        """The :class:`~libreyolo.graphs.GraphRunner` of ``copy``, made on first use. Graphs capture the
        copy's module and are released with it; with compile on, another runner's graphs capture the
        copy's compiled network (validated against the copy before its first capture of a shape)."""
        if not self.compilation.on:
            return copy.attached(GRAPHS, self._new_runner)
        runner = copy.attachment(GRAPHS_COMPILED)
        if runner is not None:
            return runner
        compiled = self.compilation.program(copy, self.family, in_graph=True)
        return copy.attached(GRAPHS_COMPILED, lambda module: self._new_runner(module, compiled))

    def _new_runner(self, module: nn.Module, network: Any = None) -> Any:
        return self.state.new_runner(module, self.network(module) if network is None else network)

    def forward(self, copy: InferenceCopy, batch: torch.Tensor, mode: bool | str) -> dict[str, torch.Tensor]:
        """``batch`` through ``copy``'s runner in graph ``mode`` (no family check)."""
        runner = self.runner(copy)
        with torch.inference_mode():
            return runner(batch, mode)

    @staticmethod
    def runners(copies: Iterable[InferenceCopy]) -> list:
        """The runners of ``copies`` (none made here)."""
        return [r for c in copies for r in (c.attachment(n) for n in RUNNERS) if r is not None]

    def options(self, copies: Iterable[InferenceCopy], max_graphs: int | None = None) -> dict[str, Any]:
        """``graph_options()``: set ``max_graphs`` (for new runners and those of ``copies``); the current ones."""
        if max_graphs is not None:
            self.state.set_max_graphs(max_graphs, self.runners(copies))
        return {"max_graphs": self.state.max_graphs}

    def info(self, copies: list[InferenceCopy], head: dict[str, Any],
             default: Callable[[], InferenceCopy]) -> dict[str, Any]:
        """``graph_info()``: ``head`` (family, support, pipeline) and the runners of ``copies`` merged
        with the counters of retired ones (when there is none, the runner of the copy ``default()``
        gives, made if needed)."""
        runners = self.runners(copies) or [self.runner(default())]
        return {**head, **self.state.merged_info([r.info() for r in runners])}

    def release(self, copies: Iterable[InferenceCopy]) -> None:
        """Free every captured graph of ``copies`` and its memory; recorded capture failures are forgotten too."""
        for runner in self.runners(copies):
            runner.release()


def capture_graph(model: Any, imgsz: int | None = None, batch: int = 1, dtype: torch.dtype | None = None, *,
                  frame_size: Any = None, color_format: str = "bgr", **options: Any) -> dict[str, Any]:
    """``model.capture_graph(...)`` (:meth:`libreyolo.engine.model.Model.capture_graph`): the plan of the
    graphed predict with these options, then the capture of its whole-pipeline or forward graph."""
    from libreyolo.engine.plan import PIPELINE
    from libreyolo.graphs import GraphUnavailableError

    pipe = model._pipeline  # the model's PipelineExecutor (libreyolo.engine.pipeline)
    pipe.require_support()
    if dtype is not None and dtype not in (torch.float32, torch.float16):
        raise ArgumentError(f"dtype must be torch.float32 or torch.float16, got {dtype!r}")
    why_not = model._graphs.active_backend().unavailable(model.device)
    if why_not is not None:
        raise GraphUnavailableError(f"capture_graph() needs a CUDA device: {why_not}")
    # the plan predict(imgsz=, batch=, half=, cuda_graph=True, **options) runs with: every option checked
    # (also where only the forward is captured)
    plan = model.plan(imgsz=imgsz, batch=batch, half=None if dtype is None else dtype == torch.float16,
                     cuda_graph=True, **options)
    imgsz, batch, dtype, opts = plan.imgsz, plan.batch, plan.dtype, plan.task_options
    runner = model._graph_runner(model.inference_copy(model.device, dtype))
    if frame_size is not None:
        return _capture_frames_graph(model, runner, plan, frame_size, color_format)
    pad = model.family.letterbox(imgsz).neutral_input  # a blank image, as preprocessed
    x = torch.full((batch, 3, imgsz, imgsz), pad, dtype=dtype, device=model.device)
    if plan.executor == PIPELINE:
        from libreyolo.ops.letterbox import LetterboxMeta

        post = model.family.device_postprocess()
        metas = [LetterboxMeta((imgsz, imgsz), 1.0, (0.0, 0.0))] * batch
        params = post.params(metas, opts, nc=model.nc, device=model.device)
        program = pipe.program(runner.fn, post.static(opts))
        with torch.inference_mode():
            return runner.capture((x, params), program)
    with torch.inference_mode():
        return runner.capture(x)


def _capture_frames_graph(model: Any, runner: Any, plan: Any, frame_size: Any, color_format: str) -> dict[str, Any]:
    """capture_graph(frame_size=...): the letterbox+pipeline program for grey frames of that size."""
    from libreyolo.data.sources import check_pixels
    from libreyolo.engine.options import PREDICT_OPTIONS as P

    bgr = P["color_format"].check("color_format", color_format) == "bgr"
    sides = frame_size if isinstance(frame_size, (tuple, list)) and len(frame_size) == 2 else ()
    if not sides or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in sides):
        raise ArgumentError(f"frame_size must be (height, width) in pixels, e.g. (480, 640), got {frame_size!r}")
    check_pixels(sides[1], sides[0], "frame_size")
    pre, batch, dtype, opts = plan.preprocessor, plan.batch, plan.dtype, plan.task_options
    why = model.pipeline_unavailable(model.device)
    if why is not None or not callable(getattr(pre, "place_batch", None)):
        raise ArgumentError(f"frame_size: this model letterboxes outside its graph "
                            f"({why or 'its preprocessing cannot be captured'}); call capture_graph() without it")
    post = model.family.device_postprocess()
    h, w = frame_size
    raw = torch.full((batch, h, w, 3), 114, dtype=torch.uint8, device=model.device)
    params = post.params(pre.metas_for(h, w, batch), opts, nc=model.nc, device=model.device)
    pipe = model._pipeline
    program = pipe.program(runner.fn, post.static(opts), (pre, bgr, dtype))
    from libreyolo.engine.pipeline import FRAMES_AFTER

    pipe.sighting(pipe.frame_key(raw, bgr, pre, dtype, post.static(opts)), at_least=FRAMES_AFTER)
    with torch.inference_mode():
        return runner.capture((raw, params), program)
