"""The whole-pipeline CUDA graph: letterboxed batch in, padded detections out, read back once.

Shared by everything ``predict(cuda_graph=...)`` can replay: the eager model (its inference
copy's module) and compiled packages (AOTInductor). A predictor mixes in :class:`PipelineGraphs`
and names, for a batch, the :class:`~libreyolo.graphs.GraphRunner` that holds its graphs and the
network as a callable (``batch -> {output name: tensor}``): :meth:`PipelineGraphs._graph_target`.
The graph holds that network, the family's device postprocessing (decoding, candidate
selection, NMS) and nothing else; a family opts in with ``SUPPORTS_PIPELINE_GRAPH`` once the
parity harness proved it equal to the eager pipeline (docs/graphs.md).
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from libreyolo.engine.graph_state import GraphState
from libreyolo.engine.plan import GRAPHED, PIPELINE, CallPlan
from libreyolo.utils.log import LOGGER

Network = Callable[[torch.Tensor], dict[str, torch.Tensor]]
# same-size 8-bit frames uploaded together are letterboxed inside the whole-pipeline graph
FRAMES_IN_GRAPH = True
# ... from the FRAMES_AFTER-th batch of one frame size (or at once after capture_graph(frame_size=...)):
# a folder of photos of many sizes keeps one letterboxed graph instead of capturing one per size
FRAMES_AFTER = 2
_FRAME_SIGHTINGS = 64  # frame keys remembered per model (least recently seen forgotten)
_SIGHT_LOCK = threading.Lock()


class PipelineGraphs:
    """``_infer_start`` as one graph replay where the family and device allow it (a mixin of :class:`Predictor`)."""

    _graphs: GraphState  # the predictor's graph part: backend, graphs kept, counters (made by its __init__)

    def _graph_target(self, batch: torch.Tensor) -> tuple[Any, Network]:
        """(graph runner, network callable) for ``batch``'s device and dtype."""
        raise NotImplementedError

    def _active_graph_backend(self) -> Any:
        return self._graphs.active_backend()

    def set_graph_backend(self, backend: Any) -> None:
        """Capture and replay graphs through ``backend`` (the parity harness, CPU tests:
        :class:`~libreyolo.graphs.EmulatedGraphBackend`); None: real CUDA graphs. Set it before the
        first graphed call: runners made before keep the backend they were made with."""
        self._graphs.set_backend(backend)

    def _require_graph_support(self) -> None:
        if not self.family.SUPPORTS_CUDA_GRAPH:
            from libreyolo.graphs import GraphNotSupportedError

            raise GraphNotSupportedError(
                f"CUDA graphs are not enabled for family {self.family.name!r}: it has not passed the graph "
                "parity check (python -m libreyolo.graphs.parity), and replaying an unverified forward could "
                "return wrong numbers without any warning. Use cuda_graph=False."
            )

    def pipeline_unavailable(self, device: torch.device | None = None) -> str | None:
        """None if ``predict(cuda_graph=...)`` on ``device`` runs the whole pipeline as one graph, else why
        it graphs the network forward only (``graph_info()["pipeline"]`` reports the same)."""
        family = self.family
        if not family.SUPPORTS_PIPELINE_GRAPH or family.device_postprocess() is None:
            return (f"family {family.name!r} has not passed the whole-pipeline parity check "
                    "(SUPPORTS_PIPELINE_GRAPH is False): its network forward is graphed, postprocessing runs eagerly")
        if not getattr(self._active_graph_backend(), "real", True):
            return None  # an emulated backend replays by calling: any postprocessing is fine there
        why = family.device_postprocess().capture_safe(self.device if device is None else device)
        return None if why is None else f"{why}; the network forward is graphed, postprocessing runs eagerly"

    def _graph_info_head(self) -> dict[str, Any]:
        """The leading keys of ``graph_info()`` (docs/graphs.md): family, support and the pipeline's state."""
        why = self.pipeline_unavailable()
        return {"family": self.family.name, "supported": bool(self.family.SUPPORTS_CUDA_GRAPH),
                "pipeline": {"supported": bool(self.family.SUPPORTS_PIPELINE_GRAPH), "active": why is None,
                             "reason": why}}

    def _pipeline_program(self, network: Network, static: tuple[tuple[str, Any], ...],
                          frames: tuple[Any, bool, torch.dtype] | None = None):
        """The captured program: network and device postprocessing, keyed by the options that fix
        its shapes (``static``: the device postprocess's ``static(opts)``, e.g. max_det, max_nms).
        With ``frames`` = (letterbox, bgr, input dtype) the program starts from the uploaded 8-bit
        frames and letterboxes them itself (:meth:`~libreyolo.ops.letterbox.Letterbox.place_batch`)."""
        from libreyolo.graphs import GraphProgram

        post = self.family.device_postprocess()
        fixed = dict(static)
        if frames is None:
            def pipeline(x: torch.Tensor, params: torch.Tensor) -> dict[str, torch.Tensor]:
                return post(network(x), params, **fixed)

            return GraphProgram("pipeline", pipeline, tuple(static))
        pre, bgr, dtype = frames

        def from_frames(raw: torch.Tensor, params: torch.Tensor) -> dict[str, torch.Tensor]:
            return post(network(pre.place_batch(raw, bgr, dtype)), params, **fixed)

        options = (*static, ("preprocess", repr(pre)), ("bgr", bgr), ("input_dtype", str(dtype).removeprefix("torch.")))
        return GraphProgram("letterbox+pipeline", from_frames, options)

    @staticmethod
    def _frame_key(raw: torch.Tensor, bgr: bool, pre: Any, dtype: torch.dtype, static: tuple) -> tuple:
        return tuple(raw.shape), str(raw.device), bgr, repr(pre), str(dtype), static

    def _frame_sighting(self, key: tuple, at_least: int = 0) -> int:
        """How many batches of this frame key were seen, this one included (at least ``at_least``)."""
        with _SIGHT_LOCK:
            seen = self._calls.frame_sightings
            count = max(seen.pop(key, 0) + 1, at_least)
            seen[key] = count
            while len(seen) > _FRAME_SIGHTINGS:
                seen.popitem(last=False)
        return count

    def _infer_frames_start(self, frames: tuple[torch.Tensor, bool], clock: Any,
                            plan: CallPlan) -> tuple[Callable[[], list], list] | None:
        """The letterbox too inside the whole-pipeline graph: one replay from the uploaded frames to
        padded detections, where the pipeline graph runs and the preprocessing can be captured
        (a :class:`~libreyolo.ops.letterbox.Letterbox`: every shape follows from the frame size),
        from the :data:`FRAMES_AFTER`-th batch of a frame size on (a graph per frame size pays only
        where sizes repeat: a video, a camera, a server), or at once after
        ``capture_graph(frame_size=...)``.
        The numbers equal the letterbox run outside the graph (``tests/test_letterbox_batched.py``, and
        on a GPU ``tests/test_stream_pipeline.py``)."""
        raw, bgr = frames
        pre, dtype, opts = plan.preprocessor, plan.dtype, plan.task_options
        if plan.executor != PIPELINE or not FRAMES_IN_GRAPH or not callable(getattr(pre, "place_batch", None)):
            return None
        from libreyolo.graphs import GraphCaptureError

        post = self.family.device_postprocess()
        if self._frame_sighting(self._frame_key(raw, bgr, pre, dtype, post.static(opts))) < FRAMES_AFTER:
            return None
        n, h, w = (int(v) for v in raw.shape[:3])
        metas = pre.metas_for(h, w, n)
        clock.mark()
        runner, network = self._graph_target(raw.new_empty(0, dtype=dtype))
        params = post.params(metas, opts, nc=self.nc, device=raw.device)
        program = self._pipeline_program(network, post.static(opts), (pre, bgr, dtype))
        try:
            with torch.inference_mode():
                padded = runner((raw, params), plan.graph, program)
        except GraphCaptureError as exc:  # recorded in graph_info()["failures"]; letterbox outside the graph
            LOGGER.warning("CUDA graph with the letterbox inside unavailable for this input (%s); letterboxing "
                           "outside it", exc)
            return None
        clock.mark()
        return post.read_later(padded), metas

    def _pipeline_forward(self, batch: torch.Tensor, metas: list, mode: bool | str, opts: Any = None,
                          **options: Any) -> dict[str, torch.Tensor]:
        """Padded outputs of the whole-pipeline graph (no family check: the parity harness uses it).
        ``opts``: the call's :class:`~libreyolo.tasks.TaskOptions` (or the task's options as keywords)."""
        if opts is None:
            opts = self.predict_options(**options)
        runner, network = self._graph_target(batch)
        post = self.family.device_postprocess()
        params = post.params(metas, opts, nc=self.nc, device=batch.device)
        static = post.static(opts)
        program = self._pipeline_program(network, static)
        with torch.inference_mode():
            return runner((batch, params), mode, program)

    def _infer_start(self, batch: torch.Tensor, metas: list, clock: Any, plan: CallPlan) -> Callable[[], list]:
        """With the ``pipeline`` executor (``cuda_graph`` on, and a family and device verified for
        it: decided in the plan), one graph replay from the batch to padded outputs, read back by
        the returned call; otherwise the forward (graphed or not) and eager postprocessing
        (:meth:`Predictor._infer_start`)."""
        if plan.executor == PIPELINE:
            from libreyolo.graphs import GraphCaptureError

            try:
                padded = self._pipeline_forward(batch, metas, plan.graph, plan.task_options)
            except GraphCaptureError as exc:  # recorded in graph_info()["failures"]; the forward graph still serves
                LOGGER.warning("whole-pipeline CUDA graph unavailable for this input (%s); graphing the network "
                               "forward only", exc)
            else:
                clock.mark()
                return self.family.device_postprocess().read_later(padded)
        return super()._infer_start(batch, metas, clock, plan)

    def _graph_executor(self, device: torch.device) -> str:
        """The executor of a graphed call on ``device``: the whole pipeline where it can be captured there."""
        self._require_graph_support()
        return PIPELINE if self.pipeline_unavailable(device) is None else GRAPHED
