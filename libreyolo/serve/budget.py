"""What the :class:`~libreyolo.serve.Batcher` admits: budgets for the whole process, not per request.

A request is admitted against four declared bounds (``BATCHER_OPTIONS``) before its image is
decoded, and holds its share until its result is handed out:

- ``max_queued``: requests admitted and not yet answered (queued or in a batch); one more is
  refused as busy (:class:`BatcherBusy`, HTTP 429);
- ``max_pixels``: decoded pixels those requests hold (3 bytes each as 8-bit RGB); an image whose
  pixels would pass it is refused as busy while others hold pixels, and as too large
  (:class:`RequestTooLarge`, HTTP 413) when it alone passes it. The size is read from the image's
  header (PIL opens lazily), so a refused image is never decoded;
- ``max_imgsz``: the largest ``imgsz`` a request may ask for (default: the Batcher's own);
- ``max_work``: the network input pixels one request may cost (``Family.request_work``: a
  detector's ``imgsz**2``, a restorer's padded image with every tile's context counted).
"""
from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any

import numpy as np

from libreyolo.errors import ArgumentError, LibreYOLOError


class BatcherBusy(LibreYOLOError, RuntimeError):
    """The Batcher holds as much as its budgets allow; try again shortly (HTTP 429)."""

    status = 429


class RequestTooLarge(ArgumentError):
    """One request costs more than the Batcher allows any request (HTTP 413)."""

    status = 413


def image_pixels(image: Any) -> tuple[int, int] | None:
    """(height, width) of one request's image without decoding it, or None when that cannot be
    told cheaply (the decoder then says what is wrong). Encoded bytes and files: from the header."""
    if isinstance(image, np.ndarray):
        return (int(image.shape[0]), int(image.shape[1])) if image.ndim >= 2 else None
    if hasattr(image, "shape") and hasattr(image, "dim"):  # a tensor: CHW or HWC, the two largest of the last 3
        shape = tuple(int(s) for s in image.shape[-3:])
        if len(shape) == 3:
            return (shape[1], shape[2]) if shape[0] <= 4 else (shape[0], shape[1])
        return tuple(shape[-2:]) if len(shape) == 2 else None  # type: ignore[return-value]
    from PIL import Image

    if isinstance(image, Image.Image):
        return image.height, image.width
    if isinstance(image, (bytes, bytearray, memoryview)):
        source: Any = io.BytesIO(image)
    elif isinstance(image, (str, Path)) and Path(image).is_file():
        source = image
    else:
        return None
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(source) as img:  # reads the header only
                return img.height, img.width
    except Exception:  # not an image, a bomb over PIL's own limit, ...: decoding reports it
        return None


def check_work(family: Any, hw: tuple[int, int], call: Any, max_work: int) -> None:
    """Raise :class:`RequestTooLarge` when one image would cost the network more than ``max_work`` pixels."""
    work = family.request_work(hw[0], hw[1], call["imgsz"], call)
    if work > max_work:
        raise RequestTooLarge(f"this request would feed the network {work:,} pixels ({hw[1]}x{hw[0]} image, "
                              f"imgsz={call['imgsz']}, its tiling options), over this server's limit of "
                              f"{max_work:,} (max_work); send a smaller image or larger tiles")


class Admission:
    """The budgets of one Batcher; :meth:`admit` reserves a request's share or raises, and the
    returned callable gives it back (once)."""

    def __init__(self, max_queued: int, max_pixels: int) -> None:
        self.max_queued, self.max_pixels = max_queued, max_pixels
        self._lock = threading.Lock()
        self.queued = 0
        self.pixels = 0
        self.refused = {"busy": 0, "too_large": 0}

    def check_room(self) -> None:
        """Raise :class:`BatcherBusy` when no request could be admitted now (nothing reserved)."""
        if self.queued >= self.max_queued:
            with self._lock:
                self.refused["busy"] += 1
            raise self._busy()

    def _busy(self) -> BatcherBusy:
        return BatcherBusy(f"busy: {self.queued} requests are queued or running, the limit is {self.max_queued} "
                           "(max_queued); try again shortly")

    def admit(self, hw: tuple[int, int] | None) -> Any:
        pixels = 0 if hw is None else hw[0] * hw[1]
        with self._lock:
            if pixels > self.max_pixels:
                self.refused["too_large"] += 1
                raise RequestTooLarge(
                    f"the image is {hw[1]}x{hw[0]} = {pixels:,} pixels, over this server's limit of "  # type: ignore[index]
                    f"{self.max_pixels:,} decoded pixels (max_pixels); send a smaller image")
            if self.queued >= self.max_queued:
                self.refused["busy"] += 1
                raise self._busy()
            if self.pixels + pixels > self.max_pixels:
                self.refused["busy"] += 1
                raise BatcherBusy(f"busy: the queued images hold {self.pixels:,} decoded pixels and this one has "
                                  f"{pixels:,}, over the limit of {self.max_pixels:,} (max_pixels); try again shortly")
            self.queued += 1
            self.pixels += pixels
        done = threading.Event()

        def release(*_: Any) -> None:
            if done.is_set():
                return
            done.set()
            with self._lock:
                self.queued -= 1
                self.pixels -= pixels

        return release

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"held_requests": self.queued, "held_pixels": self.pixels, "refused_busy": self.refused["busy"],
                    "refused_too_large": self.refused["too_large"], "max_queued": self.max_queued,
                    "max_pixels": self.max_pixels}
