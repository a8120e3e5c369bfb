"""Real CUDA graphs (run on a CUDA machine): parity, threads, streams, invalidation.

    PYTHONPATH=. python3 -m pytest -m gpu tests/test_graphs_gpu.py

Parity is exact (bit-for-bit, never a tolerance): the graph must return eager's bits.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from libreyolo.graphs.parity import bit_equal, check_family_size, probes, seeded_model

pytestmark = [
    pytest.mark.gpu,
]

THREADS = 8


@pytest.fixture
def model():
    m = seeded_model("yolo9", "t", device="cuda")
    yield m
    m.release_graphs()


def _probe_inputs(model, sizes=(640, 320)) -> list[torch.Tensor]:
    out = []
    for size in sizes:
        for seed in range(3):
            out += list(probes(model.family, size, device=torch.device("cuda"), seed=seed).values())
    return out


def _images(n: int) -> list[np.ndarray]:
    from PIL import Image

    from libreyolo import SAMPLE_IMAGE

    base = np.asarray(Image.open(SAMPLE_IMAGE).convert("RGB"))
    views = [base, base[:, ::-1], base[::-1], base[60:420, 100:600], base[:, :320], base[::2, ::2]]
    return [np.ascontiguousarray(views[i % len(views)]) for i in range(n)]


@pytest.mark.parametrize("size", ["t", "s", "m", "c"])
def test_graph_replay_is_bit_for_bit_eager(size):
    rows = check_family_size("yolo9", size, device="cuda", imgszs=(640, 320))
    failed = [f"{r['check']}: {r['detail']}" for r in rows if r["result"] == "fail"]
    assert not failed, failed
    assert {r["check"] for r in rows if r["result"] == "pass"} >= {
        "probe_uniform", "probe_normal", "probe_ramps", "probe_image", "second_replay", "interleaved", "fp16"}


def _serve_concurrently(worker_fn) -> list[str]:
    errors: list[str] = []
    barrier = threading.Barrier(THREADS)

    def run(worker: int) -> None:
        try:
            barrier.wait()
            worker_fn(worker, errors)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(f"worker {worker}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=run, args=(w,)) for w in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


@pytest.mark.parametrize("own_streams", [False, True], ids=["default_stream", "stream_per_thread"])
def test_threads_each_get_their_own_forward_result(model, own_streams):
    inputs = _probe_inputs(model)
    expected = [model._forward(x)["predictions"] for x in inputs]
    torch.cuda.synchronize()

    def work(worker: int, errors: list[str]) -> None:
        stream = torch.cuda.Stream() if own_streams else torch.cuda.current_stream()
        stream.wait_stream(torch.cuda.default_stream())
        with torch.cuda.stream(stream):
            for step in range(24):
                i = (worker * 5 + step * 7) % len(inputs)
                out = model._forward(inputs[i], cuda_graph=True)["predictions"]
                if not torch.equal(out, expected[i]):
                    errors.append(f"worker {worker} step {step}: wrong result for input {i}")

    errors = _serve_concurrently(work)
    assert errors == []
    info = model.graph_info()
    assert sorted(g["shape"][-1] for g in info["graphs"]) == [320, 640] and info["captures"] == 2


def test_threads_each_get_their_own_predict_results(model):
    images = _images(12)
    expected = [model(img, conf=0.6, color_format="rgb") for img in images]
    sizes = sorted({img.shape[:2] for img in images})
    for size in sizes:  # each frame size's graph (letterbox inside) captured before serving
        model.capture_graph(640, frame_size=size, color_format="rgb", conf=0.6)

    def work(worker: int, errors: list[str]) -> None:
        for step in range(6):
            i = (worker + 5 * step) % len(images)
            r = model(images[i], conf=0.6, color_format="rgb", cuda_graph=True)
            want = expected[i].boxes
            if not (torch.equal(r.boxes.xyxy, want.xyxy) and torch.equal(r.boxes.cls, want.cls)):
                errors.append(f"worker {worker}: wrong detections for image {i}")

    assert _serve_concurrently(work) == []
    info = model.graph_info()
    assert info["captures"] == len(sizes) and {g["program"] for g in info["graphs"]} == {"letterbox+pipeline"}


def test_capturing_while_other_threads_serve_eagerly(model):
    x = _probe_inputs(model, sizes=(320,))[0]
    stop = threading.Event()
    errors: list[str] = []

    def eager_loop() -> None:
        try:
            while not stop.is_set():
                model(_images(1)[0], imgsz=320, conf=0.6)
        except Exception as exc:  # noqa: BLE001
            errors.append(repr(exc))

    t = threading.Thread(target=eager_loop)
    t.start()
    try:
        for size in (640, 480, 320):
            model.capture_graph(size)
    finally:
        stop.set()
        t.join()
    assert errors == []
    assert torch.equal(model._forward(x, cuda_graph=True)["predictions"], model._forward(x)["predictions"])


def test_device_round_trip_drops_graphs_and_stays_exact(model):
    x = _probe_inputs(model, sizes=(320,))[-1]
    model._forward(x, cuda_graph=True)
    old = [p.detach() for p in model.net.parameters()]  # keeps the old addresses taken
    model.to("cpu").to("cuda")
    del old
    out = model._forward(x, cuda_graph=True)["predictions"]
    info = model.graph_info()
    assert info["invalidations"] == 1 and "moved" in info["last_invalidation"] and info["captures"] == 2
    assert torch.equal(out, model._forward(x)["predictions"])
    # a plain round trip (addresses may or may not be reused) must be exact either way
    model.to("cpu").to("cuda")
    assert torch.equal(model._forward(x, cuda_graph=True)["predictions"], model._forward(x)["predictions"])


def test_predict_device_switch_then_graph_is_exact(model):
    img = _images(1)[0]
    model(img, conf=0.6, cuda_graph=True)
    model(img, device="cpu", conf=0.6)  # moves the weights away and back through predict(device=...)
    eager = model(img, device="cuda", conf=0.6)
    graphed = model(img, device="cuda", conf=0.6, cuda_graph=True)
    assert torch.equal(graphed.boxes.xyxy, eager.boxes.xyxy) and torch.equal(graphed.boxes.conf, eager.boxes.conf)


def test_half_keeps_fp32_graphs_and_the_fp16_graph_is_exact(model):
    img = _images(1)[0]
    x = _probe_inputs(model, sizes=(640,))[-1]
    model._forward(x, cuda_graph=True)
    model.half()  # selects the float16 inference copy: the float32 copy and its graph stay valid
    xh = x.half()
    out = model._forward(xh, cuda_graph=True)["predictions"]
    info = model.graph_info()
    assert info["invalidations"] == 0 and sorted(g["dtype"] for g in info["graphs"]) == ["float16", "float32"]
    assert bool(torch.isfinite(out).all())  # a NaN probe would prove nothing
    assert bit_equal(out, model._forward(xh)["predictions"])
    graphed = model(img, half=True, conf=0.6, cuda_graph=True)
    eager = model(img, half=True, conf=0.6)
    assert torch.equal(graphed.boxes.xyxy, eager.boxes.xyxy)


def test_load_weights_drops_graphs_and_replays_the_new_weights(model):
    x = _probe_inputs(model, sizes=(320,))[0]
    model._forward(x, cuda_graph=True)
    other = seeded_model("yolo9", "t", seed=3, device="cuda")
    model.load_weights(other.net.state_dict())
    out = model._forward(x, cuda_graph=True)["predictions"]
    assert model.graph_info()["invalidations"] == 1
    assert torch.equal(out, other._forward(x)["predictions"])


def test_results_are_fresh_tensors_not_the_static_buffer(model):
    x = _probe_inputs(model, sizes=(320,))[0]
    a = model._forward(x, cuda_graph=True)["predictions"]
    b = model._forward(x, cuda_graph=True)["predictions"]
    entry = next(iter(model._graph_runner()._table.values()))
    ptrs = {a.data_ptr(), b.data_ptr(), entry.static_output.data_ptr()}
    assert len(ptrs) == 3 and torch.equal(a, b)


def test_auto_captures_on_the_second_call(model):
    x = _probe_inputs(model, sizes=(320,))[0]
    model._forward(x, cuda_graph="auto")
    assert model.graph_info()["captures"] == 0
    out = model._forward(x, cuda_graph="auto")["predictions"]
    assert model.graph_info()["captures"] == 1 and torch.equal(out, model._forward(x)["predictions"])


# --- the whole-pipeline graph: batch -> padded detections (forward, decoding, candidates, NMS) -----------------
def _spread_conf(model, img, imgsz=640) -> float:
    """A conf at which this image gives a few hundred candidate pairs (so detections are never vacuous)."""
    r = model(img, imgsz=imgsz, conf=0.0, max_det=1000, color_format="rgb")
    return float(r.boxes.conf[min(len(r) - 1, 200)]) if len(r) else 0.001


def _same(a, b) -> bool:
    return (torch.equal(a.boxes.xyxy, b.boxes.xyxy) and torch.equal(a.boxes.conf, b.boxes.conf)
            and torch.equal(a.boxes.cls, b.boxes.cls))


def test_pipeline_graph_is_the_cuda_graph_path_and_equals_eager_predict(model):
    info = model.graph_info()["pipeline"]
    assert info == {"supported": True, "active": True, "reason": None}, info
    images = _images(6)
    found = 0
    for i, img in enumerate(images):
        conf = _spread_conf(model, img)
        for kw in ({"conf": conf}, {"conf": conf, "iou": 0.7}, {"conf": conf, "classes": list(range(0, 80, 2))},
                   {"conf": conf / 2, "max_det": 50}):
            eager = model(img, color_format="rgb", **kw)
            graphed = model(img, color_format="rgb", cuda_graph=True, **kw)
            assert _same(graphed, eager), (i, kw)
            found += len(eager)
    assert found > 0, "no detections: the comparison would be vacuous"
    graphs = model.graph_info()["graphs"]
    # conf, iou and classes are written before each replay: one graph per (shape, max_det); a frame
    # size seen again runs the graph that letterboxes it too, one per (frame size, max_det)
    keys = [(g["program"], tuple(g["shape"]), g["options"]["max_det"]) for g in graphs]
    assert len(keys) == len(set(keys))
    assert sorted(k[2] for k in keys if k[0] == "pipeline") == [50, 300]
    assert any(k[0] == "letterbox+pipeline" for k in keys)


def test_pipeline_graph_second_replay_and_interleaved_shapes(model):
    images = _images(4)
    calls = [(img, size, _spread_conf(model, img, size)) for img in images[:2] for size in (640, 320)]
    expected = [model(img, imgsz=size, conf=c, color_format="rgb") for img, size, c in calls]
    for _ in range(2):
        for (img, size, c), want in zip(calls, expected, strict=True):
            assert _same(model(img, imgsz=size, conf=c, color_format="rgb", cuda_graph=True), want)
    # one letterboxed pipeline per imgsz (each's first batch of this frame size), then one graph per
    # imgsz that letterboxes the frames itself (measured on the H200: 4)
    programs = sorted(g["program"] for g in model.graph_info()["graphs"])
    assert model.graph_info()["captures"] == 4 and programs == ["letterbox+pipeline"] * 2 + ["pipeline"] * 2


def test_pipeline_graph_batched_and_fp16(model):
    images = _images(5)
    conf = _spread_conf(model, images[0])
    eager = model(images, conf=conf, color_format="rgb", batch=5)
    graphed = model(images, conf=conf, color_format="rgb", batch=5, cuda_graph=True)
    assert all(_same(g, e) for g, e in zip(graphed, eager, strict=True))
    eager_h = model(images[:2], conf=conf, color_format="rgb", half=True)
    graphed_h = model(images[:2], conf=conf, color_format="rgb", half=True, cuda_graph=True)
    assert all(_same(g, e) for g, e in zip(graphed_h, eager_h, strict=True))


def test_threads_serving_the_pipeline_graph_each_get_their_own_results(model):
    images = _images(12)
    confs = [_spread_conf(model, img) for img in images]
    expected = [model(img, conf=c, color_format="rgb") for img, c in zip(images, confs, strict=True)]
    assert sum(len(e) for e in expected) > 0
    model.capture_graph(640)  # the letterboxed pipeline: each frame size's first batch
    sizes = {img.shape[:2] for img in images}

    def work(worker: int, errors: list[str]) -> None:
        stream = torch.cuda.Stream() if worker % 2 else torch.cuda.current_stream()
        stream.wait_stream(torch.cuda.default_stream())
        with torch.cuda.stream(stream):
            for step in range(8):
                i = (worker + 5 * step) % len(images)
                r = model(images[i], conf=confs[i], color_format="rgb", cuda_graph=True)
                if not _same(r, expected[i]):
                    errors.append(f"worker {worker}: wrong detections for image {i}")

    assert _serve_concurrently(work) == []
    info = model.graph_info()  # and from its second on, one graph per frame size, captured while others serve
    programs = sorted(g["program"] for g in info["graphs"])
    assert info["captures"] == 1 + len(sizes) and programs == ["letterbox+pipeline"] * len(sizes) + ["pipeline"]


def test_postprocessing_on_cuda_never_waits_for_the_device(model):
    from libreyolo.ops.letterbox import LetterboxMeta

    x = _probe_inputs(model, sizes=(640,))[-1]
    metas = [LetterboxMeta((480, 640), 1.0, (0.0, 0.0))]
    kw = {"conf": 0.01, "iou": 0.45, "max_det": 300}
    model.pipeline_forward(x, metas, True, **kw)  # capture (captures synchronise) and Triton compiles
    model.pipeline_forward(x, metas, False, **kw)
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        graphed = model.pipeline_forward(x, metas, True, **kw)
        eager = model.pipeline_forward(x, metas, False, **kw)
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    assert bit_equal(graphed["detections"], eager["detections"]) and torch.equal(graphed["counts"], eager["counts"])


def test_dense_checkpoint_graph_equals_eager_and_postprocessing_is_fast():
    import os
    import time
    from pathlib import Path

    from libreyolo import LibreYOLO

    # the shared folder: LIBREYOLO_SHARED_DIR (the GPU machine's copy), else ../shared beside the checkout
    shared = Path(os.environ.get("LIBREYOLO_SHARED_DIR") or Path(__file__).resolve().parents[2] / "shared")
    path = shared / "bench" / "dense-yolo9t.pt"
    if not path.is_file():
        pytest.skip(f"{path} not found (the dense benchmark checkpoint; set LIBREYOLO_SHARED_DIR)")
    model = LibreYOLO(path, device="cuda")
    img = _images(1)[0]
    # max_nms 1000 keeps 59 boxes (the top 1,000 candidates crowd a few places), the others 300
    for kw in ({}, {"max_nms": 1000}, {"conf": 0.5, "iou": 0.3}, {"batch": 8}):
        src = [img] * 8 if "batch" in kw else img
        eager = model(src, color_format="rgb", **kw)
        graphed = model(src, color_format="rgb", cuda_graph=True, **kw)
        pairs = zip(graphed, eager, strict=True) if "batch" in kw else [(graphed, eager)]
        assert all(len(e) > 50 and _same(g, e) for g, e in pairs), kw
    assert len(eager[0]) == 300
    from libreyolo.ops.letterbox import LetterboxMeta
    from libreyolo.ops.postprocess import detect_padded, pack_params

    pred = model._forward(torch.rand(1, 3, 640, 640, device="cuda"))["predictions"]
    params = pack_params([LetterboxMeta((640, 640), 1.0, (0.0, 0.0))], conf=0.25, iou=0.45, nc=80, device="cuda")
    for _ in range(3):
        detect_padded(pred, params, max_det=300)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        detect_padded(pred, params, max_det=300)
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t) / 20 * 1e3
    print(f"dense eager on-device postprocess: {ms:.3f} ms per image")  # the issue's target: at most 1 ms
    model.release_graphs()
