"""The annotated video of a video source (``predict(save=True)``), written by PyAV, crash-safe.

Frames are encoded as they are predicted into a temporary file beside the destination (H.264
with ``libx264`` where the installed FFmpeg has it, else MPEG-4 Part 2), at the source's frame
rate divided by ``vid_stride`` (the same duration), and renamed onto ``<save_dir>/<stem>.mp4``
only once the last frame is written: a run that fails leaves no video and never replaces an
older one with a partial file. A run the caller stops early (leaving a ``stream=True`` loop)
keeps the frames written so far, as a complete video.
"""
from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from libreyolo.errors import ArgumentError, ImageError
from libreyolo.utils.atomic import file_mode_for
from libreyolo.utils.log import LOGGER
from libreyolo.utils.tempfiles import TempGuard

CODECS = ("libx264", "libopenh264", "mpeg4")  # the first the installed FFmpeg can encode


def output_path(info: Any, save_dir: str | Path) -> Path:
    """``<save_dir>/<stem>.mp4`` for a video source (``webcam0.mp4``, a stream's last path part)."""
    name = info.name.split("?")[0].rstrip("/")
    stem = re.sub(r"[^\w.-]+", "_", Path(name).stem or "stream") if not name.startswith("webcam ") \
        else name.replace(" ", "")
    return Path(save_dir) / f"{stem}.mp4"


def pick_codec(av: Any) -> str:
    available = av.codecs_available
    for name in CODECS:
        if name in available:
            try:
                av.codec.Codec(name, "w")
                return name
            except Exception:  # listed but not an encoder in this build
                continue
    raise ImageError(f"the installed FFmpeg (PyAV) has none of the encoders {', '.join(CODECS)}")


def save_video(results: Iterator[Any], info: Any, save_dir: str | Path, *, vid_stride: int = 1) -> Iterator[Any]:
    """``results`` passed through unchanged, each frame's :meth:`~libreyolo.results.Results.plot`
    encoded on the way into ``output_path(info, save_dir)``, renamed into place at the end."""
    import av

    dest = output_path(info, save_dir)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArgumentError(f"cannot create save_dir {dest.parent}: {exc.strerror or exc}") from None
    rate = Fraction(info.fps).limit_denominator(100_000) / vid_stride
    with TempGuard() as guard:
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
        os.close(fd)
        guard.add(tmp)
        container = None
        finished = False
        try:
            container = av.open(tmp, "w", format="mp4")
            stream = container.add_stream(pick_codec(av), rate=rate)
            stream.pix_fmt = "yuv420p"
            stream.width, stream.height = info.width + info.width % 2, info.height + info.height % 2
            n = 0
            try:
                for r in results:
                    t0 = time.perf_counter()
                    _encode(container, stream, _even(np.asarray(r.plot())))
                    r.speed["write"] = (time.perf_counter() - t0) * 1e3  # drawing and encoding, ms
                    n += 1
                    yield r
            except GeneratorExit:  # the caller stopped early: keep what was written
                pass
            for packet in stream.encode():
                container.mux(packet)
            container.close()
            container = None
            os.chmod(tmp, file_mode_for(dest))
            os.replace(tmp, dest)
            finished = True
            LOGGER.info("annotated video (%d frames) written to %s", n, dest)
        finally:
            if container is not None:
                try:
                    container.close()
                except Exception:  # the write failed already; that error is the one to report
                    pass
            if not finished:
                Path(tmp).unlink(missing_ok=True)


def _encode(container: Any, stream: Any, rgb: np.ndarray) -> None:
    import av

    for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
        container.mux(packet)


def _even(rgb: np.ndarray) -> np.ndarray:
    """yuv420p needs even sides: an odd one gets its last row/column repeated."""
    h, w = rgb.shape[:2]
    if h % 2 or w % 2:
        rgb = np.pad(rgb, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")
    return np.ascontiguousarray(rgb)
