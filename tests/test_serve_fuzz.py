# ruff: noqa: F811  (the shared pytest fixtures are imported from tests/serve_helpers.py by name)
"""A bounded hypothesis fuzz of ``POST /predict`` (issue 49): random query keys (repeated ones too)
and values, random bodies (good, empty, truncated, oversized, noise; raw or multipart). Every
answer is one of the declared statuses with a one-line JSON detail, never a 500, and the budgets
are all given back after. Deterministic (``derandomize``) and bounded (~60 examples, well under a
minute here); ``LIBREYOLO_FUZZ_EXAMPLES=N`` runs more. Loopback only.
"""
from __future__ import annotations

import io
import os
import time

import numpy as np
import pytest
from PIL import Image

from tests.serve_helpers import (  # noqa: F401  (fixtures: pytest finds them by name)
    CONF,
    IMGSZ,
    Server,
    frames,
    jpeg,
    model,
    no_onednn,
    one_thread,
)

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

DECLARED = {200, 400, 408, 413, 415, 422, 429}
KEYS = ["conf", "iou", "imgsz", "max_det", "classes", "annotate", "batch", "device", "tile", "color_format", "half",
        "cuda_graph", "max_nms", "verbose", "x", "conf "]
VALUES = st.one_of(
    st.sampled_from(["", "0", "1", "-1", "0.5", "nan", "inf", "-inf", "1e309", "true", "false", "0,1,2", "-3",
                     str(IMGSZ), str(2 * IMGSZ), "4096", "33", "cpu", "cuda", "rgb", "\x00", "9" * 40]),
    st.integers(-(10 ** 12), 10 ** 12).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=12),
)


def _png(width: int, height: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (10, 200, 30)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def fuzz_server(model):
    pytest.importorskip("fastapi")
    from libreyolo.serve import create_app

    srv = Server(create_app(model, max_bytes=200_000, max_batch=4, max_wait_ms=2, imgsz=IMGSZ, conf=CONF,
                            max_pixels=1_000_000, max_imgsz=2 * IMGSZ, body_timeout=5.0))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def bodies(frames) -> list[bytes]:
    good = jpeg(frames[0])
    noise = np.random.RandomState(0).randint(0, 256, 3000, dtype=np.uint8).tobytes()
    return [good, b"", good[: len(good) // 2], _png(1100, 1000), noise, b"\x89PNG\r\n\x1a\n" + bytes(40),
            _png(8, 8), b"x" * 200_001]


def test_fuzz_every_request_gets_a_declared_status_and_one_line(fuzz_server, bodies):
    import httpx

    client = httpx.Client(base_url=fuzz_server.url, timeout=60)
    examples = int(os.environ.get("LIBREYOLO_FUZZ_EXAMPLES", "60"))
    seen: dict[int, int] = {}

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(params=st.one_of(st.just([]),  # none, distinct keys, or any keys (repeats too)
                            st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=3).map(lambda d: list(d.items())),
                            st.lists(st.tuples(st.sampled_from(KEYS), VALUES), max_size=4)),
           body=st.one_of(st.just(0), st.sampled_from(range(len(bodies))), st.binary(max_size=600)),
           multipart=st.booleans())
    def one(params, body, multipart):
        data = bodies[body] if isinstance(body, int) else body
        if multipart:
            r = client.post("/predict", params=params, files={"file": ("x.bin", data, "application/octet-stream")})
        else:
            r = client.post("/predict", params=params, content=data)
        seen[r.status_code] = seen.get(r.status_code, 0) + 1
        assert r.status_code in DECLARED, (r.status_code, r.text[:300], params)
        if r.status_code != 200:
            detail = r.json()["detail"]
            assert isinstance(detail, str) and detail and "\n" not in detail, (r.status_code, detail)

    start = time.monotonic()
    try:
        one()
    finally:
        client.close()
    assert time.monotonic() - start < 60 or examples > 60  # the CI bound
    assert {200, 413, 415, 422} <= set(seen), seen  # the fuzz reached the model and each refusal
    budget = httpx.get(fuzz_server.url + "/info", timeout=30).json()["batcher"]["budget"]
    assert (budget["held_requests"], budget["held_pixels"]) == (0, 0)
