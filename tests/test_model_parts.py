"""The parts the eager Model is composed of, each used alone (issue 45, item 2): the graph part
(GraphState), the compile part (Compilation), the quantization part (Quantization), the whole-pipeline
graph (PipelineExecutor), and the pieces
predict() is split into (the batch loop, the call clock). Tiny networks on the CPU; graphs through
the emulated backend. The mutations each check was shown to fail on are named in its docstring."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from libreyolo.engine.batches import one_by_one
from libreyolo.engine.calls import StageClock
from libreyolo.engine.compile_state import Compilation
from libreyolo.engine.graph_state import GraphState
from libreyolo.engine.graphed import COMPILED, COMPILED_IN_GRAPH, GRAPHS, GRAPHS_COMPILED, ForwardGraphs
from libreyolo.engine.inference import InferenceCopies
from libreyolo.engine.quantized import Quantization
from libreyolo.errors import ArgumentError
from libreyolo.graphs import DEFAULT_MAX_GRAPHS, EmulatedGraphBackend
from libreyolo.quant.simulate import QuantConv2d


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 1)).eval()


def _network(module: nn.Module):
    return lambda x: {"out": module(x)}


# --- GraphState ----------------------------------------------------------------------------------------
def test_graph_state_makes_runners_with_its_backend_and_limit():
    """Mutations tried: new_runner ignoring the backend set (real CUDA graphs: the capture fails on the
    CPU); set_max_graphs not reaching live runners (their info keeps 16)."""
    state, net = GraphState(), _net()
    assert state.backend is None and state.max_graphs == DEFAULT_MAX_GRAPHS
    backend = EmulatedGraphBackend()
    state.set_backend(backend)
    assert state.backend is backend and state.active_backend() is backend
    runner = state.new_runner(net, _network(net))
    x = torch.rand(1, 3, 8, 8)
    with torch.inference_mode():
        runner.capture(x)
        out = runner(x, True)
    assert backend.captures and torch.equal(out["out"], net(x))
    state.set_max_graphs(3, [runner])
    assert state.max_graphs == 3 and runner.info()["max_graphs"] == 3
    assert state.new_runner(net, _network(net)).info()["max_graphs"] == 3
    with pytest.raises(ArgumentError, match="max_graphs must be a positive integer"):
        state.set_max_graphs(0)


def test_graph_state_keeps_retired_counters_and_a_copy_shares_only_the_backend():
    """Mutations tried: retire() not adding the runner's captures (merged captures 1, not 2); the
    copy deep-copying the backend (a different object); the copy sharing the totals (the original's
    captures change with the copy's)."""
    backend = EmulatedGraphBackend()
    state, net = GraphState(backend), _net()
    old, live = state.new_runner(net, _network(net)), state.new_runner(net, _network(net))
    x = torch.rand(1, 3, 8, 8)
    with torch.inference_mode():
        old.capture(x)
        live.capture(x)
    state.retire([old], "weights changed")
    assert state.totals["captures"] == 1 and state.totals["invalidations"] == 1
    assert state.totals["last_invalidation"] == "weights changed"
    merged = state.merged_info([live.info()])
    assert merged["captures"] == 2 and len(merged["graphs"]) == 1 and merged["last_invalidation"] == "weights changed"
    state.retire([state.new_runner(net, _network(net))], "nothing captured")  # no graphs: not an invalidation
    assert state.totals["invalidations"] == 1
    twin = copy.deepcopy(state)
    assert twin.backend is backend and twin.totals == state.totals
    twin.totals["captures"] += 5
    assert state.totals["captures"] == 1


# --- ForwardGraphs ------------------------------------------------------------------------------------
class _Family:
    """What ForwardGraphs asks of a family: the network's outputs by name."""

    @staticmethod
    def named_outputs(out: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"out": out}


def test_forward_graphs_keep_a_runner_per_copy_and_report_them():
    """Mutations tried: runner() making a new runner per call (not the attached one); release() not
    releasing (the graph stays listed); info() ignoring the retired counters (captures 1, not 2);
    the compiled runner attached under the plain name (the two runners are one)."""
    backend = EmulatedGraphBackend()
    state, comp, net = GraphState(backend), Compilation(), _net()
    graphs, copies = ForwardGraphs(state, comp, _Family()), InferenceCopies(net)
    c = copies.get("cpu", torch.float32)
    runner = graphs.runner(c)
    assert runner is graphs.runner(c) and c.attachment(GRAPHS) is runner and graphs.runners([c]) == [runner]
    x = torch.rand(1, 3, 8, 8)
    with torch.inference_mode():
        runner.capture(x)
    out = graphs.forward(c, x, True)
    assert backend.replays == 1 and torch.equal(out["out"], net(x))
    assert graphs.options(copies.live(), max_graphs=2) == {"max_graphs": 2} and runner.info()["max_graphs"] == 2
    state.retire([runner], "test")  # as if an older copy had held it: its capture is counted once more
    info = graphs.info(copies.live(), {"family": "test"}, default=lambda: c)
    assert info["family"] == "test" and len(info["graphs"]) == 1 and info["captures"] == 2
    graphs.release(copies.live())
    assert graphs.info(copies.live(), {}, default=lambda: c)["graphs"] == []
    comp.set_mode(True, copies.live())
    compiled_runner = graphs.runner(c)
    assert compiled_runner is not runner and c.attachment(GRAPHS_COMPILED) is compiled_runner
    assert c.attachment(COMPILED_IN_GRAPH) is not None and c.attachment(COMPILED) is None


# --- Compilation ---------------------------------------------------------------------------------------
def test_compilation_finds_one_program_per_copy_and_drops_them_on_a_mode_change():
    """Mutations tried: program() ignoring ``in_graph`` (one attachment for both); set_mode not
    detaching (the old program survives a mode change); retire() counting copies without a program."""
    comp, copies = Compilation(), InferenceCopies(_net())
    c = copies.get("cpu", torch.float32)
    assert not comp.on and comp.program(c, family=None) is None and c.attachment(COMPILED) is None
    with pytest.raises(ArgumentError):
        comp.set_mode("fastest", copies.live())
    comp.set_mode(True, copies.live())
    first = comp.program(c, family=None)
    assert comp.on and first is comp.program(c, family=None) and c.attachment(COMPILED) is first
    in_graph = comp.program(c, family=None, in_graph=True)
    assert in_graph is not first and c.attachment(COMPILED_IN_GRAPH) is in_graph
    info = comp.info(copies.live())
    assert info["mode"] is True and [p["used_by"] for p in info["copies"]] == ["predict(cuda_graph=False)",
                                                                               "CUDA graphs"]
    comp.set_mode("max-autotune-no-cudagraphs", copies.live())
    assert c.attachment(COMPILED) is None and c.attachment(COMPILED_IN_GRAPH) is None
    comp.program(c, family=None)
    comp.retire([c, copies.get("cpu", torch.float64)], "weights changed")
    assert comp.totals == {"retired": 1, "last_retired": "weights changed"}
    comp.set_mode(False, copies.live())
    assert comp.program(c, family=None) is None


# --- Quantization --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def calibration(tmp_path_factory) -> str:
    from PIL import Image

    folder = tmp_path_factory.mktemp("calib")
    for i in range(2):
        Image.new("RGB", (8, 8), (40 * i, 80, 120)).save(folder / f"{i}.png")
    return str(folder)


def test_quantization_alone_switches_a_network_and_restores_it(calibration):
    """Mutations tried: quantize() not invalidating the copies (their generation stays);
    restore() not applying the entry (no quantized layer); dequantize() leaving the state (still active)."""
    net, x = _net(), torch.rand(2, 3, 8, 8)
    with torch.no_grad():
        float_out = net(x)
    copies = InferenceCopies(net)
    before, generation = copies.get("cpu", torch.float32), copies.generation
    quant = Quantization()
    assert not quant.active and quant.info(net) is None and quant.entry(net) is None
    quant.quantize(net, copies, lambda files: iter([torch.rand(2, 3, 8, 8) for _ in files]), data=calibration,
                   samples=2, exclude="2")
    assert copies.generation > generation  # retired by quantize() itself, before anyone looks at the master
    info = quant.info(net)
    assert quant.active and info["recipe"] == "int8" and info["layers"] == ["0"] and "2" in info["excluded"]
    assert isinstance(net[0], QuantConv2d) and before not in copies.live()
    with torch.no_grad():
        quant_out = net(x)
    assert not torch.equal(quant_out, float_out)
    entry = quant.entry(net)
    other, other_state = _net(), Quantization()
    other_state.restore(other, InferenceCopies(other), entry, "test entry")
    with torch.no_grad():
        assert other_state.info(other)["layers"] == ["0"] and torch.equal(other(x), quant_out)
    quant.dequantize(net, copies)
    with torch.no_grad():
        assert not quant.active and torch.equal(net(x), float_out)


# --- the pieces of predict() -----------------------------------------------------------------------------
def test_the_batch_loop_runs_what_start_returns_batch_by_batch():
    """Mutation tried: one_by_one not calling the read-back that start() returns (no results, no reads)."""
    from libreyolo.data.sources import open_sources
    from libreyolo.engine.plan import CallPlan

    events = []
    frames = [torch.zeros(3, 8, 8, dtype=torch.uint8) for _ in range(5)]
    plan = CallPlan(imgsz=8, batch=2, device=torch.device("cpu"), half=False, dtype=torch.float32, graph=False,
                    executor="eager", options_key=(), task_options=None, preprocessor=None)

    def start(chunk, t0, plan, staged=None):
        events.append(("start", len(chunk), staged))
        return lambda: events.append(("read", len(chunk))) or [f"r{len(chunk)}"] * len(chunk)

    out = list(one_by_one(open_sources(frames), plan, start, staging=lambda: None))
    assert [len(chunk) for chunk, _, _ in out] == [2, 2, 1] and [r for _, r, _ in out][-1] == ["r1"]
    assert events == [("start", 2, None), ("read", 2), ("start", 2, None), ("read", 2), ("start", 1, None),
                      ("read", 1)]


def test_the_stage_clock_splits_host_time_on_the_cpu():
    clock = StageClock(torch.device("cpu"), t0=0.0)
    for _ in range(3):
        clock.mark()
    speed = clock.speed(2, read_s=0.004)
    assert set(speed) == {"preprocess", "inference", "postprocess"} and speed["postprocess"] >= 2.0


# --- PipelineExecutor ------------------------------------------------------------------------------------
class _ToyPost:
    """A device postprocess stand-in: the first ``k`` values of each image's output, times ``nc``."""

    def capture_safe(self, device):
        return "not capturable on the cpu" if device.type == "cpu" else None

    def params(self, metas, opts, *, nc, device):
        return torch.full((len(metas), 1), float(nc), device=device)

    def static(self, opts):
        return (("k", opts["k"]),)

    def __call__(self, outputs, params, *, k):
        return {"top": outputs["out"].flatten(1)[:, :k] * params}

    def read_later(self, padded):
        top = padded["top"].clone()
        return lambda: top


class _PipelineFamily:
    name = "toy"
    SUPPORTS_CUDA_GRAPH = True
    SUPPORTS_PIPELINE_GRAPH = True
    post = _ToyPost()

    def device_postprocess(self):
        return self.post


class _Clock:
    marks = 0

    def mark(self):
        self.marks += 1


def _pipeline_part(backend=None, **kw):
    from libreyolo.engine.calls import CallState
    from libreyolo.engine.pipeline import PipelineExecutor

    net, state, family = _net(), GraphState(backend), _PipelineFamily()
    runner = state.new_runner(net, _network(net))
    nc = {"value": 3}
    part = PipelineExecutor(family, lambda: nc["value"], state, CallState(), lambda batch: (runner, runner.fn), **kw)
    return part, net, family, nc


def test_pipeline_executor_decides_the_graphed_executor_and_says_why_not():
    """Mutations tried: unavailable() ignoring the family switch (None instead of the reason); the emulated
    backend not excusing the device check (the cpu reason); executor() skipping the family check (no raise);
    a fixed ``reason`` not winning (None)."""
    from libreyolo.engine.plan import GRAPHED, PIPELINE
    from libreyolo.graphs import GraphNotSupportedError

    cpu = torch.device("cpu")
    real, _, family, _ = _pipeline_part()
    assert real.unavailable(cpu) == ("not capturable on the cpu; the network forward is graphed, postprocessing "
                                     "runs eagerly")
    emulated, *_ = _pipeline_part(EmulatedGraphBackend())
    assert emulated.unavailable(cpu) is None and emulated.executor(None) == PIPELINE
    assert emulated.executor("why") == GRAPHED
    head = emulated.info_head(cpu)
    assert head == {"family": "toy", "supported": True,
                    "pipeline": {"supported": True, "active": True, "reason": None}}
    family.SUPPORTS_PIPELINE_GRAPH = False  # instance attribute: the class stays as it is
    assert "SUPPORTS_PIPELINE_GRAPH is False" in real.unavailable(cpu)
    family.SUPPORTS_CUDA_GRAPH = False
    with pytest.raises(GraphNotSupportedError, match="not enabled for family 'toy'"):
        real.executor(None)
    fixed, *_ = _pipeline_part(EmulatedGraphBackend(), reason="a cpu package has no graphs")
    assert fixed.unavailable(cpu) == "a cpu package has no graphs"


def test_pipeline_executor_replays_network_and_postprocess_as_one_program():
    """Mutations tried: forward() dropping the postprocess (no "top"); params built with a stale class
    count (3 instead of 5 after the change); start() not marking the clock; the capture failure escaping
    start() instead of None."""
    from libreyolo.engine.plan import PIPELINE, CallPlan
    from libreyolo.graphs import GraphCaptureError

    backend = EmulatedGraphBackend()
    part, net, family, nc = _pipeline_part(backend)
    x, metas = torch.rand(2, 3, 8, 8), [None, None]
    want = net(x).flatten(1)[:, :4] * 3
    out = part.forward(x, metas, True, {"k": 4})
    assert torch.allclose(out["top"], want) and len(backend.captures) == 1
    nc["value"] = 5
    assert torch.allclose(part.forward(x, metas, True, {"k": 4})["top"], want / 3 * 5)
    plan = CallPlan(imgsz=8, batch=2, device=x.device, half=False, dtype=x.dtype, graph=True, executor=PIPELINE,
                    options_key=(("k", 2),), task_options={"k": 2}, preprocessor=None)
    clock = _Clock()
    read = part.start(x, metas, clock, plan)
    assert clock.marks == 1 and torch.allclose(read(), net(x).flatten(1)[:, :2] * 5)

    def failing(batch):
        def runner(*args):
            raise GraphCaptureError("planted")

        return runner, None

    part.target = failing
    assert part.start(x, metas, _Clock(), plan) is None


def test_pipeline_executor_counts_frame_sizes_in_the_call_part():
    """Mutations tried: sighting() not counting (always 1); the bound not evicting the oldest key."""
    part, *_ = _pipeline_part(EmulatedGraphBackend())
    key = part.frame_key(torch.zeros(1, 4, 6, 3, dtype=torch.uint8), True, "pre", torch.float32, (("k", 1),))
    assert [part.sighting(key) for _ in range(3)] == [1, 2, 3] and part.sighting("other", at_least=2) == 2
    assert part.calls.frame_sightings[key] == 3
    for i in range(70):
        part.sighting(("many", i))
    assert key not in part.calls.frame_sightings and len(part.calls.frame_sightings) == 64
