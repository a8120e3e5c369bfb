# ruff: noqa: F811  (the shared pytest fixtures are imported from tests/serve_helpers.py by name)
"""Serving: the micro-batching Batcher (the HTTP service and its page: test_serve_http.py).

Exactness on the CPU is bit for bit with oneDNN off (tests/serve_helpers.py says why).
"""
from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.errors import ArgumentError, ImageError
from libreyolo.serve import Batcher, BatcherClosed
from tests.serve_helpers import (  # noqa: F401  (fixtures: pytest finds them by name)
    CONF,
    IMGSZ,
    Gated,
    frames,
    jpeg,
    model,
    no_onednn,
    one_thread,
    same,
)


# --- Batcher --------------------------------------------------------------------------------------
@pytest.mark.parametrize("overlap", [False, True])
def test_concurrent_callers_each_get_exactly_their_direct_result_in_shared_batches(model, frames, overlap):
    options = [{}, {}, {}, {"max_det": 1}]  # every 4th caller asks for other options: never batched with the rest
    want = {(i, j): model(frames[i], imgsz=IMGSZ, conf=CONF, **options[j]) for i in range(4) for j in (0, 3)}
    got: list = [None] * 32
    start = threading.Barrier(32)
    with Batcher(model, max_batch=8, max_wait_ms=500, overlap=overlap, imgsz=IMGSZ, conf=CONF) as batcher:
        def call(k: int) -> None:
            start.wait(30)
            got[k] = batcher(frames[k % 4], **options[k % 4])

        threads = [threading.Thread(target=call, args=(k,)) for k in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        stats = batcher.stats()
    for k in range(32):
        assert same(got[k], want[(k % 4, 3 if k % 4 == 3 else 0)]), k
    assert stats["requests"] == stats["images"] == 32 and stats["failed"] == 0
    assert stats["mean_batch"] > 1 and stats["batches"] < 32
    assert set(stats["batches_by_size"]) <= {1, 2, 4, 8}
    assert stats["latency_ms_p99"] >= stats["latency_ms_p50"] > 0


def test_different_options_are_never_batched_together(model, frames):
    # max_det=1 keeps fewer boxes than the default: a request run with the other's options would show it
    low, high = model(frames[0], imgsz=IMGSZ, conf=CONF), model(frames[0], imgsz=IMGSZ, conf=CONF, max_det=1)
    assert len(low.boxes) > len(high.boxes)
    gate = Gated(model, hold=True)
    with Batcher(gate, max_batch=4, max_wait_ms=0, imgsz=IMGSZ, conf=CONF) as batcher:
        first = batcher.submit(frames[0])  # occupies the worker while the others queue
        assert gate.entered.wait(30)
        futures = [batcher.submit(frames[0], **({"max_det": 1} if k % 2 else {})) for k in range(4)]
        gate.release.set()
        results = [f.result(60) for f in futures]
        stats = batcher.stats()
    assert same(first.result(), low)
    assert all(same(r, high if k % 2 else low) for k, r in enumerate(results))
    assert stats["batches"] == 3 and stats["batches_by_size"] == {1: 1, 2: 2}


def test_a_bad_image_fails_alone(model, frames):
    poison = frames[3].copy()
    poison[0, 0] = (1, 2, 3)  # decodes fine: it fails inside the batch's predict()
    want = [model(f, imgsz=IMGSZ, conf=CONF) for f in frames[:3]]
    gate = Gated(model, hold=True, poison=poison)  # the batch holds the array as it came (BGR)
    with Batcher(gate, max_batch=8, max_wait_ms=0, imgsz=IMGSZ, conf=CONF) as batcher:
        with pytest.raises(ImageError, match="corrupt or not an image"):
            batcher.submit(b"GIF89a not really")  # refused in the caller: it never reaches a batch
        blocker = batcher.submit(frames[0])
        assert gate.entered.wait(30)
        good = [batcher.submit(f) for f in frames[:3]]
        bad = batcher.submit(poison)
        more = batcher.submit(frames[1])
        gate.release.set()
        with pytest.raises(ValueError, match="poisoned"):
            bad.result(60)
        assert all(same(f.result(60), w) for f, w in zip(good, want, strict=True))
        assert same(more.result(60), want[1]) and same(blocker.result(60), want[0])
        stats = batcher.stats()
    assert stats["retried_batches"] == 1 and stats["failed"] == 1 and stats["requests"] == 6


class Logged(Gated):
    """The model through enqueue(), logging ("start" | "read", images) in order; the first start can
    be held (``hold``), and a batch holding ``poison`` raises when it is read back."""

    def __init__(self, model, **kw) -> None:
        super().__init__(model, **kw)
        self.log: list[tuple[str, int]] = []

    def enqueue(self, images, **kw):
        self.log.append(("start", len(images)))
        self.entered.set()
        assert self.release.wait(30), "the test never released enqueue()"
        finish = self._model.enqueue(images, **kw)

        def read():
            self.log.append(("read", len(images)))
            if self.poison is not None and any(np.array_equal(i, self.poison) for i in images):
                raise ValueError("poisoned image")
            return finish()
        return read


def test_enqueue_starts_one_batch_and_its_call_returns_what_predict_returns(model, frames):
    finish = model.enqueue(frames[:3], imgsz=IMGSZ, conf=CONF, batch=4)
    got = finish()
    want = model.predict(frames[:3], imgsz=IMGSZ, conf=CONF, batch=4)
    assert len(got) == 3 and all(same(g, w) for g, w in zip(got, want, strict=True))
    with pytest.raises(ArgumentError, match="one batch of at most batch=2 images, got 3 images"):
        model.enqueue(frames[:3], imgsz=IMGSZ, batch=2)
    with pytest.raises(ArgumentError, match="conf"):
        model.enqueue(frames[:1], conf=2.0)
    with pytest.raises(ImageError):
        model.enqueue([frames[0], b"not an image"])


def test_overlap_starts_the_next_batch_while_one_runs_and_hands_out_a_finished_one_first(model, frames,
                                                                                        monkeypatch):
    from libreyolo.serve import batcher as batcher_mod

    want = [model(frames[k % 4], imgsz=IMGSZ, conf=CONF) for k in range(4)]

    def run(ready):  # ready(log) -> whether the batch started last is done
        logged = Logged(model, hold=True)
        monkeypatch.setattr(batcher_mod.Launched, "ready", lambda self: ready(logged.log))
        with Batcher(logged, max_batch=2, max_wait_ms=0, in_flight=1, overlap=True, imgsz=IMGSZ,
                     conf=CONF) as batcher:
            first = batcher.submit(frames[0])
            assert logged.entered.wait(30)  # the first batch (of one) is being started; three more queue
            rest = [batcher.submit(frames[k]) for k in range(1, 4)]
            logged.release.set()
            got = [first.result(60)] + [f.result(60) for f in rest]
            stats = batcher.stats()
        assert all(same(g, w) for g, w in zip(got, want, strict=True)) and stats["overlap"]
        return logged.log

    # a batch still on the device: the next one starts before it is read back
    busy = run(lambda log: sum(what == "start" for what, _ in log) >= 3)  # running until a third batch started
    assert busy == [("start", 1), ("start", 2), ("read", 1), ("start", 1), ("read", 2), ("read", 1)]
    # a finished batch (always so on the CPU, where enqueue() runs it at once) is read back first
    assert run(lambda log: True) == [("start", 1), ("read", 1), ("start", 2), ("read", 2), ("start", 1),
                                      ("read", 1)]


def test_overlap_a_batch_that_fails_when_read_back_fails_only_its_bad_image(model, frames):
    poison = frames[3].copy()
    poison[0, 0] = (1, 2, 3)
    want = [model(f, imgsz=IMGSZ, conf=CONF) for f in frames[:3]]
    logged = Logged(model, hold=True, poison=poison)
    with Batcher(logged, max_batch=8, max_wait_ms=0, overlap=True, imgsz=IMGSZ, conf=CONF) as batcher:
        blocker = batcher.submit(frames[0])
        assert logged.entered.wait(30)
        good = [batcher.submit(f) for f in frames[:3]]
        bad = batcher.submit(poison)
        logged.release.set()
        with pytest.raises(ValueError, match="poisoned"):  # Logged.predict (the retry of each image) raises too
            bad.result(60)
        assert all(same(f.result(60), w) for f, w in zip(good, want, strict=True))
        assert same(blocker.result(60), want[0])
        stats = batcher.stats()
    assert stats["retried_batches"] == 1 and stats["failed"] == 1
    with pytest.raises(ArgumentError, match="overlap must be"):
        Batcher(model, overlap="sometimes")


def test_overlap_is_on_by_default_for_cuda_graphs_on_cuda_only(model):
    class OnCuda:  # what the Batcher reads of a model at construction: where it runs, and enqueue()
        device, names, imgsz = torch.device("cuda", 0), model.names, model.imgsz
        family = model.family

        def __init__(self, with_enqueue: bool) -> None:
            if with_enqueue:
                self.enqueue = model.enqueue

        def predict_options(self, **kw):
            return model.predict_options(**kw)

        def plan(self, **kw):
            return model.plan(**kw)

    cases = ((OnCuda(True), True, True), (OnCuda(True), False, False), (OnCuda(False), True, False),
             (model, "auto", False))  # cuda_graph=True on a CPU model fails at construction (test_serve_abuse.py)
    for target, graphs, want in cases:
        with Batcher(target, cuda_graph=graphs) as batcher:
            assert (batcher.stats()["overlap"], batcher.stats()["in_flight"]) == (want, 1), (target, graphs)
    with pytest.raises(ArgumentError, match="does not have; pass overlap=False"):
        Batcher(OnCuda(False), overlap=True)


def test_bytes_paths_and_async_callers_get_their_direct_results(model, frames, tmp_path):
    paths = []
    for i, f in enumerate(frames):
        paths.append(tmp_path / f"{i}.jpg")
        paths[-1].write_bytes(jpeg(f))
    want = [model(p, imgsz=IMGSZ, conf=CONF) for p in paths]

    async def main(batcher):
        return await asyncio.gather(*(batcher.apredict(p.read_bytes() if i % 2 else p) for i, p in enumerate(paths)))

    with Batcher(model, max_batch=4, max_wait_ms=200, imgsz=IMGSZ, conf=CONF) as batcher:
        got = asyncio.run(main(batcher))
    assert all(same(g, w) for g, w in zip(got, want, strict=True))
    assert got[0].path == str(paths[0]) and got[1].path is None


def test_wrong_settings_and_options_are_clear_errors(model, frames):
    with pytest.raises(ArgumentError, match="max_batch must be an integer from 1 to"):
        Batcher(model, max_batch=0)
    with pytest.raises(ArgumentError, match="max_wait_ms must be a number from 0"):
        Batcher(model, max_wait_ms=-1)
    with pytest.raises(ArgumentError, match="conf must be a number from 0 to 1, got 7"):
        Batcher(model, conf=7)
    with Batcher(model, max_batch=2, imgsz=IMGSZ) as batcher:
        with pytest.raises(ArgumentError, match="batch cannot be set"):
            batcher.submit(frames[0], batch=4)
        with pytest.raises(ArgumentError, match="unknown predict option"):
            batcher.submit(frames[0], confidence=0.3)
        with pytest.raises(ImageError, match="one image"):
            batcher.submit([frames[0], frames[1]])
    with pytest.raises(BatcherClosed, match="closed"):
        batcher.submit(frames[0])


def test_close_finishes_the_queued_requests_without_waiting_for_the_batch_to_fill(model, frames):
    batcher = Batcher(model, max_batch=8, max_wait_ms=10_000, imgsz=IMGSZ, conf=CONF)
    futures = [batcher.submit(f) for f in frames[:3]]
    t0 = time.perf_counter()
    batcher.close(timeout=60)
    assert time.perf_counter() - t0 < 9  # the 10 s wait for a full batch was cut short
    assert all(f.done() and f.exception() is None for f in futures)
    assert same(futures[2].result(), model(frames[2], imgsz=IMGSZ, conf=CONF))


def test_in_flight_batches_run_at_once_and_each_caller_still_gets_its_result(model, frames):
    inside, both = threading.Semaphore(0), threading.Event()
    active = [0]
    lock = threading.Lock()

    class TwoAtOnce(Gated):
        def predict(self, images, **kw):  # returns only once two predicts were inside at the same time
            with lock:
                active[0] += 1
                if active[0] == 2:
                    both.set()
            inside.release()
            try:
                assert both.wait(30), "the second batch never started while the first ran"
                return self._model.predict(images, **kw)
            finally:
                with lock:
                    active[0] -= 1

    want = [model(f, imgsz=IMGSZ, conf=CONF) for f in frames]
    with Batcher(TwoAtOnce(model), max_batch=2, max_wait_ms=0, in_flight=2, imgsz=IMGSZ, conf=CONF) as batcher:
        first = batcher.submit(frames[0])
        assert inside.acquire(timeout=30)  # the first batch is running (and waiting for a second)
        rest = [batcher.submit(f) for f in frames[1:]]
        got = [first.result(60)] + [f.result(60) for f in rest]
        stats = batcher.stats()
    assert both.is_set() and stats["in_flight"] == 2
    assert all(same(g, w) for g, w in zip(got, want, strict=True))
    with Batcher(model, max_batch=2) as single:  # the default on the CPU: one batch at a time
        assert single.stats()["in_flight"] == 1
    with pytest.raises(ArgumentError, match="in_flight must be an integer from 1 to 8"):
        Batcher(model, in_flight=0)
    with pytest.raises(ArgumentError, match="workers cannot be set"):
        Batcher(model, workers=4)


def test_warmup_runs_every_size_three_times_and_ends_compile_workers_only_after_compiling(model, frames,
                                                                                        monkeypatch):
    """Twice: frames of one size go into the graph from their second batch (docs/graphs.md); then once
    timed (the graphs captured). With compile on, the warm-up compiled every size, so Inductor's
    workers are ended (they slow serving)."""
    from libreyolo.engine import compiled as compiled_mod

    ended, sizes = [], []
    monkeypatch.setattr(compiled_mod, "end_compile_workers", lambda: ended.append(1) or True)
    monkeypatch.setattr(compiled_mod, "torch_compile", lambda module, mode: module)

    class Counting(Gated):
        def predict(self, images, **kw):
            sizes.append(len(images))
            return super().predict(images, **kw)

    with Batcher(Counting(model), max_batch=4, imgsz=IMGSZ, conf=CONF) as batcher:
        batcher.warmup(frames[0])
        timed = batcher.stats()["batch_ms_by_size"]
    assert sorted(sizes) == [1, 1, 1, 2, 2, 2, 4, 4, 4] and ended == []
    assert set(timed) == {1, 2, 4} and all(ms > 0 for ms in timed.values())
    compiled = LibreYOLO("LibreYOLO9t-shapes.pt").compile(True)
    with Batcher(compiled, max_batch=1, imgsz=IMGSZ, conf=CONF) as batcher:
        batcher.warmup(frames[0])
    assert ended == [1] and compiled.compile_info()["copies"][0]["compiled"]


def test_the_batch_taken_is_the_count_that_runs_the_most_images_per_second(model, frames):
    with Batcher(model, max_batch=32, imgsz=IMGSZ, conf=CONF) as batcher:
        def take(n: int) -> int:  # the policy's choice, no batch run yet
            return batcher.policy.take(n, batcher.max_batch, 0)

        assert take(17) == 17  # no batch times yet: all of them
        for size, ms in {1: 2.9, 2: 3.3, 4: 3.5, 8: 4.9, 16: 7.1, 32: 13.2}.items():  # the H200's shape
            batcher._timed(size, ms / 1e3)
        # 17 padded to 32 runs 1.3 images/ms, 16 alone 2.3; 31 of 32 beat 16 of 16; 3 padded to 4 beat 2
        assert [take(n) for n in (1, 3, 5, 17, 24, 31, 32, 40)] == [1, 3, 4, 16, 16, 31, 32, 32]
    # in a queue: 5 requests wait behind a held batch; with a padded 8 as dear as four 4s, a 4 and a 1 run
    gated = Gated(model, hold=True)
    sizes: list[int] = []
    gated_predict = gated.predict
    gated.predict = lambda images, **kw: sizes.append(len(images)) or gated_predict(images, **kw)
    want = [model(frames[k % 4], imgsz=IMGSZ, conf=CONF) for k in range(6)]
    with Batcher(gated, max_batch=8, max_wait_ms=0, in_flight=1, imgsz=IMGSZ, conf=CONF) as batcher:
        for size, seconds in {1: 1.0, 2: 1.0, 4: 1.0, 8: 4.0}.items():
            batcher._timed(size, seconds)
        first = batcher.submit(frames[0])
        assert gated.entered.wait(30)
        rest = [batcher.submit(frames[k % 4]) for k in range(1, 6)]
        gated.release.set()
        got = [first.result(60)] + [f.result(60) for f in rest]
    assert sizes == [1, 4, 1]
    assert all(same(g, w) for g, w in zip(got, want, strict=True))


def test_a_lone_request_does_not_wait_for_company_that_is_not_coming(model, frames):
    with Batcher(model, max_batch=8, max_wait_ms=5_000, imgsz=IMGSZ, conf=CONF) as batcher:
        t0 = time.perf_counter()
        for f in frames[:2]:  # one client, one request after the other: batches of one
            batcher(f)
        took = time.perf_counter() - t0
        stats = batcher.stats()
    assert took < 5, f"a lone request waited for max_wait_ms ({took:.1f} s for two requests)"
    assert stats["batches_by_size"] == {1: 2} and stats["queue_wait_ms_p50"] < 1000


# --- CUDA -----------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("in_flight, overlap", [(2, False), (1, True)])
def test_gpu_batcher_results_are_their_own_images_results_at_a_padded_size(frames, in_flight, overlap):
    """16 threads on CUDA (graphs, two batches in flight, each uploading through pinned staging on its
    own side stream while the compute stream is held up): every result is bit for bit what its own
    image gives in a batch of one of the padded sizes. An upload not waited for, a staging buffer
    reused too early or a result handed to another caller would break it."""
    model = LibreYOLO("LibreYOLO9t-shapes.pt", device="cuda")
    kw = {"imgsz": 320, "conf": CONF, "cuda_graph": True}
    sizes = (1, 2, 4)
    want = {(i, s): model.predict([f] * s, batch=s, workers=0, **kw)[0] for i, f in enumerate(frames) for s in sizes}
    real = model._preprocessor

    def slow(imgsz):
        pre = real(imgsz)

        def run(tensors, **k):
            torch.cuda._sleep(5_000_000)  # a device-side spin on the compute stream: uploads run ahead
            return pre(tensors, **k)
        return run

    model._preprocessor = slow
    got: list = []
    with Batcher(model, max_batch=4, max_wait_ms=5, in_flight=in_flight, overlap=overlap, **kw) as batcher:
        def client(c: int) -> None:
            for r in range(6):
                k = (c + r) % 4
                got.append((k, batcher(frames[k])))
        threads = [threading.Thread(target=client, args=(c,)) for c in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        stats = batcher.stats()
    assert len(got) == 96 and stats["mean_batch"] > 1
    assert all(any(same(r, want[(k, s)]) for s in sizes) for k, r in got)
