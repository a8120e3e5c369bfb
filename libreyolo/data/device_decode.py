"""JPEG files decoded on the device: ``predict(decode="cuda")``.

A JPEG file is only read on the host (its header checked as any image's: format, pixel limit, EXIF
orientation; :func:`read_for_device`), and the JPEGs of a batch are decoded on the CUDA device by
nvJPEG in one call (``torchvision.io.decode_jpeg``, extra ``gpu-decode``; :func:`decode_on_device`),
then turned upright as Pillow turns them. Other files, CMYK JPEGs, and streams nvJPEG refuses are
decoded by Pillow exactly as :mod:`libreyolo.data.sources` decodes them. :class:`~libreyolo.data.sources.Sources`
calls these when its ``decode_on`` is set.
"""
from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from libreyolo.data.images import (
    _EXIF_ORIENTATION,
    SourceImage,
    _as_tensor,
    _decode,
    _open_file,
    check_pixels,
    read_image_bytes,
)
from libreyolo.errors import ImageError


@dataclass
class EncodedJPEG:
    """A JPEG file read, not decoded, on a worker thread (its header checked like any image's): it is
    decoded on the device with the rest of its batch (:func:`decode_on_device`)."""

    data: bytes
    path: str
    orientation: int = 1  # EXIF orientation (1: upright), applied after decoding as Pillow applies it


def read_for_device(path: Path) -> SourceImage | EncodedJPEG:
    """``path``'s bytes when it is a JPEG the device decoder takes (8-bit RGB or grayscale; not CMYK),
    checked against the pixel limit from its header before its bytes are read; any other image
    decoded here, as without ``decode="cuda"``."""
    from PIL import Image

    with _open_file(path) as f:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                with Image.open(f) as img:  # the header only: nothing is decoded here
                    fmt, mode, size = img.format, img.mode, img.size
                    orientation = img.getexif().get(_EXIF_ORIENTATION, 1)
        except Exception:  # not an image Pillow knows, or hostile: Pillow's own decode says why
            fmt = None
        f.seek(0)
        if fmt == "JPEG" and mode in ("RGB", "L") and min(size) > 0:
            check_pixels(size[0], size[1], str(path))
            return EncodedJPEG(f.read(), str(path), orientation if orientation in range(2, 9) else 1)
        arr = _decode(f, str(path))
    return SourceImage(_as_tensor(arr), str(path), arr, from_file=True)


def _upright_chw(t: torch.Tensor, orientation: int) -> torch.Tensor:
    """A CHW image turned as EXIF ``orientation`` says, the transposition Pillow's ``exif_transpose`` makes."""
    h, w = 1, 2
    return {
        2: lambda: t.flip(w),                        # mirrored
        3: lambda: t.flip(h).flip(w),                # rotated 180
        4: lambda: t.flip(h),                        # flipped
        5: lambda: t.transpose(h, w),                # transposed
        6: lambda: t.transpose(h, w).flip(w),        # rotated 90 clockwise to be upright
        7: lambda: t.transpose(h, w).flip(h).flip(w),  # transversed
        8: lambda: t.transpose(h, w).flip(h),        # rotated 90 counter-clockwise to be upright
    }.get(orientation, lambda: t)().contiguous()


def device_decoder() -> Callable[[list[torch.Tensor], torch.device], list[torch.Tensor]]:
    """The device JPEG decoder: JPEG bitstreams to CHW RGB uint8 tensors on a CUDA device, in one
    batched nvJPEG call (``torchvision.io.decode_jpeg``), or :class:`MissingDependencyError` naming the extra."""
    from libreyolo.errors import MissingDependencyError, require

    try:
        tv_io = require("torchvision.io", "gpu-decode", 'predict(decode="cuda")')
    except MissingDependencyError:
        raise
    except Exception as exc:  # installed but unusable, e.g. built for another torch
        raise MissingDependencyError(
            f'predict(decode="cuda") needs torchvision built for this torch ({torch.__version__}), but importing '
            f"it failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}; install the matching "
            "torchvision (pip install 'libreyolo[gpu-decode]') or use decode=\"cpu\"") from None

    def decode(datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        return tv_io.decode_jpeg(datas, mode=tv_io.ImageReadMode.RGB, device=device)

    return decode


_THREAD = threading.local()


def decode_stream(device: torch.device) -> Any:
    """The stream this thread calls the device decoder on (one per thread and device, made once).

    torchvision's decoder allocates its output tensors on the caller's current stream but writes them
    on a stream of its own, without waiting for the caller's stream first (pytorch/vision PR #9606):
    memory the caller's stream freed while its queued kernels still read it may be handed out and
    overwritten. So the caller's stream here queues nothing else and is waited for after every call:
    it is this thread's own, and it comes from CUDA's high-priority stream pool, which nothing else in
    LibreYOLO draws from (staging and the feeder use default-priority streams, as torchvision's decoder
    does), so it is never a stream another part of the pipeline has queued work on.
    """
    streams = _THREAD.__dict__.setdefault("streams", {})
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in streams:
        # a negative priority is a higher one (mapped to the highest the device has)
        streams[key] = torch.cuda.Stream(torch.device("cuda", key), priority=-1)
    return streams[key]


def decode_on_device(items: list[EncodedJPEG], device: torch.device) -> list[SourceImage | ImageError]:
    """``items`` decoded on ``device`` in one call, upright, as CHW RGB ``SourceImage``s (``from_file``:
    plotting reads the file again). Should the batched call fail (a corrupt stream, one nvJPEG cannot
    take), each is decoded alone, and one the device cannot decode is decoded by Pillow on the host:
    an image nvJPEG refuses still gets its result, a corrupt one its :class:`ImageError`.
    The decoded tensors are complete when this returns (the calling thread waited for them)."""
    if not items:
        return []
    decode = device_decoder()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # bytes are read-only; the decoder only reads them
        datas = [torch.frombuffer(e.data, dtype=torch.uint8) for e in items]
    # on this thread's decode stream (see decode_stream), waited for here; users of the tensors on other
    # streams record them there (libreyolo.engine.stream.stage)
    stream = decode_stream(device) if device.type == "cuda" else None
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        try:
            decoded: list[Any] = list(decode(datas, device))
        except Exception:
            decoded = []
            for d in datas:
                try:
                    decoded.append(decode([d], device)[0])
                except Exception:
                    decoded.append(None)
    if stream is not None:
        stream.synchronize()
    out: list[SourceImage | ImageError] = []
    for e, t in zip(items, decoded, strict=True):
        if t is None:
            try:
                arr = read_image_bytes(e.data, e.path)
                out.append(SourceImage(_as_tensor(arr), e.path, arr, from_file=True))
            except ImageError as exc:
                out.append(exc)
            continue
        out.append(SourceImage(_upright_chw(t, e.orientation), e.path, None, hwc=False, from_file=True))
    return out
