"""compile on with ``predict(cuda_graph=True)``: our graphs capture the validated compiled network.

On the CPU the graphs run on the emulated backend (a "replay" calls the captured function) and
:func:`libreyolo.engine.compiled.torch_compile` is patched (a recorder, or a program that is wrong
on purpose), so what is captured, the mode it is compiled in and the validation before the capture
are checked without compiling. The real compile inside real CUDA graphs is the ``gpu`` test in
``tests/test_compile.py``.
"""
from __future__ import annotations

import logging

import pytest
import torch

from libreyolo import SAMPLE_IMAGE
from libreyolo.engine import compiled as compiled_mod
from libreyolo.graphs.backend import EmulatedGraphBackend
from tests.conftest import seeded_model
from tests.test_compile import (
    CONF,
    IMGSZ,
    _same_results,
    _skewed,
    one_thread,  # noqa: F401 - the same autouse fixture: one intra-op thread here too
)


def _graphed(compile_mode=True):
    model = seeded_model("t")
    model.set_graph_backend(EmulatedGraphBackend())
    return model.compile(compile_mode) if compile_mode is not False else model


class _Recorder:
    """A stand-in for torch.compile: the module itself, counting the modes asked for and the calls."""

    def __init__(self) -> None:
        self.modes: list[str] = []
        self.calls = 0

    def __call__(self, module, mode):
        self.modes.append(mode)

        def run(x):
            self.calls += 1
            return module(x)

        return run


@pytest.fixture(scope="module")
def eager_graphed():
    """The plain model's graphed predict (no compile): what a correct compiled graph must return."""
    return _graphed(False).predict(SAMPLE_IMAGE, imgsz=IMGSZ, conf=CONF, cuda_graph=True)


def test_in_graph_modes_drop_inductors_own_cuda_graphs():
    assert compiled_mod.in_graph_mode("reduce-overhead") == "default"
    assert compiled_mod.in_graph_mode("max-autotune") == "max-autotune-no-cudagraphs"
    for mode in ("default", "max-autotune-no-cudagraphs"):
        assert compiled_mod.in_graph_mode(mode) == mode
        assert not compiled_mod.uses_cudagraphs(mode, torch.device("cuda"))


def test_the_graphs_of_a_compiled_model_capture_and_replay_the_compiled_network(monkeypatch, eager_graphed):
    record = _Recorder()
    monkeypatch.setattr(compiled_mod, "torch_compile", record)
    model = _graphed("max-autotune")
    first = model.predict(SAMPLE_IMAGE, imgsz=IMGSZ, conf=CONF, cuda_graph=True)
    calls = record.calls
    second = model.predict(SAMPLE_IMAGE, imgsz=IMGSZ, conf=CONF, cuda_graph=True)
    assert record.modes == ["max-autotune-no-cudagraphs"]  # compiled once, without Inductor's CUDA graphs
    assert calls >= 2 and record.calls == calls + 1  # validation and capture ran it; the replay did again
    assert _same_results(first, eager_graphed) and _same_results(second, eager_graphed)
    (entry,) = model.compile_info()["copies"]
    assert entry["used_by"] == "CUDA graphs" and entry["compiled"] and entry["fallback"] is None
    assert entry["shapes"][0]["shape"] == [1, 3, IMGSZ, IMGSZ]
    info = model.graph_info()
    assert [g["program"] for g in info["graphs"]] == ["pipeline"] and info["captures"] == 1


def test_a_wrong_compiled_network_is_refused_before_capture_and_the_graph_holds_the_eager_copy(
        monkeypatch, caplog, eager_graphed):
    monkeypatch.setattr(compiled_mod, "torch_compile", _skewed)  # boxes 1e-5 off: they move (test_compile.py)
    model = _graphed(True)
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        got = [model.predict(SAMPLE_IMAGE, imgsz=IMGSZ, conf=CONF, cuda_graph=True) for _ in range(2)]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "differ from the eager copy's beyond the validation bar" in warning
    assert all(_same_results(g, eager_graphed) for g in got)
    (entry,) = model.compile_info()["copies"]
    assert entry["used_by"] == "CUDA graphs" and entry["compiled"] is False and "predictions/box" in entry["fallback"]


def test_compile_false_drops_the_compiled_graphs_and_graphs_capture_the_eager_copy_again(monkeypatch, eager_graphed):
    record = _Recorder()
    monkeypatch.setattr(compiled_mod, "torch_compile", record)
    model = _graphed(True)
    model.predict(SAMPLE_IMAGE, imgsz=IMGSZ, conf=CONF, cuda_graph=True)
    copy = model.inference_copy()
    compiled_graphs = copy.attachment("graphs:compiled")
    assert compiled_graphs is not None and compiled_graphs.info()["graphs"]
    model.compile(False)
    assert copy.attachment("graphs:compiled") is None and not compiled_graphs.info()["graphs"]  # released
    calls = record.calls
    again = model.predict(SAMPLE_IMAGE, imgsz=IMGSZ, conf=CONF, cuda_graph=True)
    assert record.calls == calls and _same_results(again, eager_graphed)
    assert model.compile_info()["copies"] == []
