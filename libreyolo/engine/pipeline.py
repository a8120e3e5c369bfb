"""The whole-pipeline CUDA graph: letterboxed batch in, padded detections out, read back once.

:class:`PipelineExecutor` is a part of its own, declared by everything ``predict(cuda_graph=...)``
can replay: the eager :class:`~libreyolo.engine.model.Model` (its inference copy's module) and the
AOTInductor runtime (a compiled package). Its owner hands it the family, the graph part
(:class:`~libreyolo.engine.graph_state.GraphState`), the call part (frame sizes seen) and a
``target``: for a batch, the :class:`~libreyolo.graphs.GraphRunner` that holds its graphs and the
network as a callable (``batch -> {output name: tensor}``). The call plan decides once whether a
call runs here (the ``pipeline`` executor, :meth:`PipelineExecutor.executor`); the predictor's batch
start then calls :meth:`PipelineExecutor.start` (or :meth:`PipelineExecutor.start_frames`).
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
Target = Callable[[torch.Tensor], tuple[Any, Network]]  # batch -> (graph runner, network callable)
# same-size 8-bit frames uploaded together are letterboxed inside the whole-pipeline graph
FRAMES_IN_GRAPH = True
# ... from the FRAMES_AFTER-th batch of one frame size (or at once after capture_graph(frame_size=...)):
# a folder of photos of many sizes keeps one letterboxed graph instead of capturing one per size
FRAMES_AFTER = 2
_FRAME_SIGHTINGS = 64  # frame keys remembered per model (least recently seen forgotten)
_SIGHT_LOCK = threading.Lock()


class PipelineExecutor:
    """The whole-pipeline graph of one predictor (a part, usable alone: tests/test_model_parts.py).

    ``family``: the network's family (its device postprocessing, its graph switches); ``nc``: the
    number of classes now (a call: training may change it); ``graphs``: the owner's
    :class:`GraphState` (backend); ``calls``: the owner's :class:`~libreyolo.engine.calls.CallState`
    (frame sizes seen); ``target``: ``batch -> (runner, network)``. ``frames``: False keeps the
    letterbox outside the graph (packages: verified on a GPU for the eager model only).
    ``reason``: set where this owner never graphs (an AOTInductor package on the CPU): what
    :meth:`unavailable` says."""

    def __init__(self, family: Any, nc: Callable[[], int], graphs: GraphState, calls: Any, target: Target, *,
                 frames: bool = True, reason: str | None = None) -> None:
        self.family = family
        self.nc = nc
        self.graphs = graphs
        self.calls = calls
        self.target = target
        self.frames = frames
        self.reason = reason

    # --- what the plan decides --------------------------------------------------------------
    def require_support(self) -> None:
        """Raise :class:`~libreyolo.graphs.GraphNotSupportedError` unless the family passed the graph parity check."""
        if not self.family.SUPPORTS_CUDA_GRAPH:
            from libreyolo.graphs import GraphNotSupportedError

            raise GraphNotSupportedError(
                f"CUDA graphs are not enabled for family {self.family.name!r}: it has not passed the graph "
                "parity check (python -m libreyolo.graphs.parity), and replaying an unverified forward could "
                "return wrong numbers without any warning. Use cuda_graph=False."
            )

    def unavailable(self, device: torch.device) -> str | None:
        """None if a graphed call on ``device`` runs the whole pipeline as one graph, else why it graphs
        the network forward only (``graph_info()["pipeline"]["reason"]``)."""
        if self.reason is not None:
            return self.reason
        family = self.family
        if not family.SUPPORTS_PIPELINE_GRAPH or family.device_postprocess() is None:
            return (f"family {family.name!r} has not passed the whole-pipeline parity check "
                    "(SUPPORTS_PIPELINE_GRAPH is False): its network forward is graphed, postprocessing runs eagerly")
        if not getattr(self.graphs.active_backend(), "real", True):
            return None  # an emulated backend replays by calling: any postprocessing is fine there
        why = family.device_postprocess().capture_safe(device)
        return None if why is None else f"{why}; the network forward is graphed, postprocessing runs eagerly"

    def executor(self, why_not: str | None) -> str:
        """The executor of a graphed call (family checked): ``pipeline`` where nothing stands against the
        whole pipeline (``why_not``: what :meth:`unavailable` said for the call's device), else ``graphed``."""
        self.require_support()
        return PIPELINE if why_not is None else GRAPHED

    def info_head(self, device: torch.device) -> dict[str, Any]:
        """The leading keys of ``graph_info()`` (docs/graphs.md): family, support and the pipeline's state."""
        why = self.unavailable(device)
        return {"family": self.family.name, "supported": bool(self.family.SUPPORTS_CUDA_GRAPH),
                "pipeline": {"supported": bool(self.family.SUPPORTS_PIPELINE_GRAPH), "active": why is None,
                             "reason": why}}

    # --- the programs --------------------------------------------------------------------------
    def program(self, network: Network, static: tuple[tuple[str, Any], ...],
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
    def frame_key(raw: torch.Tensor, bgr: bool, pre: Any, dtype: torch.dtype, static: tuple) -> tuple:
        """What one letterbox-inside graph is kept for: frame shape, device, colour order, preprocessing,
        dtype and the shape-fixing options."""
        return tuple(raw.shape), str(raw.device), bgr, repr(pre), str(dtype), static

    def sighting(self, key: tuple, at_least: int = 0) -> int:
        """How many batches of this frame key were seen, this one included (at least ``at_least``)."""
        with _SIGHT_LOCK:
            seen = self.calls.frame_sightings
            count = max(seen.pop(key, 0) + 1, at_least)
            seen[key] = count
            while len(seen) > _FRAME_SIGHTINGS:
                seen.popitem(last=False)
        return count

    # --- the calls -----------------------------------------------------------------------------
    def forward(self, batch: torch.Tensor, metas: list, mode: bool | str, opts: Any) -> dict[str, torch.Tensor]:
        """Padded outputs of the whole-pipeline graph for ``batch`` (no family check: the parity harness
        uses it). ``opts``: the call's :class:`~libreyolo.tasks.TaskOptions`."""
        runner, network = self.target(batch)
        post = self.family.device_postprocess()
        params = post.params(metas, opts, nc=self.nc(), device=batch.device)
        program = self.program(network, post.static(opts))
        with torch.inference_mode():
            return runner((batch, params), mode, program)

    def start(self, batch: torch.Tensor, metas: list, clock: Any, plan: CallPlan) -> Callable[[], list] | None:
        """One graph replay from the batch to padded outputs, read back by the returned call; None where
        the capture failed for this input (recorded in ``graph_info()["failures"]``: the forward graph
        then serves, with eager postprocessing)."""
        from libreyolo.graphs import GraphCaptureError

        try:
            padded = self.forward(batch, metas, plan.graph, plan.task_options)
        except GraphCaptureError as exc:
            LOGGER.warning("whole-pipeline CUDA graph unavailable for this input (%s); graphing the network "
                           "forward only", exc)
            return None
        clock.mark()
        return self.family.device_postprocess().read_later(padded)

    def start_frames(self, frames: tuple[torch.Tensor, bool], clock: Any,
                     plan: CallPlan) -> tuple[Callable[[], list], list] | None:
        """The letterbox too inside the whole-pipeline graph: one replay from the uploaded frames to
        padded detections, where the pipeline graph runs and the preprocessing can be captured
        (a :class:`~libreyolo.ops.letterbox.Letterbox`: every shape follows from the frame size),
        from the :data:`FRAMES_AFTER`-th batch of a frame size on (a graph per frame size pays only
        where sizes repeat: a video, a camera, a server), or at once after
        ``capture_graph(frame_size=...)``. Returns (read-back call, metas), or None: letterbox outside.
        The numbers equal the letterbox run outside the graph (``tests/test_letterbox_batched.py``, and
        on a GPU ``tests/test_stream_pipeline.py``)."""
        raw, bgr = frames
        pre, dtype, opts = plan.preprocessor, plan.dtype, plan.task_options
        if (not self.frames or plan.executor != PIPELINE or not FRAMES_IN_GRAPH
                or not callable(getattr(pre, "place_batch", None))):
            return None
        from libreyolo.graphs import GraphCaptureError

        post = self.family.device_postprocess()
        if self.sighting(self.frame_key(raw, bgr, pre, dtype, post.static(opts))) < FRAMES_AFTER:
            return None
        n, h, w = (int(v) for v in raw.shape[:3])
        metas = pre.metas_for(h, w, n)
        clock.mark()
        runner, network = self.target(raw.new_empty(0, dtype=dtype))
        params = post.params(metas, opts, nc=self.nc(), device=raw.device)
        program = self.program(network, post.static(opts), (pre, bgr, dtype))
        try:
            with torch.inference_mode():
                padded = runner((raw, params), plan.graph, program)
        except GraphCaptureError as exc:  # recorded in graph_info()["failures"]; letterbox outside the graph
            LOGGER.warning("CUDA graph with the letterbox inside unavailable for this input (%s); letterboxing "
                           "outside it", exc)
            return None
        clock.mark()
        return post.read_later(padded), metas
