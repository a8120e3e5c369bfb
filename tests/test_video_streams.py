"""Live streams that drop or stall (issue 48): ``reconnect`` and ``stream_timeout``, against a local
TCP server that serves an MPEG-TS clip (FFmpeg's ``tcp://`` input) and then closes, stalls or
refuses. Every case ends in seconds: a stall is the read timeout (0.5 s here), the waits between
attempts are 0.5 s then 1 s.
"""
from __future__ import annotations

import io
import itertools
import socket
import threading
import time

import numpy as np
import pytest

av = pytest.importorskip("av", reason="PyAV is not installed (libreyolo[video])")

from libreyolo.cli import main as cli_main  # noqa: E402
from libreyolo.data.video import VideoSource, reconnect_delay  # noqa: E402
from libreyolo.errors import ArgumentError, ImageError  # noqa: E402
from libreyolo.train.shapes import shapes_sequence  # noqa: E402

FRAMES = 40


@pytest.fixture(scope="module")
def ts_clip() -> bytes:
    """A 40-frame 32x32 H.264 clip in MPEG-TS (a live stream's container)."""
    frames, _ = shapes_sequence(FRAMES, width=32, height=32, n_objects=1, size=12, seed=3)
    buf = io.BytesIO()
    with av.open(buf, "w", format="mpegts") as c:
        s = c.add_stream("libx264", rate=25)
        s.width, s.height, s.pix_fmt = 32, 32, "yuv420p"
        for f in frames:
            for pkt in s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                c.mux(pkt)
        for pkt in s.encode():
            c.mux(pkt)
    return buf.getvalue()


class Server:
    """Serves one behaviour per connection, in turn: ``(bytes, "close" | "stall")``; then refuses, or with
    ``forever`` repeats the last one (until the test ends)."""

    def __init__(self, plan: list[tuple[bytes, str]], forever: bool = False) -> None:
        self.forever = forever
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.url = f"tcp://127.0.0.1:{self.sock.getsockname()[1]}"
        self.release = threading.Event()
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, args=(plan,), daemon=True)
        self.thread.start()

    def _serve(self, plan: list[tuple[bytes, str]]) -> None:
        for k in itertools.count():
            if k >= len(plan) and not self.forever:
                break
            data, then = plan[min(k, len(plan) - 1)]
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed by __exit__
                return
            self.conns.append(conn)
            conn.sendall(data)
            if then == "stall":
                self.release.wait(30)
            conn.close()
        self.sock.close()  # later connections are refused

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.thread.join(5)
        self.sock.close()
        for c in self.conns:
            c.close()


def test_a_dropped_stream_reconnects_then_ends_in_one_line(ts_clip, capfd):
    """Half the clip, a drop, the whole clip on reconnection (frame indices go on), then a drop and
    two refused attempts: one error line, a non-zero exit, in seconds. Without the reconnection
    (reconnect=0, the mutation) the run ends after the first half. The CLI predicts every 10th frame
    only: the network's time is not what is tested."""
    half = ts_clip[: len(ts_clip) // 2]
    with Server([(half, "close"), (ts_clip, "close")]) as srv:
        src = VideoSource(srv.url, reconnect=2, stream_timeout=2)
        got = []
        with pytest.raises(ImageError, match="2 reconnection attempts over 1.5 s failed"):
            for img in src.frames():
                got.append((img.frame, img.timestamp))
    assert src.reconnects == 1 and len(got) > FRAMES
    assert [f for f, _ in got] == list(range(len(got)))
    # timestamps go on across the reconnection
    assert all(b > a for (_, a), (_, b) in zip(got[:-1], got[1:], strict=True))
    with Server([(half, "close")]) as srv:
        src = VideoSource(srv.url, stream_timeout=2)  # reconnect=0: the drop ends the stream
        assert 0 < sum(1 for _ in src.frames()) < FRAMES
    with Server([(half, "close"), (ts_clip, "close")]) as srv:
        t0 = time.monotonic()
        rc = cli_main(["predict", "model=LibreYOLO9t-shapes.pt", f"source={srv.url}", "imgsz=32", "save=false",
                       "reconnect=2", "stream_timeout=2", "vid_stride=10", "batch=8"])
        elapsed = time.monotonic() - t0
    out, err = capfd.readouterr()
    frames = [int(line.split(" frame ")[1].split()[0]) for line in out.splitlines() if " frame " in line]
    errors = [line for line in err.splitlines() if line.startswith("libreyolo predict: error:")]
    assert rc != 0 and elapsed < 60, (rc, elapsed)
    assert len(errors) == 1 and "reconnection attempts over 1.5 s failed" in errors[0], err
    assert "reconnected (attempt 1 of 2)" in err
    assert frames == list(range(0, 10 * len(frames), 10)) and frames[-1] > FRAMES, frames


def test_a_stalled_stream_ends_within_seconds(ts_clip):
    with Server([(ts_clip[: len(ts_clip) // 2], "stall")]) as srv:
        t0 = time.monotonic()
        src = VideoSource(srv.url, stream_timeout=0.5)
        with pytest.raises(ImageError, match=r"stalled \(no data for 0.5 s\) after frame \d+; pass reconnect=N"):
            n = sum(1 for _ in src.frames())
        assert time.monotonic() - t0 < 4
    with Server([(ts_clip[: len(ts_clip) // 2], "stall")]) as srv:  # reopening: the server no longer answers
        t0 = time.monotonic()
        src = VideoSource(srv.url, stream_timeout=0.5, reconnect=1)
        n = 0
        with pytest.raises(ImageError, match=r"stalled .* 1 reconnection attempt over 0.5 s failed"):
            for _ in src.frames():
                n += 1
        assert n > 0 and time.monotonic() - t0 < 6


def test_reconnect_options_are_checked_everywhere(demo):
    assert [reconnect_delay(k) for k in range(1, 7)] == [0.5, 1, 2, 4, 8, 8]
    frame = np.zeros((32, 32, 3), np.uint8)
    for bad in ({"reconnect": -1}, {"stream_timeout": 0}, {"reconnect": "x"}):
        with pytest.raises(ArgumentError, match=next(iter(bad))):
            demo.predict(frame, **bad)
        with pytest.raises(ArgumentError, match=next(iter(bad))):
            demo.track(frame, **bad)
    assert cli_main(["predict", "model=LibreYOLO9t-shapes.pt", "reconnect=-1"]) == 2
    assert cli_main(["track", "model=LibreYOLO9t-shapes.pt", "stream_timeout=nan"]) == 2
