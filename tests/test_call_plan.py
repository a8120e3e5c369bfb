"""The call plan (libreyolo.engine.plan): options resolved once per (options, model settings), cached,
and read by the batch loop, which decides nothing again. CPU only: graphs through the emulated backend."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from libreyolo.engine.plan import COMPILED, EAGER, GRAPHED, PIPELINE, CallPlan, PlanCache, freeze
from libreyolo.errors import ArgumentError
from libreyolo.graphs import EmulatedGraphBackend
from libreyolo.graphs.parity import seeded_model

IMGSZ = 64
FRAME = np.full((48, 64, 3), 114, np.uint8)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the test machine is shared; intra-op threads only add contention
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model(one_thread):
    m = seeded_model("yolo9", "t", device="cpu")
    m.set_graph_backend(EmulatedGraphBackend())
    return m


def _counting(monkeypatch, model, name):
    """Wrap ``model.<name>`` (an instance attribute shadowing the method) and count its calls."""
    calls = []
    real = getattr(model, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(model, name, counted, raising=False)
    return calls


def test_a_plan_is_frozen_hashable_and_cached_per_options(model):
    plan = model.plan(imgsz=IMGSZ, conf=0.3)
    assert isinstance(plan, CallPlan) and plan.executor == EAGER and plan.imgsz == IMGSZ
    assert plan.batch == model.default_batch and plan.dtype == torch.float32 and plan.task_options.conf == 0.3
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.imgsz = 32
    before = model.plan_info()
    again = model.plan(imgsz=IMGSZ, conf=0.3)
    assert again is plan and model.plan_info()["hits"] == before["hits"] + 1
    other = model.plan(imgsz=IMGSZ, conf=0.4)
    assert other != plan and hash(other) != hash(plan) and {plan: 1, other: 2}[model.plan(imgsz=IMGSZ, conf=0.3)] == 1
    # the key keeps types apart: conf=1 is a valid plan, conf=True is still refused after it
    assert model.plan(imgsz=IMGSZ, conf=1).task_options.conf == 1.0
    with pytest.raises(ArgumentError, match="got True"):
        model.plan(imgsz=IMGSZ, conf=True)
    listed = model.plan(imgsz=IMGSZ, classes=[0, 1])  # an unhashable value: the canonical key
    assert model.plan(imgsz=IMGSZ, classes=[0, 1]) is listed and model.plan(imgsz=IMGSZ, classes=[0]) != listed
    assert freeze(True) != freeze(1) and freeze([1, 2]) != freeze((1, 2)) and freeze({"a": [1]}) == freeze({"a": [1]})


def test_wrong_options_raise_every_time_and_are_never_cached(model):
    n = model.plan_info()["plans"]
    for _ in range(2):
        with pytest.raises(ArgumentError):
            model.plan(imgsz=IMGSZ, conf=2.0)
        with pytest.raises(ArgumentError):
            model.plan(imgsz=IMGSZ, nonsense=1)
    assert model.plan_info()["plans"] == n


def test_the_executor_follows_the_model_settings(model, monkeypatch):
    assert model.plan(imgsz=IMGSZ).executor == EAGER
    assert model.plan(imgsz=IMGSZ, cuda_graph=True).executor == PIPELINE  # emulated backend: any device
    monkeypatch.setattr(type(model.family), "SUPPORTS_PIPELINE_GRAPH", False)
    assert model.plan(imgsz=IMGSZ, cuda_graph=True).executor == GRAPHED  # the family's switch is part of the key
    monkeypatch.undo()
    model.compile()
    try:
        assert model.plan(imgsz=IMGSZ).executor == COMPILED  # planned, not compiled: nothing ran
    finally:
        model.compile(False)
    assert model.plan(imgsz=IMGSZ).executor == EAGER
    model.half()  # the default precision is part of the key: float16 on the CPU is refused, then allowed again
    try:
        with pytest.raises(ArgumentError, match="half=True"):
            model.plan(imgsz=IMGSZ)
    finally:
        model.float()
    assert model.plan(imgsz=IMGSZ).dtype == torch.float32


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_repeated_predicts_decide_once(model, monkeypatch, cuda_graph):
    """The executor and the pipeline's availability are decided when a plan is made, never per call or
    per batch (mutation, tried: calling ``_choose_executor`` once per batch in ``_start_chunk`` makes it 7)."""
    chosen = _counting(monkeypatch, model, "_choose_executor")
    asked = _counting(monkeypatch, model, "pipeline_unavailable")
    kw = {"imgsz": IMGSZ, "conf": 0.01, "batch": 1, "cuda_graph": cuda_graph, "max_det": 7}
    first = model.predict([FRAME, FRAME], **kw)  # two batches of one image
    for _ in range(2):
        again = model.predict([FRAME, FRAME], **kw)
        assert all(torch.equal(a.boxes.xyxy, b.boxes.xyxy) for a, b in zip(first, again, strict=True))
    assert len(chosen) == 1 and len(asked) == (1 if cuda_graph else 0)


def test_enqueue_and_predict_share_a_plan(model):
    plan = model.plan(imgsz=IMGSZ, conf=0.2, batch=2)
    hits = model.plan_info()["hits"]
    results = model.enqueue([FRAME, FRAME], imgsz=IMGSZ, conf=0.2, batch=2)()
    assert len(results) == 2 and model.plan_info()["hits"] == hits + 1
    assert model.plan(imgsz=IMGSZ, conf=0.2, batch=2) is plan


def test_batcher_requests_are_grouped_by_their_plan(model):
    from libreyolo.serve import Batcher

    with Batcher(model, max_batch=2, max_wait_ms=0, imgsz=IMGSZ, conf=0.2) as batcher:
        _, key, call = batcher._request_options({"max_det": 5})
        assert isinstance(key[0], CallPlan) and key[0] is model.plan(imgsz=IMGSZ, conf=0.2, max_det=5, batch=2)
        assert call == {"imgsz": IMGSZ, "conf": 0.2, "max_det": 5}
        assert batcher._request_options({"max_det": 5})[1] == key
        assert batcher._request_options({"max_det": 6})[1] != key
        assert len(batcher.predict(FRAME).boxes.conf) == len(model.predict(FRAME, imgsz=IMGSZ, conf=0.2).boxes.conf)
        with pytest.raises(ArgumentError):
            batcher.predict(FRAME, conf=-1)


def test_capture_graph_checks_its_options_as_predict_does(model):
    with pytest.raises(ArgumentError) as by_predict:
        model.plan(imgsz=IMGSZ, cuda_graph=True, max_det=0)
    with pytest.raises(ArgumentError) as by_capture:
        model.capture_graph(IMGSZ, max_det=0)
    assert str(by_capture.value) == str(by_predict.value)


def test_the_cache_keeps_the_newest_plans():
    cache = PlanCache(size=2)
    made = []

    def make(n):
        def build():
            made.append(n)
            return n
        return build

    for n in (1, 2, 1, 3, 1):
        cache.get(n, make(n))
    assert made == [1, 2, 3, 1] and len(cache) == 2 and (cache.hits, cache.misses) == (1, 4)


def test_the_model_declares_its_parts_and_calls_create_none(model):
    """The facade's parts exist from construction (no attribute made behind its back by a call; mutation
    tried: the staging pool made with ``__dict__.setdefault`` again adds ``_staging`` here)."""
    fresh = seeded_model("yolo9", "t", device="cpu")
    declared = set(vars(fresh))
    assert {"_inference", "_calls", "_quant", "_train_graph", "_graphs", "_compilation", "_tracking"} <= declared
    fresh.set_graph_backend(EmulatedGraphBackend())
    fresh.predict(FRAME, imgsz=IMGSZ, batch=1)
    fresh.predict([FRAME, FRAME], imgsz=IMGSZ, batch=2, cuda_graph=True, workers=1)
    fresh.capture_graph(IMGSZ, batch=1)
    fresh._staging_pool()
    fresh.reset_tracks()
    fresh.quant_info()
    fresh.train_graph_info()
    assert set(vars(fresh)) == declared


def test_call_state_alone_and_in_a_copy():
    import copy

    from libreyolo.engine.predictor import CallState

    state = CallState()
    assert state.staging() is state.staging() and len(state.plans) == 0 and not state.frame_sightings
    state.plans.get("k", lambda: "plan")
    state.frame_sightings["frame"] = 2
    other = copy.deepcopy(state)  # a copied model runs with its own plans and buffers
    assert len(other.plans) == 0 and not other.frame_sightings and other.staging() is not state.staging()
