"""The batch loop of ``predict()``: decode ``plan.batch`` images, start them, read them back, hand the
Results out, forget them; one batch at a time (:func:`one_by_one`) or through the streaming pipeline
(:func:`pipelined`: decoding threads, and batch *i + 1* enqueued before batch *i* is read back).

The loop decides nothing about how a batch runs: ``start`` (a predictor's ``_start_chunk``) enqueues a
batch as the call plan says and returns the call that reads it back."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from libreyolo.data.sources import SourceImage, Sources
from libreyolo.engine.calls import progress_bar
from libreyolo.engine.plan import CallPlan
from libreyolo.engine.stream import Feeder, StagingPool, side_stream, stage, staging_wanted
from libreyolo.errors import ImageError
from libreyolo.results import Results
from libreyolo.utils.log import LOGGER

# (images, their Results, files skipped so far) per batch
Batch = tuple[list[SourceImage], list[Results], int]
# a predictor's _start_chunk(chunk, t0, plan, staged=...): the call that reads the batch back
StartChunk = Callable[..., Callable[[], list[Results]]]


def stream_results(sources: Sources, plan: CallPlan, start: StartChunk, staging: Callable[[], StagingPool], *,
                   progress: bool | None, verbose: bool, keep_pixels: bool, workers: int = 0) -> Iterator[Results]:
    """Results batch by batch: decode ``plan.batch`` images, run them, hand them out, forget them.

    Without ``keep_pixels`` a result read from a file keeps its path, not its pixels
    (:meth:`Results.orig_rgb` reads the file again), so a list of results stays small.
    ``workers`` > 0 runs the streaming pipeline (:func:`pipelined`), else one batch at a time.
    """
    total, step = sources.total, plan.batch
    long_run = total is None or total > step
    bar = progress_bar(total, show=long_run if progress is None else progress, auto=progress is None,
                        unit="frame" if sources.video is not None else "img")
    produced = seen_skips = 0
    batches = (pipelined(sources, plan, start, staging, workers) if workers > 0
               else one_by_one(sources, plan, start, staging))
    try:
        for chunk, results, skipped in batches:
            if not keep_pixels:
                for img, r in zip(chunk, results, strict=True):
                    if img.from_file:
                        r.release_image()
            produced += len(results)
            if bar is not None:
                bar.update(len(chunk) + skipped - seen_skips)
                seen_skips = skipped
            if verbose:
                for r in results:
                    LOGGER.info("%s: %s, %s", r.path or "image", r.verbose(),
                                ", ".join(f"{k} {v:.1f} ms" for k, v in r.speed.items()))
            del chunk
            yield from results
        if bar is not None and total is not None:
            bar.update(total - bar.n)  # files skipped after the last batch
    finally:
        batches.close()
        if bar is not None:
            bar.close()
    if sources.skipped:
        if not produced:
            seen = total if total is not None else len(sources.skipped)
            raise ImageError(f"none of the {seen} images could be read; first: {sources.skipped[0][1]}")
        LOGGER.warning("skipped %d of %d images that could not be read", len(sources.skipped),
                       total if total is not None else produced + len(sources.skipped))


def one_by_one(sources: Sources, plan: CallPlan, start: StartChunk,
               staging: Callable[[], StagingPool]) -> Iterator[Batch]:
    """(images, results, files skipped so far) per batch: decoded, run and read back in turn.

    On CUDA the 8-bit images of a batch are uploaded as the streaming pipeline does (one pinned
    staging buffer, one copy on a side stream: :func:`libreyolo.engine.stream.stage`), in this
    thread. A copy from pageable memory would first wait for all work queued on the device,
    so two threads predicting at once (a :class:`~libreyolo.serve.Batcher` with ``in_flight``
    2) could never overlap one's upload with the other's forward."""
    device = plan.device
    pool = staging() if staging_wanted(device) and not sources.on_device else None
    t0 = time.perf_counter()
    for chunk in sources.batches(plan.batch, skip_unreadable=not sources.single):
        staged = None if pool is None else stage(chunk, device, pool, side_stream(device))
        results = start(chunk, t0, plan, staged=staged)()
        yield chunk, results, len(sources.skipped)
        t0 = time.perf_counter()  # the caller's time between batches is not ours


def pipelined(sources: Sources, plan: CallPlan, start: StartChunk, staging: Callable[[], StagingPool],
              workers: int) -> Iterator[Batch]:
    """:func:`one_by_one`'s batches from the streaming pipeline (:mod:`libreyolo.engine.stream`):
    decoded on ``workers`` threads and staged by a :class:`~libreyolo.engine.stream.Feeder`, and
    batch *i + 1* enqueued before batch *i* is read back. An error of the source is raised after
    the batches before it are handed out, as on the plain path."""
    device = plan.device
    pool = staging() if staging_wanted(device) else None
    with Feeder(sources, plan.batch, skip_unreadable=True, workers=workers, device=device, pool=pool) as feeder:
        pending = None
        failure: Exception | None = None
        t0 = time.perf_counter()
        try:
            for fed in feeder:
                finish = start(fed.chunk, t0, plan, staged=fed.staged)
                if pending is not None:
                    yield pending[0].chunk, pending[1](), pending[0].skipped
                    feeder.done()
                pending = (fed, finish)
                t0 = time.perf_counter()
        except Exception as exc:  # hand out what was already enqueued first
            failure = exc
        if pending is not None:
            yield pending[0].chunk, pending[1](), pending[0].skipped
        if failure is not None:
            raise failure
