"""The CUDA graphs of a :class:`~libreyolo.engine.model.Model`: one
:class:`~libreyolo.graphs.GraphRunner` per inference copy (device and precision; with ``compile``
on, another whose graphs hold the compiled network), ``capture_graph()``, ``graph_info()`` and
``release_graphs()`` (docs/graphs.md). The whole-pipeline programs they replay are
:mod:`libreyolo.engine.pipeline`'s."""
from __future__ import annotations

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


class ModelGraphs:
    """The graph methods of :class:`~libreyolo.engine.model.Model` (a mixin: it uses the model's
    inference copies, its graph part (:class:`~libreyolo.engine.graph_state.GraphState`), compile part
    and family)."""

    def _graph_forward(self, batch: torch.Tensor, mode: bool | str) -> dict[str, torch.Tensor]:
        """Graph replay without the family check (the parity harness uses it to verify a family)."""
        runner = self._graph_runner(self._copies().get(batch.device, batch.dtype))
        with torch.inference_mode():
            return runner(batch, mode)

    # --- the whole-pipeline graph: forward + decoding + candidates + NMS (libreyolo.engine.pipeline) ---
    def _graph_target(self, batch: torch.Tensor) -> tuple[Any, Any]:
        runner = self._graph_runner(self._copies().get(batch.device, batch.dtype))
        return runner, runner.fn

    def _network(self, module: nn.Module):
        family = self.family

        def network(x: torch.Tensor) -> dict[str, torch.Tensor]:
            return family.named_outputs(module(x))

        return network

    def _graph_runner(self, copy: InferenceCopy | None = None):
        """The :class:`~libreyolo.graphs.GraphRunner` of an inference copy (default: the one for the
        model's device and precision). Graphs capture the copy's module and are released with it;
        with :meth:`compile` on, another runner's graphs capture the copy's compiled network
        (validated against the copy before its first capture of a shape)."""
        copy = self.inference_copy() if copy is None else copy
        if not self._compilation.on:
            return copy.attached(GRAPHS, self._new_graph_runner)
        runner = copy.attachment(GRAPHS_COMPILED)
        if runner is not None:
            return runner
        compiled = self._compiled(copy, in_graph=True)
        return copy.attached(GRAPHS_COMPILED, lambda module: self._new_graph_runner(module, compiled))

    def _new_graph_runner(self, module: nn.Module, network: Any = None):
        return self._graphs.new_runner(module, self._network(module) if network is None else network)

    def _graph_runners(self) -> list:
        """The graph runners of the live inference copies (none made here)."""
        return [r for c in self._copies().live() for r in (c.attachment(n) for n in RUNNERS) if r is not None]

    def graph_options(self, *, max_graphs: int | None = None) -> dict[str, Any]:
        """Set graph options; returns the current ones. ``max_graphs``: graphs kept per inference copy
        (device and precision; LRU, default 16)."""
        if max_graphs is not None:
            self._graphs.set_max_graphs(max_graphs, self._graph_runners())
        return {"max_graphs": self._graphs.max_graphs}

    def capture_graph(self, imgsz: int | None = None, batch: int = 1,
                      dtype: torch.dtype | None = None, *, frame_size: Any = None, color_format: str = "bgr",
                      **options: Any) -> dict[str, Any]:
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
        from libreyolo.engine.plan import PIPELINE
        from libreyolo.graphs import GraphUnavailableError

        self._require_graph_support()
        if dtype is not None and dtype not in (torch.float32, torch.float16):
            raise ArgumentError(f"dtype must be torch.float32 or torch.float16, got {dtype!r}")
        why_not = self._active_graph_backend().unavailable(self.device)
        if why_not is not None:
            raise GraphUnavailableError(f"capture_graph() needs a CUDA device: {why_not}")
        # the plan predict(imgsz=, batch=, half=, cuda_graph=True, **options) runs with: every option checked
        # (also where only the forward is captured)
        plan = self.plan(imgsz=imgsz, batch=batch, half=None if dtype is None else dtype == torch.float16,
                         cuda_graph=True, **options)
        imgsz, batch, dtype, opts = plan.imgsz, plan.batch, plan.dtype, plan.task_options
        runner = self._graph_runner(self.inference_copy(self.device, dtype))
        if frame_size is not None:
            return self._capture_frames_graph(runner, plan, frame_size, color_format)
        pad = self.family.letterbox(imgsz).neutral_input  # a blank image, as preprocessed
        x = torch.full((batch, 3, imgsz, imgsz), pad, dtype=dtype, device=self.device)
        if plan.executor == PIPELINE:
            from libreyolo.ops.letterbox import LetterboxMeta

            post = self.family.device_postprocess()
            metas = [LetterboxMeta((imgsz, imgsz), 1.0, (0.0, 0.0))] * batch
            params = post.params(metas, opts, nc=self.nc, device=self.device)
            program = self._pipeline_program(runner.fn, post.static(opts))
            with torch.inference_mode():
                return runner.capture((x, params), program)
        with torch.inference_mode():
            return runner.capture(x)

    def _capture_frames_graph(self, runner: Any, plan: Any, frame_size: Any, color_format: str) -> dict[str, Any]:
        """capture_graph(frame_size=...): the letterbox+pipeline program for grey frames of that size."""
        from libreyolo.data.sources import check_pixels
        from libreyolo.engine.options import PREDICT_OPTIONS as P

        bgr = P["color_format"].check("color_format", color_format) == "bgr"
        sides = frame_size if isinstance(frame_size, (tuple, list)) and len(frame_size) == 2 else ()
        if not sides or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in sides):
            raise ArgumentError(f"frame_size must be (height, width) in pixels, e.g. (480, 640), got {frame_size!r}")
        check_pixels(sides[1], sides[0], "frame_size")
        pre, batch, dtype, opts = plan.preprocessor, plan.batch, plan.dtype, plan.task_options
        why = self.pipeline_unavailable(self.device)
        if why is not None or not callable(getattr(pre, "place_batch", None)):
            raise ArgumentError(f"frame_size: this model letterboxes outside its graph "
                                f"({why or 'its preprocessing cannot be captured'}); call capture_graph() without it")
        post = self.family.device_postprocess()
        h, w = frame_size
        raw = torch.full((batch, h, w, 3), 114, dtype=torch.uint8, device=self.device)
        params = post.params(pre.metas_for(h, w, batch), opts, nc=self.nc, device=self.device)
        program = self._pipeline_program(runner.fn, post.static(opts), (pre, bgr, dtype))
        from libreyolo.engine.pipeline import FRAMES_AFTER

        self._frame_sighting(self._frame_key(raw, bgr, pre, dtype, post.static(opts)), at_least=FRAMES_AFTER)
        with torch.inference_mode():
            return runner.capture((raw, params), program)

    def graph_info(self) -> dict[str, Any]:
        """Captured graphs, fallbacks, failures and counters; the schema is in docs/graphs.md.

        Graphs of every inference copy (device and precision) are listed; the counters include
        graphs dropped with copies that were retired because the weights changed.
        """
        info = self._graph_info_head()
        runners = self._graph_runners() or [self._graph_runner()]
        info.update(self._graphs.merged_info([r.info() for r in runners]))
        return info

    def release_graphs(self) -> None:
        """Free every captured graph and its memory; recorded capture failures are forgotten too."""
        for runner in self._graph_runners():
            runner.release()
