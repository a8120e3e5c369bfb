"""TensorRT export: argument checks and the ONNX the engine is built from run everywhere; the
engine build itself needs tensorrt and an NVIDIA GPU (not available in CI)."""
from __future__ import annotations

import importlib.util

import pytest
import torch

pytest.importorskip("onnx")

from libreyolo.errors import ArgumentError, MissingDependencyError  # noqa: E402
from libreyolo.export import ExportError  # noqa: E402
from tests.test_export_common import model  # noqa: E402

HAS_TRT = importlib.util.find_spec("tensorrt") is not None and torch.cuda.is_available()


@pytest.mark.skipif(HAS_TRT, reason="tensorrt and a GPU are present: the engine would really be built")
def test_without_tensorrt_the_export_stops_after_the_onnx_build_naming_the_extra(tmp_path):
    with pytest.raises(MissingDependencyError, match=r"libreyolo\[tensorrt\].*ONNX graph the engine is built from"):
        model().export(format="tensorrt", imgsz=64, output=tmp_path / "x.engine")
    assert not list(tmp_path.iterdir())


def test_the_engine_is_built_from_a_batch_dynamic_fixed_size_onnx(tmp_path, monkeypatch):
    import onnx

    from libreyolo.export import tensorrt as trt_exporter

    seen = {}

    def fake_build(onnx_path, engine_path, opts, input_name, cache=None):
        graph = onnx.load(str(onnx_path)).graph
        seen["input"] = [d.dim_param or d.dim_value for d in graph.input[0].type.tensor_type.shape.dim]
        seen["outputs"] = [o.name for o in graph.output]
        seen["opts"] = (opts.half, opts.workspace, opts.batch, cache)
        raise ExportError("stop here: no TensorRT in this test")

    monkeypatch.setattr(trt_exporter, "build_engine", fake_build)
    with pytest.raises(ExportError, match="stop here"):
        model().export(format="tensorrt", imgsz=64, dynamic=True, batch=4, half=True, workspace=2,
                       nms=True, output=tmp_path / "x.engine")
    assert seen["input"] == ["batch", 3, 64, 64]  # batch profile; the spatial size is fixed
    assert seen["outputs"] == ["detections", "num_detections"]
    assert seen["opts"] == (True, 2.0, 4, None)  # no calibration cache for a float engine
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("opts, message", [
    ({"device": "cpu"}, "TensorRT engines are built and run on an NVIDIA GPU"),
    ({"dynamic": True, "batch": 1}, "pass the largest batch"),
    ({"workspace": -1}, r"workspace must be a number in \(0, 1024\]"),
    ({"opset": 30}, "opset must be an integer"),
])
def test_impossible_tensorrt_options_are_refused_before_building(tmp_path, opts, message):
    with pytest.raises(ArgumentError, match=message):
        model().export(format="tensorrt", output=tmp_path / "x.engine", **opts)
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(HAS_TRT, reason="tensorrt and a GPU are present")
def test_loading_an_engine_without_tensorrt_names_the_extra(tmp_path):
    from libreyolo import LibreYOLO
    from libreyolo.export.metadata import write_sidecar

    engine = tmp_path / "x.engine"
    engine.write_bytes(b"not really an engine")
    meta = {"libreyolo_metadata": "1", "format": "tensorrt", "family": "yolo9", "size": "t", "task": "detect",
            "names": {"0": "a"}, "imgsz": 64, "batch": 1, "stride": 32, "input_name": "images",
            "output_names": ["predictions"], "input_dtype": "float32", "precision": "fp32", "dynamic_axes": {},
            "letterbox": {"placement": "topleft", "pad_value": 114.0}}
    write_sidecar(engine, meta)
    from libreyolo.runtimes.base import RuntimeUnavailableError

    with pytest.raises((MissingDependencyError, ArgumentError, RuntimeUnavailableError), match="tensorrt|NVIDIA GPU"):
        LibreYOLO(engine)
