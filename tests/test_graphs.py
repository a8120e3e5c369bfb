"""CUDA-graph runner logic on the CPU: modes, errors, graph_info, invalidation, LRU, failures, threads.

The CUDA capture layer is replaced by :class:`EmulatedGraphBackend`, which replays by calling
the function into the same static output buffer, so the runner's real key, lock, LRU,
invalidation and copy-out code runs here. tests/test_graphs_gpu.py checks real CUDA graphs.
"""
from __future__ import annotations

import copy
import json
import threading
import warnings

import pytest
import torch
from torch import nn

from libreyolo import SAMPLE_IMAGE
from libreyolo.errors import ArgumentError
from libreyolo.graphs import (
    AUTO_CAPTURE_AT,
    EmulatedGraphBackend,
    GraphCaptureError,
    GraphRunner,
    GraphUnavailableError,
)
from libreyolo.graphs.parity import check_family_size, seeded_model
from libreyolo.graphs.parity import main as parity_main

IMGSZ = 64


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the test machine is shared; intra-op threads only add contention
    yield
    torch.set_num_threads(before)


@pytest.fixture
def backend():
    return EmulatedGraphBackend()


@pytest.fixture
def model(backend):
    m = seeded_model("yolo9", "t", device="cpu")
    m.set_graph_backend(backend)
    return m


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x))


def tiny_runner(backend, **kw) -> tuple[GraphRunner, nn.Module]:
    net = Tiny().eval()
    return GraphRunner(net, lambda x: {"out": net(x)}, backend=backend, **kw), net


def x_of(size: int, seed: int = 0, batch: int = 1) -> torch.Tensor:
    return torch.rand(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


def shapes(info: dict) -> list[list[int]]:
    return [g["shape"] for g in info["graphs"]]


# --- modes and errors -------------------------------------------------------------------------
def test_false_runs_eager_and_captures_nothing(model, backend):
    model._forward(x_of(IMGSZ), cuda_graph=False)
    assert backend.capture_attempts == 0 and backend.replays == 0


def test_true_captures_each_shape_the_first_time_it_is_seen(model, backend):
    x = x_of(IMGSZ)
    first = model._forward(x, cuda_graph=True)
    assert backend.captures == [(1, 3, IMGSZ, IMGSZ)]
    again = model._forward(x, cuda_graph=True)
    assert len(backend.captures) == 1 and backend.replays == 2
    model._forward(x_of(32), cuda_graph=True)
    assert len(backend.captures) == 2
    eager = model._forward(x)
    assert torch.equal(first["predictions"], eager["predictions"])
    assert torch.equal(again["predictions"], eager["predictions"])


def test_auto_captures_at_the_second_sighting(model, backend):
    assert AUTO_CAPTURE_AT == 2
    x = x_of(IMGSZ)
    model._forward(x, cuda_graph="auto")
    info = model.graph_info()
    assert backend.capture_attempts == 0 and info["pending"][0]["sightings"] == 1
    out = model._forward(x, cuda_graph="auto")
    assert len(backend.captures) == 1 and backend.replays == 1
    assert torch.equal(out["predictions"], model._forward(x)["predictions"])
    assert model.graph_info()["pending"] == []


def test_other_mode_values_are_a_value_error(model):
    for bad in ("yes", 1, None, "AUTO"):
        with pytest.raises(ValueError, match="cuda_graph"):
            model(SAMPLE_IMAGE, imgsz=IMGSZ, cuda_graph=bad)


def test_family_not_switched_on_raises_not_implemented_naming_it(model, monkeypatch):
    monkeypatch.setattr(type(model.family), "SUPPORTS_CUDA_GRAPH", False)
    for mode in (True, "auto"):
        with pytest.raises(NotImplementedError, match="yolo9"):
            model._forward(x_of(IMGSZ), cuda_graph=mode)
    with pytest.raises(NotImplementedError, match="yolo9"):
        model.capture_graph(IMGSZ)
    assert model.graph_info()["supported"] is False


def test_true_without_cuda_is_a_clear_error_not_an_eager_run():
    m = seeded_model("yolo9", "t", device="cpu")  # the real CUDA backend
    with pytest.raises(GraphUnavailableError, match="needs a CUDA device") as err:
        m(SAMPLE_IMAGE, imgsz=IMGSZ, cuda_graph=True)
    assert isinstance(err.value, ValueError) and "cuda_graph='auto'" in str(err.value)
    with pytest.raises(GraphUnavailableError):
        m.capture_graph(IMGSZ)


def test_auto_without_cuda_runs_eager_and_records_the_reason_once():
    m = seeded_model("yolo9", "t", device="cpu")
    x = x_of(IMGSZ)
    for _ in range(3):
        assert torch.equal(m._forward(x, cuda_graph="auto")["predictions"], m._forward(x)["predictions"])
    fallbacks = m.graph_info()["eager_fallbacks"]
    assert len(fallbacks) == 1 and fallbacks[0]["count"] == 3
    assert "CUDA" in fallbacks[0]["reason"] or "cpu" in fallbacks[0]["reason"]


def test_graphed_predict_returns_the_eager_results(model):
    eager = model(SAMPLE_IMAGE, imgsz=IMGSZ, conf=0.5)
    for _ in range(2):
        graphed = model(SAMPLE_IMAGE, imgsz=IMGSZ, conf=0.5, cuda_graph=True)
        assert torch.equal(graphed.boxes.xyxy, eager.boxes.xyxy)
        assert torch.equal(graphed.boxes.conf, eager.boxes.conf)


def test_capture_graph_ahead_of_time_serves_the_first_request(model, backend):
    info = model.capture_graph(IMGSZ, batch=2)
    assert info["shape"] == [2, 3, IMGSZ, IMGSZ] and info["dtype"] == "float32" and info["replays"] == 0
    assert info["program"] == "pipeline" and info["options"] == {"max_det": 300, "max_nms": 30000}
    assert model.capture_graph(IMGSZ, batch=2)["shape"] == info["shape"]  # already there: no recapture
    assert len(backend.captures) == 1
    model([SAMPLE_IMAGE, SAMPLE_IMAGE], imgsz=IMGSZ, conf=0.4, classes=[0, 5], cuda_graph=True)
    assert len(backend.captures) == 1 and model.graph_info()["graphs"][0]["replays"] == 1
    with pytest.raises(ArgumentError):
        model.capture_graph(IMGSZ, dtype=torch.int8)


def test_capture_graph_captures_the_forward_where_the_pipeline_is_not_supported(model, backend, monkeypatch):
    monkeypatch.setattr(type(model.family), "SUPPORTS_PIPELINE_GRAPH", False)
    info = model.capture_graph(IMGSZ, batch=2)
    assert info["program"] == "forward" and "options" not in info
    model._forward(x_of(IMGSZ, batch=2), cuda_graph=True)
    assert len(backend.captures) == 1 and model.graph_info()["graphs"][0]["replays"] == 1
    pipeline = model.graph_info()["pipeline"]
    assert pipeline["active"] is False and "SUPPORTS_PIPELINE_GRAPH" in pipeline["reason"]


# --- graph_info -------------------------------------------------------------------------------
def test_graph_info_has_the_documented_schema(model):
    model._forward(x_of(IMGSZ), cuda_graph=True)
    info = model.graph_info()
    assert json.loads(json.dumps(info)) == info
    assert set(info) == {"family", "supported", "pipeline", "schema", "backend", "max_graphs", "auto_capture_at",
                         "graphs", "captures", "evictions", "invalidations", "last_invalidation", "failures",
                         "eager_fallbacks", "pending"}
    assert info["schema"] == 2 and info["family"] == "yolo9" and info["captures"] == 1
    assert set(info["pipeline"]) == {"supported", "active", "reason"}
    g = info["graphs"][0]
    assert set(g) == {"shape", "dtype", "device", "autocast", "grad_enabled", "inference_mode", "training",
                      "program", "replays", "capture_ms", "outputs"}
    assert g["program"] == "forward"
    assert g["device"] == "cpu" and g["replays"] == 1 and g["outputs"]["predictions"]["dtype"] == "float32"


# --- invalidation -----------------------------------------------------------------------------
def _captured(model) -> None:
    model._forward(x_of(IMGSZ), cuda_graph=True)
    assert len(model.graph_info()["graphs"]) == 1


def _dropped(model, before: int) -> dict:
    info = model.graph_info()
    assert info["graphs"] == [] and info["invalidations"] == before + 1
    return info


@pytest.mark.parametrize("change", ["half", "float64", "load_state_dict_assign", "replace_parameter",
                                    "replace_submodule"])
def test_moving_or_replacing_weights_changes_the_fingerprint_and_drops_graphs(model, change):
    _captured(model)
    runner = model._graph_runner()
    before = runner._watch.fingerprint()
    conv = next(m for m in model.net.modules() if isinstance(m, nn.Conv2d))
    if change == "half":
        model.net.half()  # by hand: model.half() keeps the master fp32 (it selects an fp16 inference copy)
    elif change == "float64":
        model.net.to(torch.float64)
    elif change == "load_state_dict_assign":
        model.net.load_state_dict({k: v.clone() for k, v in model.net.state_dict().items()}, assign=True)
    elif change == "replace_parameter":
        conv.weight = nn.Parameter(conv.weight.detach().clone())
    else:
        name, child = next(iter(model.net.named_children()))
        setattr(model.net, name, copy.deepcopy(child))
    _dropped(model, 0)
    # the graphs were captured on an inference copy, retired with it; the next one reads new tensors
    assert model._graph_runner() is not runner and model._graph_runner()._watch.fingerprint() != before


def test_load_weights_drops_graphs_and_the_recapture_uses_the_new_weights(model):
    x = x_of(IMGSZ)
    _captured(model)
    other = seeded_model("yolo9", "t", seed=7, device="cpu")
    model.load_weights(other.net.state_dict())
    info = _dropped(model, 0)
    assert "in place" in info["last_invalidation"]
    out = model._forward(x, cuda_graph=True)
    assert torch.equal(out["predictions"], other._forward(x)["predictions"])


def test_unrelated_module_registration_keeps_graphs(model):
    _captured(model)
    nn.Sequential(nn.Linear(2, 2))  # registers parameters elsewhere in the process
    info = model.graph_info()
    assert len(info["graphs"]) == 1 and info["invalidations"] == 0


def test_release_graphs_frees_everything(model, backend):
    _captured(model)
    model.release_graphs()
    assert model.graph_info()["graphs"] == []
    _captured(model)
    assert len(backend.captures) == 2


# --- LRU, failures, copy-out, keys ---------------------------------------------------------------
def test_lru_keeps_at_most_max_graphs_and_evicts_the_least_recently_used(backend):
    runner, _ = tiny_runner(backend, max_graphs=2)
    for size in (8, 16, 8, 24):  # 16 is the least recently used when 24 arrives
        runner(x_of(size))
    info = runner.info()
    assert shapes(info) == [[1, 3, 8, 8], [1, 3, 24, 24]] and info["evictions"] == 1
    runner.set_max_graphs(1)
    assert shapes(runner.info()) == [[1, 3, 24, 24]] and runner.info()["evictions"] == 2


def test_max_graphs_is_configurable_and_checked(model):
    assert model.graph_options() == {"max_graphs": 16}
    assert model.graph_options(max_graphs=3) == {"max_graphs": 3}
    assert model.graph_info()["max_graphs"] == 3
    for bad in (0, -1, 2.5, True, "4"):
        with pytest.raises(ArgumentError, match="max_graphs"):
            model.graph_options(max_graphs=bad)


def test_a_failed_capture_disables_only_its_key(backend):
    backend.fail_when = lambda x: x.shape[-1] == 8
    runner, net = tiny_runner(backend)
    with pytest.raises(GraphCaptureError, match="emulated capture failure"):
        runner(x_of(8), True)
    attempts = backend.capture_attempts
    with pytest.raises(GraphCaptureError, match="failed earlier"):  # recorded, not retried
        runner(x_of(8), True)
    assert backend.capture_attempts == attempts
    runner(x_of(16), True)  # other shapes still capture
    out = runner(x_of(8), "auto")  # "auto" falls back to eager for the failed key
    with torch.inference_mode():
        assert torch.equal(out["out"], net(x_of(8)))
    info = runner.info()
    assert [f["shape"] for f in info["failures"]] == [[1, 3, 8, 8]]
    assert "emulated capture failure" in info["failures"][0]["reason"]
    assert any("capture failed" in f["reason"] for f in info["eager_fallbacks"])
    assert shapes(info) == [[1, 3, 16, 16]]
    runner.release()  # forgets the failure: the key is tried again
    backend.fail_when = None
    runner(x_of(8), True)
    assert [1, 3, 8, 8] in shapes(runner.info())


def test_auto_failed_capture_falls_back_to_eager_with_the_reason(backend):
    backend.fail_when = lambda x: True
    runner, net = tiny_runner(backend)
    x = x_of(8)
    runner(x, "auto")
    out = runner(x, "auto")  # second sighting: capture fails, eager result
    assert torch.equal(out["out"], net(x))
    assert runner.info()["failures"] and runner.info()["graphs"] == []


def test_outputs_handed_out_are_not_overwritten_by_later_replays(backend):
    runner, net = tiny_runner(backend)
    a, b = x_of(8, seed=1), x_of(8, seed=2)
    out_a = runner(a)["out"]
    out_b = runner(b)["out"]
    assert torch.equal(out_a, net(a)) and torch.equal(out_b, net(b))


def test_several_outputs_come_back_from_one_copy(backend):
    net = Tiny().eval()

    def fn(x):
        y = net(x)
        return {"f32": y, "f16": y.half()[:, :2], "i64": y.argmax(1), "flag": y.sum((1, 2, 3)) > 0,
                "scalar": y.mean()}

    runner = GraphRunner(net, fn, backend=backend)
    x = x_of(8)
    runner(x)
    out = runner(x)
    ref = fn(x)
    assert list(out) == list(ref)
    for k in ref:
        assert out[k].dtype == ref[k].dtype and torch.equal(out[k], ref[k]), k
    storages = {t.untyped_storage().data_ptr() for t in out.values()}
    assert len(storages) == 1  # views of one fresh buffer: a single device-to-device copy


@pytest.mark.parametrize("context", ["autocast", "grad", "training"])
def test_autocast_grad_mode_and_training_are_part_of_the_key(backend, context):
    runner, net = tiny_runner(backend)
    x = x_of(8)
    with torch.no_grad():
        runner(x)
    if context == "autocast":
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            out = runner(x)
        assert out["out"].dtype == torch.bfloat16
    elif context == "grad":
        runner(x)
    else:
        net.train()
        with torch.no_grad():
            runner(x)
    assert len(backend.captures) == 2


def test_auto_sightings_are_bounded(backend):
    runner, _ = tiny_runner(backend, max_graphs=1)
    for size in range(1, 40):
        runner(x_of(size), "auto")
    assert len(runner.info()["pending"]) == 16 and backend.capture_attempts == 0


# --- threads -----------------------------------------------------------------------------------
def test_concurrent_calls_each_get_their_own_result_and_one_capture_per_key(backend):
    runner, net = tiny_runner(backend)
    inputs = [x_of(8 if i % 2 else 16, seed=i) for i in range(16)]
    with torch.inference_mode():
        expected = [net(x) for x in inputs]
    barrier = threading.Barrier(8)
    wrong: list[int] = []

    def serve(worker: int) -> None:
        barrier.wait()  # all first calls race for the same two new keys
        for step in range(12):
            i = (worker + 3 * step) % len(inputs)
            with torch.inference_mode():
                out = runner(inputs[i])["out"]
            if not torch.equal(out, expected[i]):
                wrong.append(i)

    threads = [threading.Thread(target=serve, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
    assert sorted(backend.captures) == [(1, 3, 8, 8), (1, 3, 16, 16)]
    assert backend.max_overlap == 1 and backend.replays == 8 * 12


def test_replay_holds_its_key_lock_and_the_pool_replay_lock(backend):
    runner, _ = tiny_runner(backend)
    seen = []

    def on_replay(graph):
        entries = {id(e.graph): e for e in runner._table.values()}
        entry = entries[id(graph)]
        others = [e for e in runner._table.values() if e is not entry]
        seen.append((entry.lock.locked(), runner._replay_lock.locked(), [o.lock.locked() for o in others]))

    runner(x_of(8))
    runner(x_of(16))
    backend.on_replay = on_replay
    runner(x_of(8))
    assert seen == [(True, True, [False])]


def test_concurrent_predicts_on_one_model_return_each_callers_result(model):
    import numpy as np
    from PIL import Image

    base = np.asarray(Image.open(SAMPLE_IMAGE).convert("RGB"))
    images = [base, base[:, ::-1].copy(), base[::-1].copy(), base[100:400, 50:600].copy()]
    expected = [model(img, imgsz=IMGSZ, conf=0.5, color_format="rgb") for img in images]
    wrong: list[int] = []

    def serve(worker: int) -> None:
        for step in range(2):
            i = (worker + step) % len(images)
            r = model(images[i], imgsz=IMGSZ, conf=0.5, color_format="rgb", cuda_graph=True)
            if not torch.equal(r.boxes.xyxy, expected[i].boxes.xyxy):
                wrong.append(i)

    threads = [threading.Thread(target=serve, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


# --- the parity harness itself -------------------------------------------------------------------
def test_parity_harness_passes_an_exact_replay():
    rows = check_family_size("yolo9", "t", device="cpu", imgszs=(IMGSZ, 32), backend=EmulatedGraphBackend())
    results = {r["check"]: r["result"] for r in rows}
    assert results.pop("fp16") == "skip" and results.pop("pipeline_fp16") == "skip"
    assert set(results.values()) == {"pass"}, rows
    assert {c for c in results if c.startswith("pipeline_")} == {
        "pipeline_probes", "pipeline_thresholds", "pipeline_second_replay", "pipeline_interleaved", "pipeline_batch2"}


class _OffByOneUlp(EmulatedGraphBackend):
    def replay(self, graph):
        super().replay(graph)
        graph.static_output.copy_(torch.nextafter(graph.static_output, torch.full_like(graph.static_output, 2)))


def test_parity_harness_catches_a_replay_that_is_off_by_one_ulp():
    rows = check_family_size("yolo9", "t", device="cpu", imgszs=(IMGSZ, 32), backend=_OffByOneUlp())
    failed = {r["check"] for r in rows if r["result"] == "fail"}
    assert {"probe_uniform", "probe_image", "second_replay", "interleaved"} <= failed


class _DisablesAKernel(EmulatedGraphBackend):
    """A capture during which a kernel provider fails and is disabled for the process (what the
    Triton ms_deform_attn provider did on a host-to-device copy inside a capture)."""

    def capture(self, fn, static_input, pool):
        from libreyolo.kernels import KernelWarning

        warnings.warn("kernel 'fake' for slot 'ms_deform_attn' failed and is disabled for this process", KernelWarning)
        return super().capture(fn, static_input, pool)


def test_parity_harness_fails_a_run_that_lost_a_kernel_provider():
    """The replay is still exact (both sides ran the fallback), but the run did not check the forward
    that eager started with: kernels_kept fails (and passes in the exact run above)."""
    rows = check_family_size("yolo9", "t", device="cpu", imgszs=(IMGSZ, 32), backend=_DisablesAKernel())
    failed = {r["check"]: r["detail"] for r in rows if r["result"] == "fail"}
    assert list(failed) == ["kernels_kept"] and "ms_deform_attn" in failed["kernels_kept"], rows


class _BakedThresholds(EmulatedGraphBackend):
    """Replays a whole-pipeline graph with the thresholds it was captured with (a graph that baked them in)."""

    def capture(self, fn, static_input, pool):
        graph, out = super().capture(fn, static_input, pool)
        if isinstance(static_input, tuple):
            graph.baked = static_input[1].clone()
        return graph, out

    def replay(self, graph):
        baked = getattr(graph, "baked", None)
        if baked is None:
            return super().replay(graph)
        current = graph.static_input[1].clone()
        graph.static_input[1].copy_(baked)
        try:
            super().replay(graph)
        finally:
            graph.static_input[1].copy_(current)


def test_parity_harness_catches_a_pipeline_graph_that_ignores_new_thresholds():
    rows = check_family_size("yolo9", "t", device="cpu", imgszs=(IMGSZ, 32), backend=_BakedThresholds())
    result = {r["check"]: r["result"] for r in rows}
    assert result["probe_uniform"] == "pass"  # the forward graph is fine
    assert result["pipeline_probes"] == "fail" and result["pipeline_thresholds"] == "fail"


def test_parity_tool_writes_json_and_markdown(tmp_path):
    rc = parity_main(["--emulate", "--family", "yolo9", "--sizes", "t", "--imgsz", str(IMGSZ), "32",
                      "--json", str(tmp_path / "p.json"), "--md", str(tmp_path / "p.md")])
    matrix = json.loads((tmp_path / "p.json").read_text())
    assert rc == 0 and matrix["families"]["yolo9"]["verified"] is True
    assert matrix["families"]["yolo9"]["pipeline_verified"] is True
    assert {"torch", "cuda", "gpu"} <= set(matrix["environment"])
    assert "| yolo9 | t | detect |" in (tmp_path / "p.md").read_text()


# --- checking after the launch -------------------------------------------------------------------
class _StaleReplays(EmulatedGraphBackend):
    """A replay after the weights moved returns NaN, as a real graph reading old addresses could."""

    def __init__(self, weights_of) -> None:
        super().__init__()
        self.weights_of = weights_of
        self.seen: dict[int, tuple] = {}

    def capture(self, fn, static_input, pool):
        graph, out = super().capture(fn, static_input, pool)
        self.seen[id(graph)] = self.weights_of()
        return graph, out

    def replay(self, graph):
        super().replay(graph)
        if self.seen[id(graph)] != self.weights_of():
            graph.static_output.fill_(float("nan"))


def test_a_replay_whose_weights_moved_is_thrown_away_and_run_again():
    net = Tiny().eval()
    backend = _StaleReplays(lambda: tuple(p.data_ptr() for p in net.parameters()))
    runner = GraphRunner(net, lambda x: {"out": net(x)}, backend=backend)
    x = x_of(8)
    assert runner._watch.state.pins == ()  # nothing pinned while no graph reads the weights
    runner(x)
    old_ptr = net.conv.weight.data_ptr()
    with torch.no_grad():
        for p in net.parameters():
            p.data = p.data.clone() * 2  # new storage (as a device move gives), new values
    assert runner._watch.state.pins[0].data_ptr() == old_ptr  # the old weights stay alive until checked
    out = runner(x)["out"]
    assert torch.equal(out, net(x))  # not the stale NaN replay
    info = runner.info()
    assert info["invalidations"] == 1 and "moved" in info["last_invalidation"] and info["captures"] == 2
    assert backend.quiesced == 1 and runner._watch.state.pins[0].data_ptr() == net.conv.weight.data_ptr()
    runner.release()
    assert runner._watch.state.pins == ()


def test_mode_false_on_the_runner_is_plain_eager(backend):
    runner, net = tiny_runner(backend)
    assert torch.equal(runner(x_of(8), False)["out"], net(x_of(8)))
    assert backend.capture_attempts == 0


def test_stream_fence_orders_only_when_the_stream_changes(monkeypatch):
    from libreyolo.graphs.backend import CudaStreamFence

    waits: list[tuple[int, int]] = []
    current = [1]

    class FakeStream:
        def __init__(self, raw: int) -> None:
            self.raw = raw

        def wait_stream(self, other: FakeStream) -> None:
            waits.append((self.raw, other.raw))

    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: current[0], raising=False)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: FakeStream(current[0]))
    fence = CudaStreamFence(torch.device("cuda", 0))
    for raw in (1, 1, 2, 2, 1):
        current[0] = raw
        stream = fence.current()
        fence.join(stream)
        fence.mark(stream)
    assert waits == [(2, 1), (1, 2)]  # a wait only at each switch, on the stream used last
