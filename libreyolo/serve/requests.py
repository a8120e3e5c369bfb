"""What the :class:`~libreyolo.serve.Batcher` queues and runs: a request (and its image decoded as
one predict() input), a batch started by an overlapping worker, the grouping key of a request's
options and the default padded sizes."""
from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from libreyolo.errors import ImageError


@dataclass
class Request:
    """One caller's image, decoded, with its checked options and the Future it waits on."""

    image: Any                      # an HWC uint8 array (its channel order in ``call``) or a CHW tensor
    path: str | None
    key: tuple                      # the options that change the computation, canonical and hashable
    call: dict[str, Any]            # those options, as predict() keywords
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    t_submit: float = field(default_factory=time.perf_counter)


@dataclass(eq=False)
class Launched:
    """A batch started by an overlapping worker: ``finish`` reads it back (None: starting it raised)."""

    group: list[Request]
    size: int
    start: float
    finish: Any
    event: Any = None       # a CUDA event recorded after the batch's work (None: done when started)
    host_s: float = 0.0     # host seconds spent starting it

    def ready(self) -> bool:
        return self.event is None or bool(self.event.query())


def default_batch_sizes(max_batch: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``max_batch`` (which is included even when not a power of two)."""
    sizes, n = [], 1
    while n < max_batch:
        sizes.append(n)
        n *= 2
    return (*sizes, max_batch)


def decode_request_image(image: Any, color_format: str) -> tuple[Any, str | None, str]:
    """The request's image decoded now, as one predict() input, its path and channel order: an
    HWC array in the order it came in (a BGR frame is not reordered on the host: predict()
    uploads it as it is and flips it on the device), or a CHW tensor (RGB). Requests of
    different orders are batched apart."""
    from libreyolo.data.sources import array_source, open_sources, read_image_bytes

    if isinstance(image, (bytes, bytearray, memoryview)):
        return read_image_bytes(image, "the uploaded image"), None, "rgb"
    if isinstance(image, np.ndarray) and image.ndim in (2, 3):  # a frame: checked and converted as predict() would
        img = array_source(image, color_format, "source")
        return img.pixels.numpy(), None, "bgr" if img.bgr else "rgb"
    if isinstance(image, (list, tuple)):
        raise ImageError(f"a request takes one image, got a {type(image).__name__} of {len(image)}; "
                         "submit each image as its own request")
    plan = open_sources(image, color_format=color_format)
    if not plan.single:
        raise ImageError(f"a request takes one image, got {len(plan)} (a directory or a batch); "
                         "submit each image as its own request")
    (img,), = plan.batches(1, skip_unreadable=False)
    if img.hwc:  # the array predict() would upload (contiguous, 3 channels), no copy
        return img.pixels.numpy(), img.path, "bgr" if img.bgr else "rgb"
    return img.pixels, img.path, "rgb"
