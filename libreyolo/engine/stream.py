"""The streaming pipeline of ``predict()`` over many images: decode, stage and upload ahead.

``predict()`` over a list, a folder or a generator runs batch by batch. With ``workers`` > 0
(the default on CUDA) three things overlap instead of taking turns:

- **decoding**: the images of the next batch are decoded on ``workers`` threads (Pillow releases
  the GIL while it decodes), in order (:meth:`libreyolo.data.sources.Sources.batches`);
- **upload**: a :class:`Feeder` thread packs each decoded batch's 8-bit pixels into one
  page-locked (pinned) staging buffer from a :class:`StagingPool` (allocated once, reused across
  batches and calls) and copies it to the device in one transfer on a side CUDA stream, recording
  an event; the compute stream waits for that event, not for the host;
- **read-back**: the predictor enqueues batch *i + 1* before it reads batch *i*'s results back
  (:meth:`libreyolo.models.base.Family.postprocess_later`: a non-blocking copy of the detection
  counts to pinned memory and one event wait), so the device is not idle while the host builds
  Results.

Memory: at most :data:`BATCHES_IN_FLIGHT` batches of decoded pixels exist at once (the one being
read back, the one running, the one being decoded and uploaded); the staging pool holds at most
:attr:`StagingPool.max_slots` buffers of at most ``max_bytes`` each. The pixels reach the device
byte for byte as the one-image path sends them and are reordered by the same
:meth:`~libreyolo.data.sources.SourceImage.orient`, so every number equals ``workers=0``.
On the CPU the default is ``workers=0``: the plain path, one batch decoded when it comes.
"""
from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from libreyolo.data.sources import SourceImage, Sources

BATCHES_IN_FLIGHT = 3  # read back + running + being decoded/uploaded: the host memory bound, in batches
DEFAULT_WORKERS = 4    # decode threads on CUDA when predict() is given no ``workers``
_ALIGN = 256           # bytes: each image's offset in a staging buffer (device views start aligned), except
                       # in a batch of same-size HWC frames, packed back to back as one (B, H, W, 3) array


def resolve_workers(workers: int | None, device: torch.device) -> int:
    """Decode threads for one call: as given, else :data:`DEFAULT_WORKERS` (at most the CPUs) on
    CUDA and 0 (the plain path) elsewhere."""
    if workers is not None:
        return workers
    return min(DEFAULT_WORKERS, os.cpu_count() or 1) if device.type == "cuda" else 0


def staging_wanted(device: torch.device) -> bool:
    """Whether batches for ``device`` go through pinned staging (a host-to-device copy exists)."""
    return device.type == "cuda"


_THREAD = threading.local()


def side_stream(device: torch.device) -> Any:
    """This thread's upload stream for ``device`` (made once per thread and device)."""
    streams = _THREAD.__dict__.setdefault("streams", {})
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in streams:
        streams[key] = torch.cuda.Stream(torch.device("cuda", key))
    return streams[key]


# --- pinned staging buffers ----------------------------------------------------------------------
@dataclass(eq=False)
class StagingSlot:
    """One host buffer; ``fence`` is the event of the last copy that reads it (None: nothing pending)."""

    buffer: torch.Tensor
    fence: Any = None
    pooled: bool = True

    @property
    def capacity(self) -> int:
        return self.buffer.numel()

    def wait(self) -> None:
        """Block until the last copy from this buffer has read it: only then may it be rewritten."""
        if self.fence is not None:
            self.fence.synchronize()
            self.fence = None


@dataclass
class StagingPool:
    """Page-locked host buffers for batch uploads, reused across batches and calls.

    :meth:`acquire` hands out a buffer of at least ``nbytes`` that no pending copy still reads
    (it waits on the buffer's fence first); :meth:`release` returns it with the event of the copy
    that reads it. At most ``max_slots`` buffers are kept; a buffer grows (to the next power of
    two) only when a batch does not fit, so a stream of same-size batches allocates once per
    slot. ``allocations`` counts every buffer ever allocated (the tests watch it).
    """

    pin: bool = True
    max_slots: int = 3
    max_bytes: int = 1 << 30  # a batch bigger than this is uploaded image by image instead
    allocations: int = 0
    _idle: list[StagingSlot] = field(default_factory=list)
    _slots: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def nbytes(self) -> int:
        """Bytes held by the idle buffers (all of them between calls)."""
        return sum(s.capacity for s in self._idle)

    def acquire(self, nbytes: int) -> StagingSlot | None:
        """A buffer for ``nbytes`` (waited for), or None when ``nbytes`` is over ``max_bytes``."""
        if nbytes > self.max_bytes:
            return None
        with self._lock:
            fits = [s for s in self._idle if s.capacity >= nbytes]
            ready = [s for s in fits if s.fence is None or s.fence.query()]
            if ready or (fits and self._slots >= self.max_slots):  # else a new buffer beats waiting
                slot = (ready or fits)[0]
                self._idle.remove(slot)
            elif self._slots < self.max_slots:
                slot = self._new(nbytes, pooled=True)
                self._slots += 1
            elif self._idle:  # every buffer is too small: replace the smallest idle one
                old = min(self._idle, key=lambda s: s.capacity)
                self._idle.remove(old)
                old.wait()  # its last copy must finish before its memory goes back to the allocator
                slot = self._new(nbytes, pooled=True)
            else:  # every buffer is out (concurrent calls): a one-off buffer, not kept
                slot = self._new(nbytes, pooled=False)
        slot.wait()
        return slot

    def release(self, slot: StagingSlot, fence: Any) -> None:
        """``slot`` is free for reuse once ``fence`` (the copy reading it; None: done) completes."""
        slot.fence = fence
        if slot.pooled:
            with self._lock:
                self._idle.append(slot)

    def _new(self, nbytes: int, *, pooled: bool) -> StagingSlot:
        self.allocations += 1
        capacity = 1 << max(20, (nbytes - 1).bit_length())  # at least 1 MiB, powers of two
        pin = self.pin and torch.cuda.is_available()
        return StagingSlot(torch.empty(capacity, dtype=torch.uint8, pin_memory=pin), pooled=pooled)


@dataclass
class StagedBatch:
    """A batch's images on the device, and what the compute stream must wait for.

    ``uploaded`` holds, per image, its CHW RGB tensor, or for a :attr:`uniform` batch (image, view of
    the staging upload in the image's own layout): such a view is reordered to CHW RGB
    (:meth:`SourceImage.orient`, a device copy for BGR) only when :attr:`tensors` is first read,
    and a uniform batch is letterboxed whole (``Letterbox.place_batch``, in a graph or not), so it
    launches no per-image reorder."""

    uploaded: list[Any]
    event: Any = None                       # the upload's completion (CUDA), None when already done
    owned: list[torch.Tensor] = field(default_factory=list)  # device memory allocated on the side stream
    # (frames, bgr): the whole batch as one (B, H, W, 3) view of the upload, when every image is an
    # 8-bit HWC frame of one size and channel order (what a whole-pipeline graph can letterbox itself)
    uniform: tuple[torch.Tensor, bool] | None = None
    _tensors: list[torch.Tensor] | None = None

    def wait(self, device: torch.device) -> None:
        """Make the upload safe to use on ``device``'s current stream: it waits for the upload, and
        the caching allocator is told that stream uses the side stream's memory (``record_stream``)."""
        if self.event is not None:
            current = torch.cuda.current_stream(device)
            current.wait_event(self.event)
            for t in self.owned:
                t.record_stream(current)
            self.event = None

    @property
    def tensors(self) -> list[torch.Tensor]:
        """The images as CHW RGB tensors (reordered on the stream current at the first read)."""
        if self._tensors is None:
            self._tensors = [u if isinstance(u, torch.Tensor) else u[0].orient(u[1]) for u in self.uploaded]
        return self._tensors

    def ready(self, device: torch.device) -> list[torch.Tensor]:
        """:meth:`wait`, then :attr:`tensors`."""
        self.wait(device)
        return self.tensors


PACK_PART_BYTES = 4 << 20  # the least pixel bytes one packing thread is given
PACK_THREADS = 4           # at most (and at most the CPUs)
_PACKERS: list[Any] = []   # the packing thread pool, made on first use
_PACK_LOCK = threading.Lock()
_CPUS = os.cpu_count() or 1


def _copy_into(host: Any, parts: list[tuple[torch.Tensor, int]]) -> None:
    for pixels, off in parts:
        n = pixels.numel()
        np.copyto(host[off:off + n], pixels.reshape(-1).numpy())


def pack(buffer: torch.Tensor, parts: list[tuple[torch.Tensor, int]]) -> None:
    """Copy 8-bit host images into a staging buffer at their offsets.

    numpy copies (one thread each, the GIL released), not ``Tensor.copy_``: torch copies a large
    tensor in a parallel region of all its intra-op threads, whose end waits, spinning, for the last
    thread; when the host is busy (serving threads, Inductor's compile workers, another process) that
    thread may be descheduled, and a 1 MB copy takes a scheduler slice (ms) instead of tens of us
    (``bench/staging_bench.py``). A batch of two :data:`PACK_PART_BYTES` or more is split by images into
    parts of at least that over up to :data:`PACK_THREADS` pool threads, which sleep, not spin, while they wait."""
    host = buffer.numpy()
    total = sum(p.numel() for p, _ in parts)
    ways = 1 if total < 2 * PACK_PART_BYTES else min(PACK_THREADS, _CPUS, len(parts), total // PACK_PART_BYTES)
    if ways <= 1:
        _copy_into(host, parts)
        return
    if not _PACKERS:
        with _PACK_LOCK:
            if not _PACKERS:
                from concurrent.futures import ThreadPoolExecutor

                _PACKERS.append(ThreadPoolExecutor(PACK_THREADS, thread_name_prefix="libreyolo-pack"))
    share = -(-len(parts) // ways)
    jobs = [_PACKERS[0].submit(_copy_into, host, parts[i:i + share]) for i in range(share, len(parts), share)]
    _copy_into(host, parts[:share])  # the caller copies the first share itself
    for job in jobs:
        job.result()


def stageable(img: SourceImage) -> bool:
    """Whether ``img`` can go through a staging buffer: 8-bit, contiguous, in host memory."""
    p = img.pixels
    return p.dtype == torch.uint8 and p.device.type == "cpu" and p.is_contiguous()


def stage(chunk: list[SourceImage], device: torch.device, pool: StagingPool,
          side: Any = None) -> StagedBatch:
    """``chunk``'s images on ``device``: the 8-bit ones packed into one staging buffer and copied
    in one transfer (on the ``side`` stream, when given), the others one by one as
    :meth:`SourceImage.to_device` sends them. The same bytes, reordered by the same code. Frames of
    one size and channel order lie back to back, so the batch is also one (B, H, W, 3) view
    (:attr:`StagedBatch.uniform`, what a whole-pipeline graph letterboxes itself) whatever the size."""
    offsets: list[int | None] = []
    total = 0
    first = chunk[0] if chunk else None
    frames = first is not None and all(  # same-size frames go back to back: one (B, H, W, 3) view, any size
        stageable(img) and img.hwc and img.bgr == first.bgr and img.pixels.shape == first.pixels.shape
        for img in chunk)
    for img in chunk:
        if stageable(img):
            offsets.append(total)
            n = img.pixels.numel()
            total += n if frames else -(-n // _ALIGN) * _ALIGN
        else:
            offsets.append(None)
    slot = pool.acquire(total) if total else None
    if slot is None:
        offsets = [None] * len(chunk)
    else:
        pack(slot.buffer, [(img.pixels, off) for img, off in zip(chunk, offsets, strict=True) if off is not None])
    use_side = side is not None and device.type == "cuda"
    with torch.cuda.stream(side) if use_side else _nothing():
        owned: list[torch.Tensor] = []
        tensors: list[Any] = [None] * len(chunk)
        if slot is not None:
            flat = torch.empty(total, dtype=torch.uint8, device=device)
            flat.copy_(slot.buffer[:total], non_blocking=True)
            owned.append(flat)
            for i, (img, off) in enumerate(zip(chunk, offsets, strict=True)):
                if off is not None:
                    tensors[i] = (img, flat[off:off + img.pixels.numel()].view(img.pixels.shape))
        here = torch.cuda.current_stream(device) if device.type == "cuda" else None
        for i, (img, off) in enumerate(zip(chunk, offsets, strict=True)):
            if off is None:
                if here is not None and img.pixels.device == here.device:
                    # already on the device, made on another stream (decode="cuda"): the allocator must
                    # not reuse its memory before this stream has read it (stacked, reordered) too
                    img.pixels.record_stream(here)
                t = img.to_device(device)
                owned.append(t)
                tensors[i] = t
        uniform = _uniform(chunk, owned[0]) if frames and slot is not None else _decoded_frames(chunk, device)
        if uniform is not None and slot is None:
            owned.append(uniform[0])
        if uniform is None:  # reordered here (on the side stream); a uniform batch is letterboxed whole
            tensors = [t if isinstance(t, torch.Tensor) else t[0].orient(t[1]) for t in tensors]
            owned += [t for t, (_, off) in zip(tensors, zip(chunk, offsets, strict=True), strict=True)
                      if off is not None]
        event = None
        if use_side:
            event = torch.cuda.Event()
            event.record(side)
    if slot is not None:
        pool.release(slot, event)
    return StagedBatch(tensors, event, owned if use_side else [], uniform)


def _uniform(frames: list[SourceImage], flat: torch.Tensor) -> Any:
    """(batch, bgr): same-size HWC ``frames``, packed back to back in ``flat``, as one (B, H, W, 3) view;
    None for other channel counts."""
    shape = tuple(frames[0].pixels.shape)
    if len(shape) != 3 or shape[2] != 3:
        return None
    return flat[:len(frames) * frames[0].pixels.numel()].view(len(frames), *shape), frames[0].bgr


def _decoded_frames(chunk: list[SourceImage], device: torch.device) -> Any:
    """(batch, bgr) for several same-size CHW RGB uint8 images already on ``device`` (JPEG files
    decoded there, ``predict(decode="cuda")``): stacked into one batch, seen as (B, H, W, 3), so the
    batch is letterboxed whole like uploaded frames; None otherwise."""
    if len(chunk) < 2:
        return None
    first = chunk[0].pixels
    if first.device.type != device.type or device.index not in (None, first.device.index):
        return None
    for img in chunk:
        p = img.pixels
        if img.hwc or img.bgr or p.device != first.device or p.dtype != torch.uint8 or p.shape != first.shape:
            return None
    if first.ndim != 3 or first.shape[0] != 3:
        return None
    return torch.stack([img.pixels for img in chunk]).permute(0, 2, 3, 1), False


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


# --- the feeder thread ---------------------------------------------------------------------------
@dataclass
class FedBatch:
    """One batch from the :class:`Feeder`: its images, their device copies (None: upload at use),
    and how many files had been skipped when it was complete (for the progress bar)."""

    chunk: list[SourceImage]
    staged: StagedBatch | None
    skipped: int


class Feeder:
    """Decodes (on ``workers`` threads) and stages batches on a background thread, handing them
    out in order; at most ``in_flight`` batches are out of its hands and not yet :meth:`done`.

    Iterate it for :class:`FedBatch` objects; an error of the source (an unreadable single
    image, an unsupported item of a generator) is raised by the iteration at its place in the
    order. :meth:`close` (also on leaving a ``with``) stops it early and joins the thread.
    """

    def __init__(self, sources: Sources, step: int, *, skip_unreadable: bool, workers: int,
                 device: torch.device, pool: StagingPool | None, in_flight: int = BATCHES_IN_FLIGHT) -> None:
        self.sources, self.step, self.skip, self.workers = sources, step, skip_unreadable, workers
        self.device, self.pool = device, pool
        self._room = threading.Semaphore(max(1, in_flight - 1))  # the consumer holds one more itself
        self._out: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._side = torch.cuda.Stream(device) if pool is not None and device.type == "cuda" else None
        self._thread = threading.Thread(target=self._run, name="libreyolo-feeder", daemon=True)
        self._started = False

    def __iter__(self) -> Iterator[FedBatch]:
        if not self._started:
            self._started = True
            self._thread.start()
        while True:
            kind, value = self._out.get()
            if kind == "batch":
                yield value
            elif kind == "error":
                raise value
            else:
                return

    def done(self) -> None:
        """The consumer is finished with one batch: the feeder may prepare another."""
        self._room.release()

    def close(self) -> None:
        self._stop.set()
        self._room.release()  # wake it if it waits for room
        if self._started:
            self._thread.join()

    def __enter__(self) -> Feeder:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _run(self) -> None:
        batches = self.sources.batches(self.step, skip_unreadable=self.skip, workers=self.workers)
        try:
            if self.device.type == "cuda" and self.device.index is not None:
                torch.cuda.set_device(self.device)  # this thread's allocations and streams go there
            while True:
                self._room.acquire()
                if self._stop.is_set():
                    return
                chunk = next(batches, None)
                if chunk is None:
                    break
                staged = None if self.pool is None else stage(chunk, self.device, self.pool, self._side)
                self._out.put(("batch", FedBatch(chunk, staged, len(self.sources.skipped))))
            self._out.put(("end", None))
        except BaseException as exc:  # handed to the consumer, raised there in order
            self._out.put(("error", exc))
        finally:
            batches.close()  # stops the decode threads (in this thread, which runs the generator)
