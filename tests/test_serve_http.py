# ruff: noqa: F811  (the shared pytest fixtures are imported from tests/serve_helpers.py by name)
"""Serving: the HTTP service of ``libreyolo serve``, its CLI and its page (the Batcher behind it:
test_serve.py)."""
from __future__ import annotations

import base64
import concurrent.futures
import io
import json
import sys

import numpy as np
import pytest
from PIL import Image

from libreyolo.errors import MissingDependencyError
from tests.serve_helpers import (  # noqa: F401  (fixtures: pytest finds them by name)
    CONF,
    IMGSZ,
    SHAPES,
    Gated,
    Server,
    frames,
    jpeg,
    model,
    no_onednn,
    one_thread,
)


# --- HTTP -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(model):
    pytest.importorskip("fastapi")
    from libreyolo.serve import create_app

    srv = Server(create_app(model, max_bytes=300_000, max_batch=8, max_wait_ms=100, imgsz=IMGSZ, conf=CONF))
    yield srv
    srv.stop()
    assert not srv.thread.is_alive()


def test_http_concurrent_requests_return_the_direct_results(server, model, frames, tmp_path):
    import httpx

    bodies = [jpeg(f) for f in frames]
    paths = []
    for i, b in enumerate(bodies):
        paths.append(tmp_path / f"{i}.jpg")
        paths[-1].write_bytes(b)
    want = [model(p, imgsz=IMGSZ, conf=CONF).summary() for p in paths]
    want_one = model(paths[2], imgsz=IMGSZ, conf=CONF, max_det=1).summary()

    def request(k: int):
        with httpx.Client(base_url=server.url, timeout=60) as client:
            if k % 2:
                return client.post("/predict", files={"file": ("x.jpg", bodies[k % 4], "image/jpeg")})
            return client.post("/predict", content=bodies[k % 4], params={"max_det": "1"} if k == 2 else None)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(request, range(16), timeout=120))
    for k, r in enumerate(responses):
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["predictions"] == (want_one if k == 2 else want[k % 4]), k
        assert body["orig_shape"] == list(frames[k % 4].shape[:2]) and body["task"] == "detect"
    info = httpx.get(server.url + "/info", timeout=30).json()
    assert info["batcher"]["requests"] >= 16 and info["batcher"]["mean_batch"] > 1
    assert info["model"]["family"] == "yolo9" and info["limits"]["max_bytes"] == 300_000
    assert httpx.get(server.url + "/health", timeout=30).json() == {"status": "ok"}


def test_http_refuses_large_bodies_non_images_and_bad_options(server, frames):
    import httpx

    with httpx.Client(base_url=server.url, timeout=60) as client:
        r = client.post("/predict", content=b"\xff" * 300_001)
        assert r.status_code == 413 and "declares 300,001 bytes" in r.json()["detail"]

        def chunks():  # no Content-Length: refused while reading
            for _ in range(40):
                yield b"\xff" * 10_000

        r = client.post("/predict", content=chunks())
        assert r.status_code == 413 and "more than 300,000 bytes" in r.json()["detail"]
        r = client.post("/predict", content=b"hello, not an image")
        assert r.status_code == 415 and "corrupt or not an image" in r.json()["detail"]
        r = client.post("/predict", content=b"")
        assert r.status_code == 415 and "empty" in r.json()["detail"]
        r = client.post("/predict", content=jpeg(frames[0]), params={"conf": "7"})
        assert r.status_code == 422 and r.json()["detail"] == "conf must be a number from 0 to 1, got '7'"
        r = client.post("/predict", content=jpeg(frames[0]), params={"confidence": "0.3"})
        assert r.status_code == 422 and "unknown predict option" in r.json()["detail"]
        no_file = b'--b\r\nContent-Disposition: form-data; name="note"\r\n\r\nhi\r\n--b--\r\n'
        r = client.post("/predict", content=no_file, headers={"content-type": "multipart/form-data; boundary=b"})
        assert r.status_code == 400 and "no file field" in r.json()["detail"]


def test_http_annotate_embeds_the_drawn_image(server, frames):
    import httpx

    r = httpx.post(server.url + "/predict", content=jpeg(frames[0]), params={"annotate": "true"}, timeout=60)
    assert r.status_code == 200
    image = Image.open(io.BytesIO(base64.b64decode(r.json()["annotated_png"])))
    assert image.format == "PNG" and image.size == (frames[0].shape[1], frames[0].shape[0])


def test_http_shutdown_finishes_the_request_in_flight(model, frames):
    pytest.importorskip("fastapi")
    import httpx

    from libreyolo.serve import create_app

    gate = Gated(model, hold=True)
    srv = Server(create_app(gate, max_batch=2, max_wait_ms=0, imgsz=IMGSZ, conf=CONF))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(httpx.post, srv.url + "/predict", content=jpeg(frames[0]), timeout=60)
        assert gate.entered.wait(30)  # the request is inside predict()
        srv.server.should_exit = True
        srv.thread.join(0.5)
        assert srv.thread.is_alive()  # still serving the request in flight
        gate.release.set()
        response = pending.result(60)
    srv.thread.join(60)
    assert response.status_code == 200 and len(response.json()["predictions"]) > 0
    assert not srv.thread.is_alive()
    srv.sock.close()


def test_missing_serve_extra_names_the_install_command(model, monkeypatch):
    from libreyolo.serve.app import create_app

    monkeypatch.setitem(sys.modules, "fastapi", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'libreyolo\[serve\]'"):
        create_app(model)


def test_cli_serve_bad_option_is_one_line_and_exit_2(capsys):
    from libreyolo.cli import main

    assert main(["serve", "model=LibreYOLO9t.yaml", "port=99999"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "libreyolo serve: error: port must be an integer from 0 to 65535, got '99999'"


# --- the page ------------------------------------------------------------------------------------
def test_page_draws_the_boxes_of_a_chosen_image(server, model, tmp_path):
    from tests.cdp import Browser, find_chromium

    chromium = find_chromium()
    if chromium is None:
        pytest.skip("no Chromium: apt-get install -y chromium (.ci/run installs it when run as root)")
    want = model(SHAPES, imgsz=IMGSZ, conf=CONF)
    browser = Browser(chromium, str(tmp_path / "profile"))
    try:
        target = browser.send("Target.createTarget", url="about:blank")["targetId"]
        session = browser.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        browser.send("Page.enable", session)
        browser.send("Emulation.setDeviceMetricsOverride", session, width=900, height=800, deviceScaleFactor=1,
                     mobile=False)
        browser.send("Page.navigate", session, url=server.url + "/")
        browser.wait_event("Page.loadEventFired", session)
        root = browser.send("DOM.getDocument", session)["root"]["nodeId"]
        node = browser.send("DOM.querySelector", session, nodeId=root, selector="#file")["nodeId"]
        browser.send("DOM.setFileInputFiles", session, nodeId=node, files=[SHAPES])
        state = browser.send("Runtime.evaluate", session, awaitPromise=True, returnByValue=True, expression="""
            new Promise((ok) => { const t0 = Date.now(); (function poll() {
                const s = document.body.dataset.state;
                if (s === 'done' || s === 'error' || Date.now() - t0 > 60000) {
                    const c = document.getElementById('overlay').getBoundingClientRect();
                    const img = document.getElementById('image');
                    ok({state: s, status: document.getElementById('status').textContent,
                        left: c.left, top: c.top, scale: img.clientWidth / img.naturalWidth,
                        result: window.lastResult || null});
                } else setTimeout(poll, 20); })(); })""")["result"]["value"]
        assert state["state"] == "done", state["status"]
        shot = browser.send("Page.captureScreenshot", session, format="png")["data"]
    finally:
        browser.close()
    (tmp_path / "page.png").write_bytes(base64.b64decode(shot))
    assert state["result"]["predictions"] == want.summary()
    pixels = np.asarray(Image.open(tmp_path / "page.png").convert("RGB")).astype(int)
    palette = [(255, 0, 0), (0, 192, 0), (0, 0, 255)]  # the page's colours of classes 0, 1, 2
    assert len(want.boxes) >= 2
    for (x1, y1, x2, _), k in zip(want.boxes.xyxy.tolist(), want.boxes.cls.tolist(), strict=True):
        s = state["scale"]
        # the top edge of the drawn box, at a quarter of its width (the label sits at its left end)
        x = int(state["left"] + round(x1 * s) + round((x2 - x1) * s) * 3 // 4)
        y = int(state["top"] + round(y1 * s))
        assert tuple(pixels[y, x]) == palette[int(k)], (k, x, y, pixels[y - 2:y + 3, x])
    drawn = sum(int((np.abs(pixels - c).sum(-1) == 0).sum()) for c in palette)
    assert drawn > 100  # boxes, not a stray pixel
    print(json.dumps({"screenshot": str(tmp_path / "page.png")}))
