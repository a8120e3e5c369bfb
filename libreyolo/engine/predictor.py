"""The one predict pipeline: load -> letterbox -> forward -> postprocess -> Results.

Eager models, CUDA-graph replay and every artifact runtime subclass :class:`Predictor` and
provide only ``_forward`` (a batch tensor in, the family's named outputs out), so
preprocessing, decoding and NMS exist once. Here: the options checked into a call plan and one batch
started; the batch loop is :mod:`libreyolo.engine.batches`, what a call keeps and measures
:mod:`libreyolo.engine.calls`.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch

from libreyolo.data.sources import SourceImage, Sources, open_sources
from libreyolo.data.video import NETWORK_TIMEOUT_S
from libreyolo.engine.batches import stream_results
from libreyolo.engine.calls import CallState, StageClock
from libreyolo.engine.pipeline import PipelineExecutor
from libreyolo.engine.plan import EAGER, PIPELINE, CallPlan, freeze
from libreyolo.engine.stream import StagedBatch, StagingPool, resolve_workers, side_stream, stage, staging_wanted
from libreyolo.errors import ArgumentError
from libreyolo.models.base import Family
from libreyolo.results import Results, make_results
from libreyolo.utils.checks import check_forward_memory, resolve_device
from libreyolo.utils.checks import check_stride_imgsz as check_imgsz  # noqa: F401 - its old home
from libreyolo.utils.log import want_info


class Predictor:
    """Shared ``predict()``; subclasses implement ``_forward`` and expose ``device``."""

    family: Family
    size: str
    names: dict[int, str]
    imgsz: int
    default_batch: int = 16  # images decoded and run at once when predict() is given no ``batch``
    _calls: CallState  # plans, staging buffers (made by the subclass's __init__)
    _tracking: Any = None  # the tracks that track(persist=True) keeps (libreyolo.track.tracking.Tracking)
    _graphs: Any = None  # a predictor that replays graphs declares its GraphState (libreyolo.engine.graph_state)
    _pipeline: PipelineExecutor | None = None  # ... and its whole-pipeline graph (libreyolo.engine.pipeline)

    # --- to implement --------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        raise NotImplementedError

    def _preprocessor(self, imgsz: int) -> Any:
        """The family's preprocessing at ``imgsz`` (an artifact of static shape may need its fixed variant)."""
        return self.family.letterbox(imgsz)

    def input_dtype(self, half: bool) -> torch.dtype:
        """The dtype of the network's input in a call with ``half`` (what validation feeds it too)."""
        return torch.float16 if half else torch.float32

    def _forward(self, batch: torch.Tensor, *, cuda_graph: bool | str = False) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def network_outputs(self, batch: torch.Tensor) -> dict[str, torch.Tensor]:
        """The family's named outputs for a preprocessed ``batch`` (the network alone, no CUDA graph, no
        postprocessing): what export validation compares an artifact's outputs with, and the parity
        harness takes as the eager reference."""
        return self._forward(batch)

    def _prepare(self, device: torch.device | None, half: bool) -> None:
        """Check that the backend can run a call on ``device`` (None: its own) in ``half``."""

    def evaluation(self, device: Any, imgsz: int) -> AbstractContextManager[tuple[Any, torch.device]]:
        """``(forward, device)`` for :meth:`val` at ``imgsz``: a batch tensor in, named outputs out."""
        raise NotImplementedError(f"{type(self).__name__} cannot be validated")

    def _call_settings(self, device: torch.device | None, half: bool | None) -> tuple[torch.device, bool]:
        """(device, half) one call runs with. Never changes the model for later calls: an eager
        model runs the call on an inference copy for that device and precision."""
        half = bool(half)
        self._prepare(device, half)
        return self.device, half

    def _infer_start(self, batch: torch.Tensor, metas: list, clock: StageClock, plan: CallPlan) -> Callable[[], list]:
        """Network and postprocessing for one letterboxed batch, enqueued; the returned call reads
        the per-image predictions back (the one wait for the device), so that the next batch can
        be enqueued in between (:meth:`libreyolo.models.base.Family.postprocess_later`).

        Calls ``clock.mark()`` once the network's work is enqueued. With the plan's ``pipeline``
        executor, both stages are one CUDA graph replay (:meth:`PipelineExecutor.start`); where its
        capture fails for this input, the forward graph and eager postprocessing serve.
        """
        if plan.executor == PIPELINE and self._pipeline is not None:
            read = self._pipeline.start(batch, metas, clock, plan)
            if read is not None:
                return read
        opts = plan.task_options
        need = self.family.forward_bytes(self.size, tuple(batch.shape), opts)
        if need is not None:
            check_forward_memory(need, batch.device, tuple(batch.shape), "pass tile=256 (tiled inference, "
                                 "see docs/hostile-inputs.md) or a smaller image")
        outputs = self.family.run_network(lambda x: self._execute(x, plan), batch, opts)
        clock.mark()
        return self.family.postprocess_later(outputs, metas, opts)

    def _execute(self, batch: torch.Tensor, plan: CallPlan) -> dict[str, torch.Tensor]:
        """The network's named outputs for ``batch`` by the plan's executor (default: :meth:`_forward`)."""
        return self._forward(batch, cuda_graph=plan.graph)

    def _choose_executor(self, device: torch.device, graph: bool | str) -> str:
        """The executor (:data:`libreyolo.engine.plan.EXECUTORS`) of a call on ``device`` with
        ``cuda_graph=graph``; raises where this backend cannot run it. Decided once per plan."""
        return EAGER

    def _plan_state(self) -> tuple:
        """The model's own settings that change a plan (part of the plan cache's key)."""
        family = self.family
        backend = None if self._graphs is None else self._graphs.backend
        return (self.device, self.imgsz, len(self.names), self.default_batch, backend,
                getattr(family, "SUPPORTS_CUDA_GRAPH", None), getattr(family, "SUPPORTS_PIPELINE_GRAPH", None))

    def _infer_frames_start(self, frames: tuple[torch.Tensor, bool], clock: StageClock,
                            plan: CallPlan) -> tuple[Callable[[], list], list] | None:
        """Preprocessing, network and postprocessing of a batch of same-size uploaded frames
        (``frames``: (B, H, W, 3) uint8 and whether they are BGR) as one CUDA graph, or None when
        this model cannot (then :meth:`_infer_start` runs on the preprocessed batch).
        Returns (read-back call, metas). See :meth:`libreyolo.engine.pipeline.PipelineExecutor.start_frames`."""
        return None if self._pipeline is None else self._pipeline.start_frames(frames, clock, plan)

    def _infer(self, batch: torch.Tensor, metas: list, clock: StageClock, plan: CallPlan) -> list:
        """:meth:`_infer_start` read back at once: the per-image predictions of one batch."""
        return self._infer_start(batch, metas, clock, plan)()

    def val(self, **kwargs: Any) -> dict[str, float]:
        """Metrics on a dataset's val split, the task's (:mod:`libreyolo.tasks`): mAP50-95, mAP50,
        precision, recall (detect), top-1 and top-5 (classify), mIoU and pixel accuracy (semantic),
        PSNR and SSIM on Y and RGB (restore, on a folder of high-resolution images).
        The same code for the eager model and every artifact runtime, which
        supply only the forward: ``model.val(data="data.yaml", imgsz=640, batch=16, conf=0.001,
        iou=0.7)`` (options: :func:`libreyolo.train.val.val`).

        With ``tracker=`` (bytetrack, sort, ocsort, botsort), ``data`` is a folder of MOTChallenge
        sequences and the result is the tracking metrics (HOTA, IDF1, MOTA per sequence and combined:
        :func:`libreyolo.track.evaluate.val_tracking`; ``json=`` also writes them, the other options
        are :meth:`predict`'s)."""
        if kwargs.get("tracker") is not None:
            from libreyolo.track.evaluate import val_tracking

            json_path = kwargs.pop("json", None)
            return val_tracking(self, json_path=json_path, **kwargs)
        from libreyolo.train.val import val

        return val(self, **kwargs)

    # --- the pipeline ----------------------------------------------------------------------
    def __call__(self, source: Any = None, **kwargs: Any) -> Results | list[Results] | Iterator[Results]:
        return self.predict(source, **kwargs)

    @property
    def task(self) -> str:
        return self.family.task

    def task_spec(self) -> Any:
        """This model's :class:`~libreyolo.tasks.Task` (its options, results, tracking support)."""
        from libreyolo.tasks import get_task

        return get_task(self.family.task)

    def predict_options(self, **given: Any) -> Any:
        """The checked :class:`~libreyolo.tasks.TaskOptions` of this model's task for ``given``
        (every task option at its default where not given), checked against the model too."""
        task = self.task_spec()
        opts = task.predict_options(given)
        task.check_options(opts, nc=len(self.names))
        return opts

    def plan(self, *, imgsz: int | None = None, half: bool | None = None, device: str | torch.device | None = None,
             batch: int | None = None, cuda_graph: bool | str = False, **options: Any) -> CallPlan:
        """The :class:`~libreyolo.engine.plan.CallPlan` of a call with these options: checked where
        they are declared and the executor chosen, once; the same options (and model settings)
        give the cached plan. ``predict()``, ``enqueue()``, the Batcher's requests,
        ``capture_graph()`` and ``val`` resolve their options here. ``options``: the task's own."""
        key = (imgsz, type(imgsz), half, type(half), device, batch, type(batch), cuda_graph, type(cuda_graph),
               tuple((k, v, type(v)) for k, v in sorted(options.items())), self._plan_state())
        try:
            hash(key)
        except TypeError:  # an option given as a list or a mapping: the slower canonical form
            key = freeze(key)
        return self._calls.plans.get(key, lambda: self._resolve_plan(imgsz, half, device, batch, cuda_graph,
                                                                      options))

    def _resolve_plan(self, imgsz: Any, half: Any, device: Any, batch: Any, cuda_graph: Any,
                      options: dict[str, Any]) -> CallPlan:
        from libreyolo.engine.options import PREDICT_OPTIONS as P
        from libreyolo.options import check_input_budget

        imgsz, half, device, batch, graph = (P[name].check(name, value) for name, value in (
            ("imgsz", imgsz), ("half", half), ("device", device), ("batch", batch), ("cuda_graph", cuda_graph)))
        opts = self.predict_options(**options)
        imgsz = self.family.check_imgsz(self.imgsz if imgsz is None else imgsz)
        step = check_input_budget(batch or self.default_batch, imgsz, explicit=batch is not None)
        run_device, half = self._call_settings(resolve_device(device), half)
        executor = self._choose_executor(run_device, graph)
        return CallPlan(imgsz=imgsz, batch=step, device=run_device, half=half, dtype=self.input_dtype(half),
                        graph=graph, executor=executor, options_key=freeze(dict(opts)), task_options=opts,
                        preprocessor=self._preprocessor(imgsz))

    def plan_info(self) -> dict[str, Any]:
        """How many plans are cached, and the cache's hits and misses (tests and benchmarks read it)."""
        plans = self._calls.plans
        return {"plans": len(plans), "hits": plans.hits, "misses": plans.misses}

    def predict(
        self,
        source: Any = None,
        *,
        imgsz: int | None = None,
        half: bool | None = None,
        device: str | torch.device | None = None,
        batch: int | None = None,
        cuda_graph: bool | str = False,
        color_format: str = "bgr",
        verbose: bool = False,
        stream: bool = False,
        progress: bool | None = None,
        workers: int | None = None,
        decode: str = "cpu",
        vid_stride: int = 1,
        start_frame: int = 0,
        end_frame: int | None = None,
        reconnect: int = 0,
        stream_timeout: float = NETWORK_TIMEOUT_S,
        save: bool = False,
        save_dir: str = "runs/predict",
        save_json: bool = False,
        save_csv: bool = False,
        **options: Any,
    ) -> Results | list[Results] | Iterator[Results]:
        """Predict. One input gives one :class:`Results`; a list, directory or batch gives a list.

        ``source``: path, directory, list of paths, PIL image, numpy HWC array (BGR unless
        ``color_format="rgb"``), tensor (CHW/NCHW RGB, float in [0, 1] or uint8), or a list or a
        generator of those (e.g. a video's frames; consumed batch by batch, always a list/stream).

        ``options`` are the task's own (:mod:`libreyolo.tasks`): detect ``conf``, ``iou``,
        ``max_det``, ``classes``, ``max_nms``; semantic ``classes``; restore ``tile``, ``tile_pad``
        (tiled inference, :meth:`libreyolo.models.restore.RestoreFamily.run_network`); classify
        none. An option of another task is checked and ignored (one command line serves every
        model; restore refuses them); an unknown one is an error.

        Images are decoded and run ``batch`` at a time (default :attr:`default_batch`), so memory
        stays bounded whatever the number of inputs. ``stream=True`` returns a generator of
        :class:`Results` instead of a list. In a directory or list, a file that cannot be decoded
        is skipped with a logged warning (a single image raises :class:`ImageError`).
        ``progress``: a bar on stderr; ``None`` shows it for runs of more than one batch on a
        terminal. ``verbose=True`` logs one line per image (INFO, logger ``libreyolo``).

        ``workers``: threads that decode the next batch while this one runs (default: 4 on CUDA,
        where batches also go through pinned staging buffers and a side-stream upload, and 0 on the
        CPU: one batch decoded when it comes). The results are the same for every value
        (:mod:`libreyolo.engine.stream`).

        ``decode``: ``"cpu"`` (Pillow, on the ``workers`` threads) or ``"cuda"``: JPEG files are only
        read on the host and decoded on the (CUDA) device by nvJPEG, a batch in one call
        (``torchvision``, extra ``gpu-decode``); other files, and JPEGs nvJPEG cannot take, are
        decoded by Pillow. nvJPEG's pixels differ slightly from Pillow's (docs/predict.md). Its default
        ``workers`` is 0 (one thread reads, decodes and runs each batch: the fastest measured).

        A video (a file such as ``clip.mp4``, an ``rtsp://``/``http://`` stream, a webcam index) is
        decoded by PyAV on a thread of its own as its batches come (extra ``video``; docs/video.md):
        ``vid_stride`` keeps every n-th frame, ``start_frame``/``end_frame`` a range, and each Results
        has ``frame`` and ``timestamp``. Use ``stream=True`` for long videos (a list keeps every frame).
        A live stream that drops or stalls (no data for ``stream_timeout`` seconds) ends with an
        error, or is reopened up to ``reconnect`` times with a growing wait (frame indices go on).
        ``save=True`` writes the annotated video to ``save_dir/<name>.mp4`` (video sources only);
        ``save_json=True`` / ``save_csv=True`` every frame's predictions to ``save_dir/<name>.json``
        / ``.csv`` (:mod:`libreyolo.data.frame_log`).
        """
        return self._predict_source(source, options, dict(
            imgsz=imgsz, half=half, device=device, batch=batch, cuda_graph=cuda_graph, color_format=color_format,
            verbose=verbose, stream=stream, progress=progress, workers=workers, decode=decode, vid_stride=vid_stride,
            start_frame=start_frame, end_frame=end_frame, reconnect=reconnect, stream_timeout=stream_timeout, save=save,
            save_dir=save_dir, save_json=save_json, save_csv=save_csv))

    def track(self, source: Any = None, *, tracker: str = "bytetrack", persist: bool = False,
              **kwargs: Any) -> Results | list[Results] | Iterator[Results]:
        """:meth:`predict` with the boxes followed across frames (:mod:`libreyolo.track`, extra ``track``):
        each Results' ``boxes`` are the confirmed tracks' boxes, with ``boxes.id`` (from 1).

        ``tracker``: bytetrack, sort, ocsort or botsort (Roboflow ``trackers``). ``persist=True``
        keeps this source's tracks for the next call on it (one tracker per source: two videos
        never share identities); else each call starts fresh. ``kwargs``: :meth:`predict`'s.
        Detect models only; the others raise :class:`ArgumentError` saying so."""
        import inspect

        from libreyolo.track.options import TRACK_OPTIONS
        from libreyolo.track.tracking import Tracking, check_trackable, new_tracker, source_key, tracked

        name = TRACK_OPTIONS["tracker"].check("tracker", tracker)
        persist = TRACK_OPTIONS["persist"].check("persist", persist)
        check_trackable(self.task_spec())
        new_tracker(name, None)  # the package is there (else one line naming the extra), before any work
        call = {n: p.default for n, p in inspect.signature(Predictor.predict).parameters.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}
        call.update({k: kwargs.pop(k) for k in list(kwargs) if k in call})
        if self._tracking is None:
            self._tracking = Tracking()
        state = self._tracking
        key = source_key(source)

        def wrap(run: Iterator[Results], sources: Sources) -> Iterator[Results]:
            fps = sources.video.fps / call["vid_stride"] if sources.video is not None else None
            # the tracker may trail the predictions by one batch (they are in memory already)
            return tracked(run, state.tracker_for(name, key, fps, persist), ahead=call["batch"] or self.default_batch,
                           threaded=not sources.single)

        return self._predict_source(source, kwargs, call, wrap)

    def reset_tracks(self) -> None:
        """Forget the tracks that :meth:`track` kept with ``persist=True`` (every source's)."""
        if self._tracking is not None:
            self._tracking.reset()

    def _predict_source(self, source: Any, options: dict[str, Any], call: dict[str, Any],
             wrap: Callable[[Iterator[Results], Sources], Iterator[Results]] | None = None
             ) -> Results | list[Results] | Iterator[Results]:
        """:meth:`predict` (and :meth:`track`, which passes ``wrap``: a pass over the Results stream)."""
        plan, given = self._checked_call(options, call)
        verbose, stream, progress = (given[k] for k in ("verbose", "stream", "progress"))
        run_device = plan.device
        from libreyolo.data.video import is_video

        for key in ("save", "save_json", "save_csv"):
            if given[key] and not is_video(source):
                raise ArgumentError(f"{key}=True writes the {'annotated video' if key == 'save' else 'predictions'} "
                                    "of a video source; for images use Results.save() / Results.to_json() or "
                                    "`libreyolo predict json=true`")
        from libreyolo.engine.options import VIDEO_OPTIONS

        video = {k: given[k] for k in VIDEO_OPTIONS}
        sources = open_sources(source, color_format=given["color_format"], video=video)
        if given["decode"] == "cuda":
            sources.decode_on = _device_decoding(run_device)
        if verbose:
            want_info()
        # device tensors are used where they are, on the caller's stream: nothing for the pipeline to do
        workers = 0 if sources.single or sources.on_device else resolve_workers(given["workers"], run_device)
        if given["decode"] == "cuda" and given["workers"] is None:
            workers = 0  # measured fastest with nvJPEG on the H200 (1,863 images/s; 4 threads 1,688, 8 threads 1,406)
        run = stream_results(sources, plan, self._start_chunk, self._staging_pool, progress=progress, verbose=verbose,
                             keep_pixels=stream, workers=workers)
        if wrap is not None:
            run = wrap(run, sources)
        if given["save"]:
            from libreyolo.data.video_writer import save_video

            run = save_video(run, sources.video, given["save_dir"], vid_stride=given["vid_stride"])
        for fmt in ("json", "csv"):
            if given[f"save_{fmt}"]:
                from libreyolo.data.frame_log import save_frames

                run = save_frames(run, sources.video, given["save_dir"], fmt)
        if stream:
            return run
        results = list(run)
        return results[0] if sources.single else results

    _PLANNED = ("imgsz", "half", "device", "batch", "cuda_graph")  # the options a CallPlan holds

    def _checked_call(self, options: dict[str, Any], call: dict[str, Any]) -> tuple[CallPlan, dict[str, Any]]:
        """predict()'s and enqueue()'s options checked, where they are declared: (the call's plan,
        the other given options checked)."""
        from libreyolo.engine.options import PREDICT_OPTIONS

        plan = self.plan(**{k: call[k] for k in self._PLANNED}, **options)
        given = {name: PREDICT_OPTIONS[name].check(name, value) for name, value in call.items()
                 if name not in self._PLANNED}
        return plan, given

    def enqueue(self, source: Any, *, imgsz: int | None = None, half: bool | None = None,
                device: str | torch.device | None = None, batch: int | None = None, cuda_graph: bool | str = False,
                color_format: str = "bgr", **options: Any) -> Callable[[], list[Results]]:
        """Start one batch and return before it is done: the returned call waits for it and returns
        its list of :class:`Results` (call it once).

        ``source`` and the options are :meth:`predict`'s (checked the same way), for at most one
        batch of images (``batch``, default :attr:`default_batch`); an unreadable image raises here.
        On CUDA the batch is uploaded (pinned staging, a side stream) and its work queued on the
        device, so the caller can prepare and enqueue the next batch while this one runs, then read
        this one back: what :class:`~libreyolo.serve.Batcher` does with ``overlap=True``. Results
        equal :meth:`predict`'s. Elsewhere the work runs now and the call only builds the Results.
        """
        plan, given = self._checked_call(options, dict(imgsz=imgsz, half=half, device=device, batch=batch,
                                                       cuda_graph=cuda_graph, color_format=color_format))
        sources, step, run_device = open_sources(source, color_format=given["color_format"]), plan.batch, plan.device
        if sources.total is None or sources.total > step:
            count = "a generator" if sources.total is None else f"{sources.total} images"
            raise ArgumentError(f"enqueue() runs one batch of at most batch={step} images, got {count}; "
                                "use predict() for more, or a larger batch")
        chunk = next(iter(sources.batches(step, skip_unreadable=False)), [])
        if not chunk:
            return list
        t0 = time.perf_counter()
        pool = self._staging_pool() if staging_wanted(run_device) and not sources.on_device else None
        staged = None if pool is None else stage(chunk, run_device, pool, side_stream(run_device))
        return self._start_chunk(chunk, t0, plan, staged=staged)

    def _staging_pool(self) -> StagingPool:
        """This predictor's pinned staging buffers (made on first use, kept across calls)."""
        return self._calls.staging()

    def _predict_chunk(self, chunk: list[SourceImage], t0: float, plan: CallPlan, *,
                       staged: StagedBatch | None = None) -> list[Results]:
        """The Results of one batch of decoded images (see :meth:`_start_chunk`)."""
        return self._start_chunk(chunk, t0, plan, staged=staged)()

    def _start_chunk(self, chunk: list[SourceImage], t0: float, plan: CallPlan, *,
                     staged: StagedBatch | None = None) -> Callable[[], list[Results]]:
        """Enqueue one batch (upload unless ``staged`` already did, letterbox, network,
        postprocessing) as ``plan`` says; the returned call reads it back and makes its Results."""
        device = plan.device
        clock = StageClock(device, t0)
        if staged is not None:
            staged.wait(device)
        pre, dtype = plan.preprocessor, plan.dtype
        started = None
        if staged is not None and staged.uniform is not None and plan.graphed:
            started = self._infer_frames_start(staged.uniform, clock, plan)
        if started is None:
            if staged is not None and staged.uniform is not None and callable(getattr(pre, "place_batch", None)):
                frames, bgr = staged.uniform  # one batched letterbox, the per-image path's numbers
                batch, metas = pre.place_batch(frames, bgr, dtype), pre.metas_for(*frames.shape[1:3], len(chunk))
            else:
                tensors = staged.tensors if staged is not None else [img.to_device(device) for img in chunk]
                batch, metas = pre(tensors, dtype=dtype)
            clock.mark()  # preprocessing enqueued
            read = self._infer_start(batch, metas, clock, plan)
        else:
            read, metas = started
        clock.mark()  # postprocessing enqueued
        task = self.family.task  # the Results payload comes from the task (libreyolo.tasks)

        def finish() -> list[Results]:
            t_read = time.perf_counter()
            preds = read()
            speed = clock.speed(len(chunk), read_s=time.perf_counter() - t_read)
            return [make_results(task, pred, names=self.names, orig_shape=meta.orig_shape, path=img.path,
                                 orig_img=img.original if img.original is not None else img.pixels,
                                 speed=dict(speed), frame=img.frame, timestamp=img.timestamp)
                    for img, meta, pred in zip(chunk, metas, preds, strict=True)]

        return finish


def _device_decoding(device: torch.device) -> torch.device:
    """The device ``decode="cuda"`` decodes on (``device`` itself), checked: a CUDA device and a
    usable torchvision."""
    from libreyolo.data.device_decode import device_decoder

    if device.type != "cuda":
        raise ArgumentError(f'decode="cuda" decodes JPEG files on a CUDA device, but this predict runs on '
                            f'{device}; pass device="cuda" or decode="cpu"')
    device_decoder()  # raises, naming the extra, when torchvision is missing or unusable
    return device
