"""The annotated video of a video source (``predict(save=True)``), written by PyAV, crash-safe.

Frames are encoded as they are predicted into a temporary file beside the destination (H.264
with ``libx264`` where the installed FFmpeg has it, else MPEG-4 Part 2), at the source's frame
rate divided by ``vid_stride`` (the same duration), and renamed onto ``<save_dir>/<stem>.mp4``
only once the last frame is written: a run that fails leaves no video and never replaces an
older one with a partial file. A run the caller stops early (leaving a ``stream=True`` loop)
keeps the frames written so far, as a complete video.

Encoding runs on a thread of its own (PyAV releases the GIL while it converts and encodes), a few
frames behind the predictions, so a 1080p H.264 encode overlaps decoding and the network instead of
adding to each frame's time; ``libx264`` runs at its ``veryfast`` preset (constant quality 23, the
usual setting for live encoding). Frames are drawn on the caller's thread, so a result the caller
changes after it is yielded does not change the video. An encoder error is raised at the next frame.
"""
from __future__ import annotations

import os
import queue
import re
import tempfile
import threading
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
CODEC_OPTIONS = {"libx264": {"preset": "veryfast"}}
QUEUED_FRAMES = 4  # frames drawn and waiting for the encoder (4 x 6 MB at 1080p)


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
        encoder = None
        finished = False
        try:
            encoder = _Encoder(av, tmp, rate, _even_size(info.width), _even_size(info.height))
            n = 0
            try:
                for r in results:
                    t0 = time.perf_counter()
                    encoder.put(_even(np.asarray(r.plot())))
                    r.speed["write"] = (time.perf_counter() - t0) * 1e3  # drawing and queueing, ms
                    n += 1
                    yield r
            except GeneratorExit:  # the caller stopped early: keep what was written
                pass
            encoder.close()
            encoder = None
            os.chmod(tmp, file_mode_for(dest))
            os.replace(tmp, dest)
            finished = True
            LOGGER.info("annotated video (%d frames) written to %s", n, dest)
        finally:
            if encoder is not None:
                encoder.abort()  # the run failed already; that error is the one to report
            if not finished:
                Path(tmp).unlink(missing_ok=True)


def _even_size(n: int) -> int:
    return n + n % 2


class _Encoder:
    """One output file encoded on a thread of its own from a short queue of RGB frames."""

    _STOP = object()

    def __init__(self, av: Any, path: str, rate: Fraction, width: int, height: int) -> None:
        self._av = av
        self._container = av.open(path, "w", format="mp4")
        try:
            codec = pick_codec(av)
            self._stream = self._container.add_stream(codec, rate=rate, options=dict(CODEC_OPTIONS.get(codec, {})))
            self._stream.pix_fmt = "yuv420p"
            self._stream.width, self._stream.height = width, height
        except BaseException:
            self._container.close()
            raise
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUED_FRAMES)
        self._error: BaseException | None = None
        self._abort = threading.Event()
        self._thread = threading.Thread(target=self._run, name="libreyolo-video-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                rgb = self._queue.get()
                if rgb is self._STOP or self._abort.is_set():
                    break
                for packet in self._stream.encode(self._av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                    self._container.mux(packet)
            if not self._abort.is_set():
                for packet in self._stream.encode():
                    self._container.mux(packet)
        except BaseException as exc:  # raised on the caller's thread at its next frame or close
            self._error = exc
        finally:
            try:
                self._container.close()
            except BaseException as exc:
                self._error = self._error or exc
            while True:  # a caller blocked on a full queue must not wait for a thread that is gone
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break

    def _raise(self) -> None:
        if self._error is not None:
            raise ImageError(f"writing the annotated video failed: {self._error}") from self._error

    def put(self, rgb: np.ndarray) -> None:
        while True:
            self._raise()
            if not self._thread.is_alive():
                raise ImageError("writing the annotated video failed: the encoder thread stopped")
            try:
                self._queue.put(rgb, timeout=0.5)
                return
            except queue.Full:
                continue

    def close(self) -> None:
        """Encode what is queued, flush the encoder and close the file; raise the encoder's error."""
        while self._thread.is_alive():
            try:
                self._queue.put(self._STOP, timeout=0.5)
                break
            except queue.Full:
                continue
        self._thread.join()
        self._raise()

    def abort(self) -> None:
        self._abort.set()
        try:
            self._queue.put_nowait(self._STOP)
        except queue.Full:
            pass
        self._thread.join()


def _even(rgb: np.ndarray) -> np.ndarray:
    """yuv420p needs even sides: an odd one gets its last row/column repeated."""
    h, w = rgb.shape[:2]
    if h % 2 or w % 2:
        rgb = np.pad(rgb, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")
    return np.ascontiguousarray(rgb)
