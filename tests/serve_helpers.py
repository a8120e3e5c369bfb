"""What the serving tests share: the demo detector, four frames of its held-out image, exact
comparison of results, JPEG encoding, a model whose predict() can be held and uvicorn in a thread.

Exactness on the CPU: the tests compare every result with a direct ``model(image)`` bit for bit
(``torch.equal``), with PyTorch's oneDNN convolutions switched off (``no_onednn``). With oneDNN
on, PyTorch's convolution dispatch (``ConvParams::use_mkldnn``) sends small 3x3 convolutions of a
single image (at most 20,480 input values, e.g. 32x20x20 at imgsz 160) to ATen's native kernel
but any batch of two or more to oneDNN, which sums in another order: a batched image then differs
from the same image alone in the last bits (measured: 7.6e-5 on box coordinates of the demo
detector at imgsz 160). ATen's native convolution computes each image of a batch alone, so with
oneDNN off batching changes nothing, and any difference would be a bug of the Batcher.
"""
from __future__ import annotations

import io
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import libreyolo
from libreyolo import LibreYOLO

SHAPES = str(Path(libreyolo.__file__).parent / "assets" / "shapes.jpg")  # the demo detector's held-out image
IMGSZ = 160
CONF = 0.05


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Two OpenMP threads spin against the other jobs of a loaded 2-core machine (measured 1.4 s per
    forward against 0.04 s with one); the tests time nothing, so one intra-op thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def no_onednn(monkeypatch):
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)


@pytest.fixture(scope="module")
def model():
    return LibreYOLO("LibreYOLO9t-shapes.pt")


@pytest.fixture(scope="module")
def frames() -> list[np.ndarray]:
    """Four different BGR frames (as OpenCV gives them) of the demo's held-out image."""
    base = np.asarray(Image.open(SHAPES).convert("RGB"))[:, :, ::-1]
    return [np.ascontiguousarray(v) for v in (base, base[:, ::-1], base[::-1], base[40:440, 80:600])]


def same(a, b) -> bool:
    return all(torch.equal(getattr(a.boxes, k), getattr(b.boxes, k)) for k in ("xyxy", "conf", "cls"))


def jpeg(frame_bgr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(frame_bgr[:, :, ::-1])).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


class Gated:
    """The model, with a predict() that can be held: ``entered`` is set when a predict starts, which
    then waits for ``release``; predicts over a ``poison`` image raise ``ValueError``."""

    def __init__(self, model, *, hold: bool = False, poison: np.ndarray | None = None) -> None:
        self._model, self.poison = model, poison
        self.entered, self.release = threading.Event(), threading.Event()
        if not hold:
            self.release.set()

    def __getattr__(self, name):
        return getattr(self._model, name)

    def predict(self, images, **kw):
        self.entered.set()
        assert self.release.wait(30), "the test never released predict()"
        if self.poison is not None and any(np.array_equal(i, self.poison) for i in images):
            raise ValueError("poisoned image")
        return self._model.predict(images, **kw)


class Server:
    """uvicorn in a thread on a free localhost port (the socket is bound here, then handed over)."""

    def __init__(self, app) -> None:
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:  # bounded: uvicorn sets this flag and offers no event
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(60)
        self.sock.close()
