"""Turn whatever the user passes to ``predict()`` into images, lazily.

Accepted: a path (file or directory), a list of paths, a PIL image, a numpy array (HWC uint8,
BGR like OpenCV unless ``color_format="rgb"``; HW grayscale; 16-bit; float in [0, 1]), a torch
tensor (CHW or NCHW, float in [0, 1] or uint8, RGB), or a list of any of these (one batch).
Grayscale, RGBA, palette and 16-bit images are converted to 8-bit RGB, never refused.

:func:`open_sources` checks everything it can without decoding (types, shapes, that paths exist
and are regular files, that a string is not a URL) and returns a :class:`Sources` plan; images
are decoded only when their batch comes (:meth:`Sources.batches`), so a folder of thousands of
files costs one batch of pixels at a time. Files are opened without blocking and checked to be
regular files after opening, so a FIFO or a device is refused instead of hanging. EXIF
orientation is applied to files and PIL images: boxes refer to the upright image.
"""
from __future__ import annotations

import io
import logging
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from libreyolo.data.images import (  # image files and their decoding (device_decode reads them too)
    IMAGE_SUFFIXES,
    SourceImage,
    _as_tensor,
    _check_file,
    _pil_to_rgb_array,
    _stat,
    check_float_range,
    check_pixels,
    read_image_bytes,  # noqa: F401
    read_image_file,
)
from libreyolo.errors import ImageError

LOGGER = logging.getLogger("libreyolo")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")


# --- in-memory inputs ----------------------------------------------------------------------------
def _check_array(arr: np.ndarray, where: str) -> None:
    shape = arr.shape
    if arr.ndim not in (2, 3):
        raise ImageError(f"{where}: expected an HWC image array, got shape {shape}")
    h, w = shape[:2]
    c = shape[2] if arr.ndim == 3 else 1
    if h == 0 or w == 0:
        raise ImageError(f"{where}: the image has zero size ({w}x{h})")
    if c not in (1, 3, 4):
        raise ImageError(f"{where}: expected 1, 3 or 4 channels (HWC), got shape {shape}")
    if arr.dtype not in (np.uint8, np.uint16) and arr.dtype.kind != "f":
        raise ImageError(f"{where}: unsupported array dtype {arr.dtype}; use uint8, uint16 or float in [0, 1]")
    check_pixels(w, h, where, "take")
    if arr.dtype.kind == "f":
        check_float_range(float(arr.min()), float(arr.max()), where, arr)


def _array_to_rgb(arr: np.ndarray, color_format: str, where: str) -> tuple[np.ndarray, bool]:
    """(HWC 3-channel uint8 array, whether it is BGR); no copy for ordinary uint8 input."""
    _check_array(arr, where)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    c = arr.shape[2]
    if arr.dtype == np.uint16:
        arr = (arr.astype(np.float32) / 257.0 + 0.5).astype(np.uint8)
    elif arr.dtype.kind == "f":
        arr = (arr * 255.0 + 0.5).astype(np.uint8)  # in [0, 1]: _check_array refused anything else
    if c == 1:
        return np.repeat(arr, 3, axis=2), False
    if c == 4:
        arr = np.ascontiguousarray(arr[:, :, :3])
    return arr, color_format == "bgr"


def _tensor_images(t: torch.Tensor, where: str) -> list[torch.Tensor]:
    """The images of a CHW/NCHW tensor as views, after checking shape, dtype, size and (float) the
    range of its values: one reduction over the whole tensor, on its device (no conversion)."""
    if t.is_meta:
        raise ImageError(f"{where}: a meta tensor has a shape but no pixels (made on device='meta'); pass a tensor "
                         "holding the image, e.g. torch.from_numpy(array) or one made on 'cpu' or 'cuda'")
    if t.ndim == 3:
        t = t.unsqueeze(0)
    if t.ndim != 4 or t.shape[1] not in (1, 3):
        raise ImageError(f"{where}: expected a CHW or NCHW tensor with 1 or 3 channels, got shape {tuple(t.shape)}")
    if t.shape[-1] == 0 or t.shape[-2] == 0:
        raise ImageError(f"{where}: the image has zero size {tuple(t.shape)}")
    if not t.is_floating_point() and t.dtype != torch.uint8:
        raise ImageError(f"{where}: tensor dtype {t.dtype} unsupported; use uint8 or float in [0, 1]")
    check_pixels(t.shape[-1], t.shape[-2], where, "take")
    if t.is_floating_point():
        lo, hi = torch.aminmax(t.detach())
        check_float_range(float(lo), float(hi), where, t.detach())
    return list(t.unbind(0))


def _tensor_source(t: torch.Tensor) -> SourceImage:  # float values were checked in [0, 1] by _tensor_images
    if t.shape[0] == 1:
        t = t.expand(3, -1, -1)
    return SourceImage(t, None, None, hwc=False)


def array_source(item: np.ndarray, color_format: str, where: str) -> SourceImage:
    arr, bgr = _array_to_rgb(item, color_format, where)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return SourceImage(_as_tensor(arr), None, arr[:, :, ::-1] if bgr else arr, bgr=bgr)


def _pil_source(item: Any, where: str) -> SourceImage:
    arr = _pil_to_rgb_array(item, where)
    return SourceImage(_as_tensor(arr), getattr(item, "filename", None) or None, arr)


def _file_source(path: Path) -> SourceImage:
    arr = read_image_file(path)
    return SourceImage(_as_tensor(arr), str(path), arr, from_file=True)


# --- paths ---------------------------------------------------------------------------------------
def _expand_path(item: str | Path) -> tuple[list[Path], bool]:
    """(files, whether ``item`` was a directory). Files are checked when they are decoded."""
    text = os.fspath(item)
    if _URL.match(text) and not os.path.exists(text):
        raise ImageError(f"{text!r} looks like a URL: predict() does not fetch URLs; download the file first "
                         "(e.g. curl -LO <url>) and pass its local path")
    p = Path(text)
    st = _stat(p)
    if not stat.S_ISDIR(st.st_mode):
        _check_file(p, st)
        return [p], False
    try:
        with os.scandir(p) as entries:
            # a folder named like an image (sub.jpg/) is not one of the folder's images
            files = sorted(Path(e.path) for e in entries
                           if Path(e.name).suffix.lower() in IMAGE_SUFFIXES and not _is_dir(e))
    except PermissionError:
        raise ImageError(f"cannot list directory {p}: permission denied") from None
    except OSError as exc:
        raise ImageError(f"cannot list directory {p}: {exc.strerror or exc}") from None
    if not files:
        raise ImageError(f"no images found in directory {p} (looked for {sorted(IMAGE_SUFFIXES)})")
    return files, True


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:  # a symlink loop or a vanished entry: let the decoder report it
        return False


# --- the plan ------------------------------------------------------------------------------------
@dataclass
class _Pending:
    """One image to be loaded when its batch comes."""

    load: Callable[[], SourceImage]
    path: Path | None = None  # set for files: the only inputs that can be unreadable at load time


def _load(item: _Pending, decode_on: torch.device | None = None) -> SourceImage | Any | ImageError:
    """The decoded image (a JPEG file only read, with ``decode_on``), or the :class:`ImageError` that
    says why not (raised where it is used)."""
    try:
        if decode_on is not None and item.path is not None:
            from libreyolo.data.device_decode import read_for_device

            return read_for_device(item.path)
        return item.load()
    except ImageError as exc:
        return exc


@dataclass
class Sources:
    """What ``predict()`` runs over: checked, not yet decoded.

    ``single``: the user passed one image (not a list, directory, generator or batched tensor),
    so ``predict()`` returns one ``Results``. ``skipped``: (path, reason) of files that could not
    be decoded and were skipped by :meth:`batches`. ``pending`` is a list, or for a generator
    source an iterator planned as it is consumed (``total`` is then None).
    """

    pending: list[_Pending] | Iterator[_Pending]
    single: bool
    skipped: list[tuple[str, str]] = field(default_factory=list)
    on_device: bool = False  # some image is a tensor already on a device (nothing to decode or upload)
    decode_on: torch.device | None = None  # JPEG files decoded on this device (libreyolo.data.device_decode)
    video: Any = None  # a video source's VideoInfo (libreyolo.data.video): frames come from its decode thread
    frames: int | None = None  # a video file's frame count to come, when its container declares one

    @property
    def total(self) -> int | None:
        """How many images there are, or None for a generator source (not known in advance; a video
        file's declared frame count, after vid_stride and the range)."""
        return len(self.pending) if isinstance(self.pending, list) else self.frames

    def __len__(self) -> int:
        if self.total is None:
            raise TypeError("a generator source has no length until it is consumed")
        return self.total

    @property
    def files(self) -> int:
        return sum(p.path is not None for p in self.pending) if isinstance(self.pending, list) else 0

    def batches(self, size: int, *, skip_unreadable: bool, workers: int = 0) -> Iterator[list[SourceImage]]:
        """Lists of at most ``size`` decoded images, in order. With ``skip_unreadable`` a file that
        cannot be decoded is logged, recorded in :attr:`skipped` and left out; else it raises.

        ``workers`` > 0 decodes on that many threads (Pillow releases the GIL while decoding), at
        most the rest of the current batch at a time: never more images than one batch in memory
        on account of decoding ahead, and the same images in the same order as ``workers=0``.
        """
        chunk: list[Any] = []  # SourceImage, or EncodedJPEG with decode_on
        try:
            for item, loaded in self._decoded(workers, lambda: size - len(chunk)):
                if isinstance(loaded, ImageError):
                    self._skip(loaded, item.path, skip_unreadable)
                    continue
                chunk.append(loaded)
                if len(chunk) == size:
                    full = chunk[:]  # ``chunk`` itself stays the one list room() measures
                    chunk.clear()
                    yield self._finished(full, skip_unreadable)
        except ImageError:  # a video that fails mid-way: its frames before the failure are predicted first
            # (a list or generator of images keeps its rule: the batch holding the bad item is not run)
            if chunk and self.video is not None:
                yield self._finished(chunk, skip_unreadable)
            raise
        if chunk:
            yield self._finished(chunk, skip_unreadable)

    def _skip(self, error: ImageError, path: Any, skip_unreadable: bool) -> None:
        if not skip_unreadable or path is None:
            raise error
        self.skipped.append((str(path), str(error)))
        LOGGER.warning("skipping %s", error)

    def _finished(self, chunk: list[Any], skip_unreadable: bool) -> list[SourceImage]:
        """The batch with its JPEG files decoded on the device (one call), in order; any file that
        turns out unreadable there is skipped (or raises) as on the host."""
        if self.decode_on is None:
            return chunk  # type: ignore[return-value]
        from libreyolo.data.device_decode import EncodedJPEG, decode_on_device

        encoded = [img for img in chunk if isinstance(img, EncodedJPEG)]
        if not encoded:
            return chunk  # type: ignore[return-value]
        done = iter(zip(encoded, decode_on_device(encoded, self.decode_on), strict=True))
        out: list[SourceImage] = []
        for img in chunk:
            if isinstance(img, EncodedJPEG):
                file, img = next(done)
                if isinstance(img, ImageError):
                    self._skip(img, file.path, skip_unreadable)
                    continue
            out.append(img)
        return out

    def _decoded(self, workers: int, room: Callable[[], int]) -> Iterator[tuple[_Pending, SourceImage | ImageError]]:
        """(item, image or error) in order; decoded here, or on ``workers`` threads with no more
        in flight than ``room()``, the images the current batch still lacks."""
        items = iter(self.pending)
        if workers <= 0:
            for item in items:
                yield item, _load(item, self.decode_on)
            return
        from collections import deque
        from concurrent.futures import ThreadPoolExecutor

        inflight: deque = deque()
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="libreyolo-decode")
        try:
            while True:
                while len(inflight) < room():
                    item = next(items, None)
                    if item is None:
                        break
                    inflight.append((item, pool.submit(_load, item, self.decode_on)))
                if not inflight:
                    return
                item, future = inflight.popleft()
                yield item, future.result()
        finally:  # the caller stopped early (or failed): decode nothing more
            pool.shutdown(wait=True, cancel_futures=True)


def _plan(item: Any, where: str, color_format: str) -> tuple[list[_Pending], bool]:
    """The images of one source item, planned (checked, not decoded), and whether it was a directory."""
    if isinstance(item, (str, Path)):
        files, was_dir = _expand_path(item)
        return [_Pending(lambda p=p: _file_source(p), p) for p in files], was_dir
    if isinstance(item, np.ndarray):
        _check_array(item, where)
        return [_Pending(lambda a=item, w=where: array_source(a, color_format, w))], False
    if isinstance(item, torch.Tensor):
        return [_Pending(lambda t=t: _tensor_source(t)) for t in _tensor_images(item, where)], False
    if hasattr(item, "mode") and hasattr(item, "convert"):  # PIL image, imported lazily
        if item.width == 0 or item.height == 0:
            raise ImageError(f"{where}: the image has zero size ({item.width}x{item.height})")
        return [_Pending(lambda i=item, w=where: _pil_source(i, w))], False
    raise ImageError(
        f"{where}: unsupported input type {type(item).__name__}; pass a path, directory, "
        "numpy array, PIL image, torch tensor, or a list or generator of those"
    )


def _planned(items: Iterator[Any], color_format: str) -> Iterator[_Pending]:
    """A generator source's images, planned one item at a time as it is consumed."""
    n = -1
    for n, item in enumerate(items):
        yield from _plan(item, f"source[{n}]", color_format)[0]
    if n < 0:
        raise ImageError("the source generator yielded no images")


def open_sources(source: Any, color_format: str = "bgr", video: dict[str, Any] | None = None) -> Sources:
    """Check ``source`` and plan its images without decoding them (see the module docstring).

    A generator (any iterator, e.g. a video's frames) is not consumed here: each item is checked
    when its batch is assembled, so an unsupported item raises there, after the batches before it.
    A video (file, stream URL or webcam index: :mod:`libreyolo.data.video`) is opened here, and its
    frames decoded on its own thread as their batches come; ``video``: its options (``vid_stride``,
    ``start_frame``, ``end_frame``, checked by the caller).
    """
    if color_format not in ("bgr", "rgb"):
        raise ImageError(f"color_format must be 'bgr' or 'rgb', got {color_format!r}")
    if source is None:
        raise ImageError("no source given: pass an image path, directory, array, PIL image or tensor")
    from libreyolo.data.video import VideoSource, is_video

    if is_video(source):
        opened = VideoSource(source, **(video or {}))
        planned = (_Pending(lambda img=img: img) for img in opened.frames())
        return Sources(planned, single=False, video=opened.info, frames=opened.expected)
    if isinstance(source, Iterator) and not isinstance(source, io.IOBase):
        return Sources(_planned(source, color_format), single=False)
    is_list = isinstance(source, (list, tuple))
    items = list(source) if is_list else [source]
    if not items:
        raise ImageError("the source list is empty")
    if is_list and any(is_video(i) for i in items):
        raise ImageError("a video can only be the whole source: predict one video per call (stream=True), "
                         "not a list with videos in it")
    pending: list[_Pending] = []
    multi = is_list
    for n, item in enumerate(items):
        planned, was_dir = _plan(item, f"source[{n}]" if len(items) > 1 else "source", color_format)
        pending.extend(planned)
        multi = multi or was_dir
    on_device = any(isinstance(i, torch.Tensor) and i.device.type != "cpu" for i in items)
    return Sources(pending, single=not multi and len(pending) == 1, on_device=on_device)


def load_sources(source: Any, color_format: str = "bgr") -> list[SourceImage]:
    """Every image of ``source`` decoded now (raises on the first unreadable file)."""
    plan = open_sources(source, color_format)
    return [img for chunk in plan.batches(1 << 30, skip_unreadable=False) for img in chunk]
