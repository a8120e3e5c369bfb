"""Video sources for ``predict()`` and ``track()``: files, network streams and webcams, decoded by PyAV.

A source is a video when it is a path with a video suffix (:data:`VIDEO_SUFFIXES`), an
``rtsp://`` / ``rtsps://`` / ``rtmp://`` / ``http(s)://`` URL, or a webcam index (``0``, ``"0"``).
:func:`open_video` opens it at once (so a missing file, an unreadable container, a refused
connection or an absent camera is one error before any work, never a hang: network sources are
opened with :data:`NETWORK_TIMEOUT_S`) and returns a :class:`VideoSource` whose :meth:`frames`
are decoded on one background thread into a bounded queue (:data:`QUEUE_FRAMES`): frames are
decoded only as fast as the batches that use them are consumed, so memory stays flat whatever the
length. Each frame is a :class:`~libreyolo.data.images.SourceImage` (RGB, HWC uint8) carrying its
index in the video (``frame``, counted from 0 over every decoded frame, whatever ``vid_stride``)
and its presentation time in seconds (``timestamp``).

``vid_stride`` keeps every n-th frame, ``start_frame`` / ``end_frame`` (end exclusive) a range
(declared in :data:`libreyolo.engine.options.VIDEO_OPTIONS`);
frames before the start are decoded and dropped (no seeking: exact for every codec).
PyAV is the optional extra ``video`` (``pip install 'libreyolo[video]'``).
"""
from __future__ import annotations

import os
import queue
import re
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libreyolo.errors import ImageError, require
from libreyolo.options import NETWORK_TIMEOUT_S
from libreyolo.utils.log import LOGGER

VIDEO_SUFFIXES = frozenset({".mp4", ".m4v", ".mov", ".avi", ".mkv", ".webm", ".mpg", ".mpeg", ".ts", ".wmv",
                            ".flv", ".gif", ".3gp", ".asf", ".mts", ".m2ts"})
STREAM_SCHEMES = ("rtsp://", "rtsps://", "rtmp://", "http://", "https://", "udp://", "tcp://", "srt://")
RECONNECT_FIRST_S, RECONNECT_MAX_S = 0.5, 8.0  # the wait before the first reconnection attempt, doubling to the max
QUEUE_FRAMES = 8         # decoded frames waiting for their batch, at most (the decode thread's lead)
_WEBCAM = re.compile(r"^\d{1,3}$")
MAX_WEBCAM = 255  # a larger integer is not a webcam index (it stays an unsupported source)



def is_video(source: Any) -> bool:
    """Whether ``source`` names a video: a video file, a stream URL or a webcam index."""
    if isinstance(source, bool):
        return False
    if isinstance(source, int):
        return 0 <= source <= MAX_WEBCAM
    if not isinstance(source, (str, Path)):
        return False
    text = os.fspath(source)
    if isinstance(source, str) and _WEBCAM.match(text) and int(text) <= MAX_WEBCAM and not os.path.exists(text):
        return True
    if text.lower().startswith(STREAM_SCHEMES):
        return Path(text.split("?")[0]).suffix.lower() not in _IMAGE_URL_SUFFIXES
    return Path(text).suffix.lower() in VIDEO_SUFFIXES


_IMAGE_URL_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"})


def _av() -> Any:
    return require("av", "video", "reading and writing videos")


@dataclass
class VideoInfo:
    """What is known of a video before decoding: where from, frame rate, size, frame count (None: unknown)."""

    name: str
    fps: float
    width: int
    height: int
    frames: int | None
    live: bool  # a camera or network stream (no end known)


class VideoSource:
    """One opened video; iterate :meth:`frames` once. :meth:`close` stops the decode thread."""

    def __init__(self, source: Any, *, vid_stride: int = 1, start_frame: int = 0, end_frame: int | None = None,
                 reconnect: int = 0, stream_timeout: float = NETWORK_TIMEOUT_S) -> None:
        if end_frame is not None and end_frame <= start_frame:
            raise ImageError(f"end_frame={end_frame} must be after start_frame={start_frame}")
        self.stride, self.start, self.end = vid_stride, start_frame, end_frame
        self.reconnect, self.timeout, self._source = reconnect, stream_timeout, source
        av = _av()
        self._container, self.info = _open(av, source, stream_timeout)
        self.reconnects = 0  # times the stream was reopened after a drop or a stall
        self._streak, self._waited, self._last = 0, 0.0, ""  # attempts (and their waits) since the last frame
        self._stop = threading.Event()
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_FRAMES)
        self._thread: threading.Thread | None = None
        self.decoded = 0  # frames decoded so far (the tests watch the decode thread's lead)

    @property
    def expected(self) -> int | None:
        """How many frames :meth:`frames` will give, when the container says how many it has."""
        n = self.info.frames if self.end is None else min(self.end, self.info.frames or self.end)
        if n is None:
            return None
        return max(0, -(-(n - self.start) // self.stride))

    def frames(self) -> Iterator[Any]:
        """The kept frames as :class:`SourceImage` objects, in order; a decoding error raises
        :class:`ImageError` at its place (after the frames before it)."""
        if self._thread is not None:
            raise ImageError(f"{self.info.name}: a video source can be iterated once; open it again")
        self._thread = threading.Thread(target=self._decode, name="libreyolo-video", daemon=True)
        self._thread.start()
        try:
            while True:
                kind, value = self._queue.get()
                if kind == "frame":
                    yield value
                elif kind == "error":
                    raise value
                else:
                    return
        finally:
            self.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            while self._thread.is_alive():  # unblock a put() waiting for room
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    pass
                self._thread.join(0.05)
        try:
            self._container.close()
        except Exception:  # already closed, or a stream that failed mid-way: nothing left to release
            pass

    def _put(self, item: tuple[str, Any]) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _decode(self) -> None:
        from libreyolo.data.images import SourceImage, _as_tensor

        av = sys.modules["av"]
        info = self.info
        index, last_t, shift = -1, 0.0, None  # shift: added to a reopened stream's timestamps (they restart)
        try:
            while True:
                cause = None
                try:
                    stream = self._container.streams.video[0]
                    stream.thread_type = "AUTO"
                    for frame in self._container.decode(stream):
                        index += 1
                        self._streak, self._waited = 0, 0.0  # a frame came: the stream is back
                        self.decoded = index + 1
                        if self._stop.is_set() or (self.end is not None and index >= self.end):
                            break
                        if index < self.start or (index - self.start) % self.stride:
                            continue
                        arr = frame.to_ndarray(format="rgb24")
                        t = float(frame.time) if frame.time is not None else index / info.fps
                        if shift is None:
                            shift = last_t + 1 / info.fps - t if self.reconnects else 0.0
                        last_t = t + shift
                        img = SourceImage(_as_tensor(arr), info.name, arr, frame=index, timestamp=last_t)
                        if not self._put(("frame", img)):
                            return
                    else:
                        cause = "the stream ended"
                except av.error.FFmpegError as exc:
                    if not (info.live and self.reconnect):
                        raise
                    cause = self._failure(av, exc)
                stopped = self._stop.is_set() or (self.end is not None and index >= self.end)
                if stopped or cause is None or not (info.live and self.reconnect):
                    break
                if not self._reopen(av, cause):
                    return
                shift = None
            if info.frames and not stopped and index + 1 < info.frames:
                raise ImageError(f"{info.name}: the video ended after {index + 1} of its {info.frames} frames; "
                                 "the file is truncated or corrupt")
            if index < self.start and not stopped:
                raise ImageError(f"{info.name}: start_frame={self.start} is past the video's last frame ({index})")
            self._put(("end", None))
        except av.error.FFmpegError as exc:
            if info.live:
                msg = (f"{info.name}: {self._failure(av, exc)} after frame {self.decoded - 1}; pass reconnect=N "
                       "to reopen it")
            else:
                msg = f"{info.name}: decoding failed ({_why(exc)}); the video may be truncated or corrupt"
            self._put(("error", ImageError(msg)))
        except BaseException as exc:  # handed to the consumer, raised there in order
            self._put(("error", exc))

    def _failure(self, av: Any, exc: Exception) -> str:
        """What happened to a live stream, in words: a stall (the read timeout interrupted it) or a drop."""
        if isinstance(exc, av.error.ExitError):
            return f"the stream stalled (no data for {self.timeout:g} s)"
        return f"the stream dropped ({_why(exc)})"

    def _reopen(self, av: Any, cause: str) -> bool:
        """Reopen a live stream that dropped or stalled: up to ``reconnect`` tries in a row without a
        frame between them (a stream that opens and ends at once counts), waiting
        :func:`reconnect_delay` before each. False (an error queued for the consumer) when none worked."""
        try:
            self._container.close()
        except Exception:  # a stream that failed mid-way: nothing left to release
            pass
        while self._streak < self.reconnect:
            self._streak += 1
            delay = reconnect_delay(self._streak)
            if self._stop.wait(delay):
                return False
            self._waited += delay
            try:
                self._container, _ = _open(av, self._source, self.timeout)
            except ImageError as exc:
                self._last = str(exc)
                continue
            self.reconnects += 1
            LOGGER.warning("%s: %s; reconnected (attempt %d of %d)", self.info.name, cause, self._streak,
                           self.reconnect)
            return True
        last = f" (last: {self._last})" if self._last else ""
        self._put(("error", ImageError(
            f"{self.info.name}: {cause} after frame {self.decoded - 1}, and {self.reconnect} reconnection "
            f"attempt{'s' * (self.reconnect > 1)} over {self._waited:.1f} s failed{last}; check the source, "
            "or allow more with reconnect=")))
        return False


def reconnect_delay(attempt: int) -> float:
    """Seconds before reconnection attempt ``attempt`` (from 1): 0.5, 1, 2, 4, then 8 s each."""
    return min(RECONNECT_FIRST_S * 2 ** (attempt - 1), RECONNECT_MAX_S)


def _why(exc: Exception) -> str:
    return getattr(exc, "strerror", None) or str(exc)


def _open(av: Any, source: Any, timeout: float = NETWORK_TIMEOUT_S) -> tuple[Any, VideoInfo]:
    """(container, info) of ``source``, or ImageError saying why it cannot be opened."""
    live = False
    options: dict[str, str] = {}
    fmt = None
    if isinstance(source, int) or (isinstance(source, str) and _WEBCAM.match(source)):
        index = int(source)
        name = f"webcam {index}"
        target, fmt, live = _webcam(index)
    else:
        target = os.fspath(source)
        name = target
        if target.lower().startswith(STREAM_SCHEMES):
            live = True
            us = str(int(timeout * 1e6))
            options = {"timeout": us, "rw_timeout": us}  # connect/read timeouts (microseconds)
            if target.lower().startswith("rtsp"):
                options["rtsp_transport"] = "tcp"
        else:
            p = Path(target)
            if not p.exists():
                raise ImageError(f"video file not found: {target}")
            if not p.is_file():
                raise ImageError(f"{target} is not a regular file")
    t0 = time.monotonic()
    try:
        container = av.open(target, format=fmt, options=options, timeout=timeout if live else None)
    except av.error.FFmpegError as exc:
        if live and time.monotonic() - t0 >= 0.9 * timeout:
            raise ImageError(f"cannot open {name}: no answer within {timeout:g} s ({_why(exc)})") from None
        raise ImageError(f"cannot open {name}: {_why(exc)}" + (
            "" if live else "; the file may be truncated, corrupt or not a video")) from None
    except OSError as exc:
        raise ImageError(f"cannot open {name}: {exc.strerror or exc}") from None
    if not container.streams.video:
        container.close()
        raise ImageError(f"{name} has no video stream")
    stream = container.streams.video[0]
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    fps = float(rate) if rate else 30.0
    frames = stream.frames or None
    w, h = stream.codec_context.width, stream.codec_context.height
    if not w or not h:
        container.close()
        raise ImageError(f"{name}: the video stream has no frame size; the file may be corrupt")
    return container, VideoInfo(name, fps, w, h, None if live else frames, live)


def _webcam(index: int) -> tuple[str, str, bool]:
    """(device, ffmpeg input format, live) of webcam ``index``, checked to exist where that can be
    told without opening it (Linux: /dev/videoN)."""
    if sys.platform.startswith("linux"):
        dev = f"/dev/video{index}"
        if not os.path.exists(dev):
            cams = sorted(p.name for p in Path("/dev").glob("video[0-9]*"))
            raise ImageError(f"webcam {index} not found: {dev} does not exist "
                             f"({'cameras here: ' + ', '.join(cams) if cams else 'no camera on this machine'})")
        return dev, "v4l2", True
    if sys.platform == "darwin":
        return str(index), "avfoundation", True
    if sys.platform.startswith("win"):
        raise ImageError(f"webcam {index}: webcam indices are not supported on Windows yet; read the frames "
                         "yourself (e.g. OpenCV) and pass them as a generator")
    raise ImageError(f"webcam {index}: webcams are not supported on {sys.platform}")
