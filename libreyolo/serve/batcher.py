"""Micro-batching: concurrent single-image requests coalesced into one ``predict()`` per batch.

Callers (threads, or asyncio tasks through :meth:`Batcher.apredict`) submit one image each. Each
image is decoded and its options checked in the caller, so a bad image or option fails only its
own request, before it can reach a batch. A worker thread takes the oldest request, waits at
most ``max_wait_ms`` (from that request's arrival) for up to ``max_batch`` requests, groups them
by their options (requests with different ``imgsz``/``conf``/... never share a forward) and runs
one ``model.predict([...])`` per group, padded to one of a few fixed batch sizes (powers of two up
to ``max_batch``) by repeating an image, so with ``cuda_graph=True`` a graph is captured once per
size and replayed afterwards. The padding's results are dropped. When a batch raises, its images
are run again one at a time, so only the culprit gets the exception.

``in_flight`` workers (default 1) do this at once: while one batch runs on the device, another is
uploaded, letterboxed and its results built on the host (``predict()`` is thread-safe, and a CUDA
graph's replay lock is held only while it is enqueued).

``overlap`` (default: on with ``cuda_graph`` on CUDA) overlaps batches inside each worker
instead: the worker starts a batch with :meth:`~libreyolo.engine.predictor.Predictor.enqueue`
(uploaded and queued on the device) and, while it runs, forms and enqueues the next one before
reading the first back and handing out its results. While a batch is on the device the worker
waits for requests only until that batch is done (a CUDA event it polls), so its callers never
wait for company of the next batch. Each caller still gets exactly what ``predict()`` gives (the
same calls, in another order).

A lone request waits for company only when the traffic says company is coming: when the batch
before it had more than one request, or another request is already queued. A single client
therefore never pays ``max_wait_ms``; under load the batches fill as before.

Padding is not free: 17 requests padded to a batch of 32 cost a forward of 32. The Batcher times
each padded size (the median wall time of its recent batches, from :meth:`warmup` on), and once
every size has been timed it takes from the queue the count that runs at the most images per
second: all of them, or a smaller padded size filled exactly, leaving the rest for the next batch
(another worker's, with ``in_flight`` > 1). Before that (no warm-up yet) it takes all of them.
A size it has not run for ``RETIME`` batches (:mod:`libreyolo.serve.policy`) is run once more
when the queue can fill it, so a timing taken in warm-up or in a busy moment does not decide for good.

Budgets (:mod:`libreyolo.serve.budget`): ``max_queued`` requests, ``max_pixels`` decoded pixels
held, ``max_imgsz`` and ``max_work`` per request; :meth:`submit` refuses a request beyond them at
once (:class:`~libreyolo.serve.budget.BatcherBusy` or
:class:`~libreyolo.serve.budget.RequestTooLarge`), from the image's header, before decoding.
A BaseException that is not an Exception in a batch fails that batch's requests
(:class:`BatchAborted`) and the worker goes on (docs/serving.md).
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from libreyolo.errors import ArgumentError, ImageError, LibreYOLOError
from libreyolo.serve.budget import Admission, RequestTooLarge, check_work, image_pixels
from libreyolo.serve.options import BATCHER_OPTIONS, NOT_PER_REQUEST
from libreyolo.serve.policy import SizePolicy
from libreyolo.serve.requests import Launched, Request, decode_request_image, default_batch_sizes
from libreyolo.utils.log import LOGGER as log

_KEEP = 10_000  # latencies and waits kept for the percentiles (the most recent)
_POLL_S = 3e-4  # overlap: how often a worker waiting for requests looks whether its batch on the device is done


class BatcherClosed(LibreYOLOError, RuntimeError):
    """A request came after :meth:`Batcher.close`."""


class BatchAborted(LibreYOLOError, RuntimeError):
    """A batch raised a BaseException that is not an Exception; its requests fail with this, the worker goes on."""

    status = 500


class Batcher:
    """Serve one model to many concurrent callers, batching their requests.

    ``Batcher(model, max_batch=8, max_wait_ms=2, **predict_kw)``; ``predict_kw`` are ``predict()``
    options applied to every request (``imgsz``, ``half``, ``cuda_graph``, ``device``, ``conf``, ...).
    ``batcher(image, **options)`` returns that image's :class:`~libreyolo.results.Results`;
    ``await batcher.apredict(image, **options)`` is the asyncio form, ``batcher.submit(...)``
    returns a :class:`concurrent.futures.Future`. ``options`` override ``predict_kw`` for one
    request; requests are batched only with requests of the same options. ``image`` is one
    image: a path, encoded bytes, a PIL image, a numpy array (BGR unless ``color_format="rgb"``)
    or a tensor. Use as a context manager, or call :meth:`close`, which finishes queued requests.
    ``max_queued``, ``max_pixels``, ``max_imgsz``, ``max_work``: the budgets (module docstring).
    """

    def __init__(self, model: Any, *, max_batch: int = 8, max_wait_ms: float = 2.0,
                 batch_sizes: Sequence[int] | None = None, in_flight: int = 1, overlap: bool | None = None,
                 max_queued: int = BATCHER_OPTIONS["max_queued"].default,
                 max_pixels: int = BATCHER_OPTIONS["max_pixels"].default, max_imgsz: int | None = None,
                 max_work: int | None = None, **predict_kw: Any) -> None:
        self.model = model
        self.max_batch = BATCHER_OPTIONS["max_batch"].check("max_batch", max_batch)
        self.max_wait_ms = BATCHER_OPTIONS["max_wait_ms"].check("max_wait_ms", max_wait_ms)
        self.batch_sizes = self._check_sizes(batch_sizes)
        self.in_flight = BATCHER_OPTIONS["in_flight"].check("in_flight", in_flight)
        overlap = BATCHER_OPTIONS["overlap"].check("overlap", overlap)
        from libreyolo.engine.options import PREDICT_OPTIONS
        from libreyolo.utils.checks import resolve_device

        device = predict_kw.pop("device", None)
        self._device = resolve_device(PREDICT_OPTIONS["device"].check("device", device))
        run_on = self._device or getattr(model, "device", None)
        on_cuda = run_on is not None and getattr(run_on, "type", None) == "cuda"
        can = callable(getattr(model, "enqueue", None))
        # by default where it was measured: CUDA graphs, whose replays queue without a host sync (an
        # eager postprocess that syncs would start the next batch while its caller's batch waits)
        graphed = bool(predict_kw.get("cuda_graph"))
        self.overlap = (on_cuda and can and graphed) if overlap is None else overlap
        if self.overlap and not can:
            raise ArgumentError(f"overlap=True starts batches with model.enqueue(), which this "
                                f"{type(model).__name__} does not have; pass overlap=False")
        self._cuda_device = run_on if on_cuda else None  # where an overlapping worker records its events
        if PREDICT_OPTIONS["cuda_graph"].check("cuda_graph", predict_kw.get("cuda_graph", False)) is True and \
                run_on is not None and not on_cuda:
            raise ArgumentError(f"cuda_graph=True needs the model on a CUDA device, and this Batcher runs it on "
                                f"{run_on}; pass device='cuda' (or a model on CUDA), cuda_graph='auto' or leave it out")
        self._color_format = PREDICT_OPTIONS["color_format"].check("color_format",
                                                                   predict_kw.pop("color_format", "bgr"))
        self.predict_kw = dict(predict_kw)
        self._defaults: tuple | None = None  # _request_options({}), checked on first use
        self.max_imgsz: int | None = None
        served = self._prepare_options(predict_kw)[1]["imgsz"]  # every default checked now, before any request
        max_imgsz = BATCHER_OPTIONS["max_imgsz"].check("max_imgsz", max_imgsz)
        if max_imgsz is not None and max_imgsz < served:
            raise ArgumentError(f"max_imgsz={max_imgsz} is below the served imgsz={served}, so no request could run; "
                                f"give max_imgsz>={served} or leave it out")
        self.max_imgsz = served if max_imgsz is None else max_imgsz
        max_work = BATCHER_OPTIONS["max_work"].check("max_work", max_work)
        self.max_work = self.max_imgsz ** 2 if max_work is None else max_work
        self.admission = Admission(BATCHER_OPTIONS["max_queued"].check("max_queued", max_queued),
                                   BATCHER_OPTIONS["max_pixels"].check("max_pixels", max_pixels))
        self._room_for_graphs()
        self._cond = threading.Condition()
        self._queue: collections.deque[Request] = collections.deque()
        self._closed = False
        self._counts = {"requests": 0, "failed": 0, "batches": 0, "images": 0, "padded": 0, "retried_batches": 0}
        self._latency: collections.deque[float] = collections.deque(maxlen=_KEEP)
        self._wait: collections.deque[float] = collections.deque(maxlen=_KEEP)
        self._by_size: collections.Counter[int] = collections.Counter()
        self.policy = SizePolicy(self.batch_sizes)  # the padded sizes' times and the count each batch takes
        self._last_group = 1  # size of the batch formed last: a lone request waits only after a shared one
        self._workers = [threading.Thread(target=self._run, name=f"libreyolo-batcher-{i}", daemon=True)
                         for i in range(self.in_flight)]
        for worker in self._workers:
            worker.start()

    def _room_for_graphs(self) -> None:
        """With CUDA graphs, let the model keep one graph per padded size (and a few more for other
        callers): evicting a size's graph would recapture it on every other batch."""
        options = getattr(self.model, "graph_options", None)
        if not self.predict_kw.get("cuda_graph") or not callable(options):
            return
        want = len(self.batch_sizes) + 4
        if options()["max_graphs"] < want:
            options(max_graphs=want)

    def _check_sizes(self, sizes: Sequence[int] | None) -> tuple[int, ...]:
        if sizes is None:
            return default_batch_sizes(self.max_batch)
        checked = sorted({BATCHER_OPTIONS["max_batch"].check("batch_sizes", s) for s in sizes})
        if not checked or checked[-1] != self.max_batch:
            raise ArgumentError(f"batch_sizes must include max_batch={self.max_batch} and only sizes from 1 to it, "
                                f"got {list(sizes)}; leave it unset for 1, 2, 4, ... {self.max_batch}")
        return tuple(checked)

    # --- requests ----------------------------------------------------------------------------
    def _prepare_options(self, options: Mapping[str, Any]) -> tuple[tuple, dict[str, Any]]:
        """(grouping key, predict() keywords) of one request's options: its call plan, resolved by the
        model's :meth:`~libreyolo.engine.predictor.Predictor.plan` as predict() resolves its own
        (for a batch of ``max_batch`` on the Batcher's device), is the key."""
        from libreyolo.engine.options import COMMON_PREDICT_OPTIONS

        refused = sorted(k for k in options if k in NOT_PER_REQUEST)
        if refused:
            raise ArgumentError(f"{', '.join(refused)} cannot be set on a batched request: the Batcher sets the "
                                "batch and its decoding, and runs on one device (give device= to Batcher()); "
                                "leave them out")
        merged = {**self.predict_kw, **options}
        merged.pop("color_format", None)  # decoding happens before batching: not part of the key
        decode = {k: COMMON_PREDICT_OPTIONS[k].check(k, merged.pop(k)) for k in ("decode",) if k in merged}
        if self.max_imgsz is not None and merged.get("imgsz") is not None:  # the budget first: 413, not 422
            imgsz = self.model.family.check_imgsz(COMMON_PREDICT_OPTIONS["imgsz"].check("imgsz", merged["imgsz"]))
            if imgsz > self.max_imgsz:
                raise RequestTooLarge(f"imgsz={imgsz} is over this server's max_imgsz={self.max_imgsz}; ask for "
                                      f"imgsz<={self.max_imgsz} or leave it out")
        plan = self.model.plan(device=self._device, batch=self.max_batch, **merged)  # wrong options raise here
        checked = {"half": plan.half, "cuda_graph": plan.graph, **plan.task_options}
        call = {**{k: checked.get(k, v) for k, v in merged.items()}, "imgsz": plan.imgsz, **decode}
        return (plan, *sorted(decode.items())), call

    def check_options(self, options: Mapping[str, Any]) -> None:
        """Raise :class:`ArgumentError` when one request's options are wrong, as :meth:`submit` would."""
        self._request_options(dict(options))

    def _request_options(self, options: dict[str, Any]) -> tuple[str, tuple, dict[str, Any]]:
        """(color format, grouping key, predict() keywords) of one request. A request without options
        (the usual one) gets the Batcher's defaults, checked once: a copy of the same answer."""
        if not options:
            if self._defaults is None:
                self._defaults = self._check_request_options({})
            color_format, key, call = self._defaults
            return color_format, key, dict(call)
        return self._check_request_options(options)

    def _check_request_options(self, options: dict[str, Any]) -> tuple[str, tuple, dict[str, Any]]:
        from libreyolo.engine.options import COMMON_PREDICT_OPTIONS

        color_format = COMMON_PREDICT_OPTIONS["color_format"].check(
            "color_format", options.pop("color_format", self._color_format))
        return (color_format, *self._prepare_options(options))

    def warmup(self, image: Any = None, **options: Any) -> None:
        """Run every padded batch size (``image``: a mid-grey frame by default), so that with
        ``cuda_graph=True`` each size's graphs are captured before the first request: as many times
        as frames of one size take to be letterboxed inside the graph (``FRAMES_AFTER``), then once
        more, timed (the sizes' first costs: see the module docstring). On a model with
        ``compile`` on, every size is compiled here, and Inductor's compile workers are ended after
        (:func:`libreyolo.engine.compiled.end_compile_workers`: they slow serving while they live)."""
        frame = np.full((480, 640, 3), 114, np.uint8) if image is None else image
        color_format, _, call = self._request_options(dict(options))
        pixels, _, order = decode_request_image(frame, color_format)
        call = {**call, "color_format": order}
        from libreyolo.engine.pipeline import FRAMES_AFTER

        rounds = max(1, FRAMES_AFTER)
        for i in range(rounds + 1):  # the last round, graphs captured, times every size
            for size in self.batch_sizes:
                start = time.perf_counter()
                self._predict([pixels] * size, call, size)
                if i == rounds:
                    self._timed(size, time.perf_counter() - start)
        compile_info = getattr(self.model, "compile_info", None)
        if callable(compile_info) and compile_info()["mode"] is not False:
            from libreyolo.engine.compiled import end_compile_workers

            end_compile_workers()

    def submit(self, image: Any, **options: Any) -> concurrent.futures.Future:
        """Queue one image; the Future's result is its Results (or the exception of that image alone).

        Bad options or an undecodable image raise here, in the caller, and never reach a batch.
        """
        if self._closed:
            raise BatcherClosed("this Batcher is closed; create a new one to serve more requests")
        color_format, key, call = self._request_options(dict(options))
        self.admission.check_room()
        hw = image_pixels(image)  # from the header: a refused image is never decoded
        release = None if hw is None else self._admit(hw, call)
        try:
            pixels, path, order = decode_request_image(image, color_format)
            if release is None:  # its size is known only now
                hwc = isinstance(pixels, np.ndarray)  # an HWC array, or a CHW tensor
                release = self._admit(tuple(pixels.shape[:2] if hwc else pixels.shape[-2:]), call)
            request = Request(pixels, path, (key, order), {**call, "color_format": order})
            with self._cond:
                if self._closed:
                    raise BatcherClosed("this Batcher is closed; create a new one to serve more requests")
                self._queue.append(request)
                self._counts["requests"] += 1
                self._cond.notify_all()
        except BaseException:
            if release is not None:
                release()
            raise
        request.future.add_done_callback(release)
        return request.future

    def _admit(self, hw: tuple[int, int], call: Mapping[str, Any]) -> Any:
        """Reserve one image's share of the budgets (module docstring of libreyolo.serve.budget)."""
        check_work(self.model.family, hw, call, self.max_work)
        return self.admission.admit(hw)

    def predict(self, image: Any, *, timeout: float | None = None, **options: Any) -> Any:
        """The Results of one image (blocks until its batch has run)."""
        return self.submit(image, **options).result(timeout)

    __call__ = predict

    async def apredict(self, image: Any, **options: Any) -> Any:
        """``await batcher.apredict(image)``: decoding runs in a thread, then the request waits for its batch."""
        future = await asyncio.to_thread(self.submit, image, **options)
        return await asyncio.wrap_future(future)

    # --- the worker ----------------------------------------------------------------------------
    def _next_group(self, pending: Launched | None = None) -> list[Request] | None:
        """The oldest request and up to max_batch - 1 more with its options; None once closed and drained.

        With a batch of this worker's ``pending`` on the device: [] as soon as that batch is done
        (a batch that is done is handed out first: its callers never wait for the next one to fill
        or to start; on the CPU, where enqueue() runs the batch at once, that is at once).
        """
        with self._cond:
            while True:
                while not self._queue or pending is not None:
                    if pending is not None and pending.ready():
                        return []
                    if self._queue:
                        break
                    if self._closed:
                        return None
                    self._cond.wait(None if pending is None else _POLL_S)
                deadline = self._queue[0].t_submit + self.max_wait_ms / 1e3
                if len(self._queue) == 1 and self._last_group == 1:
                    deadline = 0.0  # no sign of company coming: waiting would only add latency
                while 0 < len(self._queue) < self.max_batch and not self._closed:
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        break
                    if pending is not None:
                        if pending.ready():
                            return []
                        left = min(left, _POLL_S)
                    self._cond.wait(left)
                if self._queue:  # else another worker took them while this one waited: start over
                    break
            key = self._queue[0].key
            take = self.policy.take(sum(1 for r in self._queue if r.key == key), self.max_batch,
                                    self._counts["batches"])
            group, rest = [], collections.deque()
            while self._queue:
                r = self._queue.popleft()
                (group if r.key == key and len(group) < take else rest).append(r)
            self._queue = rest
            self._last_group = len(group)
        return [r for r in group if r.future.set_running_or_notify_cancel()]  # drop cancelled ones

    def _padded(self, n: int) -> int:
        return self.policy.padded(n)

    def _timed(self, size: int, seconds: float) -> None:
        with self._cond:
            self.policy.timed(size, seconds, self._counts["batches"])

    def _run(self) -> None:
        if self.overlap:
            return self._run_overlapped()
        while True:
            group = self._next_group()
            if group is None:
                return
            if not group:
                continue
            self._guarded(group, self._run_group, group)

    @staticmethod
    def _guarded(group: list[Request], fn: Any, *args: Any) -> Any:
        """``fn(*args)``; whatever it raises fails the group's open requests and the worker goes on.
        A BaseException that is not an Exception (KeyboardInterrupt, SystemExit, GeneratorExit, a
        library's own) reaches the callers as a :class:`BatchAborted` naming it: raised in a worker
        thread it can only come from the model's code (signals reach the main thread), and handed to
        an event loop as it is it would stop the server."""
        try:
            return fn(*args)
        except Exception as exc:  # a bug of ours must not strand the callers or stop the worker
            failure: BaseException = exc
        except BaseException as exc:  # noqa: BLE001 - the worker must survive it (see above)
            failure = BatchAborted(f"the batch was aborted by {type(exc).__name__}: {str(exc)[:200] or '(no message)'}"
                                   "; the Batcher goes on serving other requests")
            log.error("%s", failure)
        for r in group:
            if not r.future.done():
                r.future.set_exception(failure)
        return None

    def _run_overlapped(self) -> None:
        """The worker with ``overlap``: start a batch, then form and start the next one while it
        runs, then read the first back (:meth:`_next_group` returns early once it is done)."""
        pending: Launched | None = None
        while True:
            group = self._next_group(pending)
            if group is None and pending is None:
                return
            started = self._guarded(group, self._launch, group) if group else None
            if pending is not None:
                self._guarded(pending.group, self._finish, pending)
            pending = started

    def _launch(self, group: list[Request]) -> Launched:
        start = time.perf_counter()
        size = self._padded(len(group))
        images = [r.image for r in group] + [group[-1].image] * (size - len(group))
        call = {k: v for k, v in group[0].call.items() if k != "decode"}  # decoded already, in submit()
        try:
            finish = self.model.enqueue(images, batch=size, device=self._device, **call)
        except Exception:  # run again image by image when it is read back (_finish)
            finish = None
        event = None
        if finish is not None and self._cuda_device is not None:
            import torch

            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self._cuda_device))
        return Launched(group, size, start, finish, event, time.perf_counter() - start)

    def _finish(self, launched: Launched) -> None:
        group, size = launched.group, launched.size
        t0 = time.perf_counter()
        results = None
        if launched.finish is not None:
            try:
                results = launched.finish()
                if len(results) != size:
                    raise ImageError(f"enqueue() returned {len(results)} results for {size} images")
            except Exception:
                results = None
        if results is not None:  # the host time this worker spent on the batch (waiting for it included)
            self._timed(size, launched.host_s + time.perf_counter() - t0)
        self._deliver(group, launched.start, size, results)

    def _run_group(self, group: list[Request]) -> None:
        start = time.perf_counter()
        size = self._padded(len(group))
        images = [r.image for r in group] + [group[-1].image] * (size - len(group))
        try:
            results = self._predict(images, group[0].call, size)
            self._timed(size, time.perf_counter() - start)
        except Exception:
            results = None
        self._deliver(group, start, size, results)

    def _deliver(self, group: list[Request], start: float, size: int, results: list[Any] | None) -> None:
        """Hand each caller its result; ``results`` None: the batch raised, so its images run again
        one at a time and only the culprit's caller gets the exception."""
        if results is not None:
            outcomes: list[tuple[Any, BaseException | None]] = [(r, None) for r in results[:len(group)]]
        else:
            self._counts["retried_batches"] += 1
            outcomes = []
            for r in group:
                try:
                    outcomes.append((self._predict([r.image], r.call, 1)[0], None))
                except Exception as exc:
                    outcomes.append((None, exc))
        done = time.perf_counter()
        with self._cond:
            self._counts["batches"] += 1
            self._counts["images"] += len(group)
            self._counts["padded"] += size - len(group)
            self._by_size[size] += 1
            for r, (_, exc) in zip(group, outcomes, strict=True):
                self._wait.append(start - r.t_submit)
                self._latency.append(done - r.t_submit)
                self._counts["failed"] += exc is not None
        for r, (result, exc) in zip(group, outcomes, strict=True):
            if exc is not None:
                r.future.set_exception(exc)
            else:
                if r.path is not None:
                    result.path = r.path
                r.future.set_result(result)

    def _predict(self, images: list[Any], call: dict[str, Any], size: int) -> list[Any]:
        # workers=0: one batch per call, nothing to stream; the workers overlap batches instead
        out = self.model.predict(images, batch=size, device=self._device, workers=0, **call)
        if len(out) != len(images):  # predict() skips unreadable list items; ours were decoded already
            raise ImageError(f"predict() returned {len(out)} results for {len(images)} images")
        return out

    # --- state ----------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Requests, batches, mean batch (real images per forward), padding, queue wait and latency
        (mean, p50, p99 in ms over the last 10,000 requests), batches per padded size and the
        median time of a batch of each size (ms, its recent batches)."""
        with self._cond:
            c = dict(self._counts)
            lat, wait = np.array(self._latency) * 1e3, np.array(self._wait) * 1e3
            by_size = dict(sorted(self._by_size.items()))
            size_ms = {size: round(t * 1e3, 3) for size, t in sorted(self.policy.cost.items())}
            queued = len(self._queue)

        def pct(a: np.ndarray, q: float) -> float | None:
            return round(float(np.percentile(a, q)), 3) if a.size else None

        return {**c, "queued": queued, "budget": self.admission.stats(), "max_imgsz": self.max_imgsz,
                "max_work": self.max_work, "mean_batch": round(c["images"] / c["batches"], 3) if c["batches"] else None,
                "batches_by_size": by_size, "batch_ms_by_size": size_ms,
                "queue_wait_ms_mean": round(float(wait.mean()), 3) if wait.size else None,
                "queue_wait_ms_p50": pct(wait, 50), "latency_ms_p50": pct(lat, 50), "latency_ms_p99": pct(lat, 99),
                "max_batch": self.max_batch, "max_wait_ms": self.max_wait_ms, "batch_sizes": list(self.batch_sizes),
                "in_flight": self.in_flight, "overlap": self.overlap,
                "closed": self._closed}

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, timeout: float | None = None) -> None:
        """Refuse new requests, finish the queued ones, stop the worker (waits at most ``timeout`` s)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        end = None if timeout is None else time.perf_counter() + timeout
        for worker in self._workers:
            if threading.current_thread() is not worker:
                worker.join(None if end is None else max(0.0, end - time.perf_counter()))

    def __enter__(self) -> Batcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
