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

    def fake_build(onnx_path, engine_path, opts, input_name, **kw):
        graph = onnx.load(str(onnx_path)).graph
        seen["input"] = [d.dim_param or d.dim_value for d in graph.input[0].type.tensor_type.shape.dim]
        seen["dtype"] = graph.input[0].type.tensor_type.elem_type
        seen["outputs"] = [o.name for o in graph.output]
        seen["opts"] = (opts.precision, opts.workspace, opts.batch)
        raise ExportError("stop here: no TensorRT in this test")

    monkeypatch.setattr(trt_exporter, "build_engine", fake_build)
    with pytest.raises(ExportError, match="stop here"):
        model().export(format="tensorrt", imgsz=64, dynamic=True, batch=4, workspace=2,
                       nms=True, output=tmp_path / "x.engine")
    assert seen["input"] == ["batch", 3, 64, 64]  # batch profile; the spatial size is fixed
    assert seen["dtype"] == onnx.TensorProto.FLOAT and seen["outputs"] == ["detections", "num_detections"]
    assert seen["opts"] == ("fp32", 2.0, 4)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("opts, message", [
    ({"device": "cpu"}, "TensorRT engines are built and run on an NVIDIA GPU"),
    ({"dynamic": True, "batch": 1}, "pass the largest batch"),
    ({"workspace": -1}, r"workspace must be a number in \(0, 1024\]"),
    ({"opset": 30}, "opset must be an integer"),
    # strongly typed: fp16 comes from an ONNX traced in float16 on CUDA, not from a builder flag
    ({"half": True}, "half=True for format=tensorrt needs a CUDA device"),
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


# --- the build code against stand-ins of TensorRT 10 and 11 (tests/trt_standins.py) ----------------------------


def _build(major, tmp_path, *, progress=True, **opts):
    from libreyolo.export.base import ExportOptions
    from libreyolo.export.tensorrt import build_engine
    from tests.trt_standins import standin

    trt = standin(major, progress=progress)
    onnx_path = tmp_path / "m.source.onnx"
    if not onnx_path.exists():
        onnx_path.write_bytes(b"an ONNX graph's bytes")
    options = ExportOptions("tensorrt", 64, **{"batch": 4, "dynamic": True, "workspace": 2.0, **opts})
    engine = tmp_path / f"m{len(list(tmp_path.glob('*.engine')))}.engine"
    info = build_engine(onnx_path, engine, options, "images", trt=trt, gpu="NVIDIA H100 80GB HBM3",
                        cache=tmp_path / "cache")
    return trt, engine, info


@pytest.mark.parametrize("major", [10, 11])
def test_the_build_is_strongly_typed_with_no_precision_flag_on_either_api(major, tmp_path):
    trt, engine, info = _build(major, tmp_path)
    names = [c[0] for c in trt.calls]
    assert ("builder.create_network", 1) in trt.calls  # 1 << STRONGLY_TYPED
    assert "config.set_flag" not in names  # no FP16/INT8 flag (TensorRT 11 has none; 10 refuses them when typed)
    assert ("config.clear_flag", "TF32") in trt.calls  # fp32 is true float32, as validated
    assert not any(c[0] == "config.int8_calibrator=" for c in trt.calls)
    assert ("config.set_memory_pool_limit", "WORKSPACE", 2 << 30) in trt.calls
    assert ("profile.set_shape", "images", (1, 3, 64, 64), (4, 3, 64, 64), (4, 3, 64, 64)) in trt.calls
    assert ("config.progress_monitor=", "ConsoleProgress") in trt.calls
    assert names.index("config.create_timing_cache") < names.index("builder.build_serialized_network")
    assert engine.read_bytes() == f"ENGINE-{major}".encode()
    assert info["engine_cache"] == "miss" and info["tensorrt"] == trt.__version__ and info["api"] == f"TensorRT {major}"


@pytest.mark.parametrize("major", [10, 11])
def test_timing_and_engine_caches_are_reused_and_keyed_by_onnx_version_and_gpu(major, tmp_path):
    trt, first, info = _build(major, tmp_path)
    timing = list((tmp_path / "cache").glob("timing-*.cache"))
    assert len(timing) == 1 and trt.__version__ in timing[0].name and "NVIDIA_H100" in timing[0].name
    again, second, hit = _build(major, tmp_path)  # same ONNX, TensorRT, GPU and options: no build
    assert hit["engine_cache"] == "hit" and hit["engine_cache_key"] == info["engine_cache_key"]
    assert not any(c[0] == "Builder" for c in again.calls) and second.read_bytes() == first.read_bytes()
    other, _, built = _build(major, tmp_path, batch=8)  # another option: another key, a build, the timing cache read
    assert built["engine_cache"] == "miss" and built["engine_cache_key"] != info["engine_cache_key"]
    blob = next(c[1] for c in other.calls if c[0] == "config.create_timing_cache")
    assert blob == b"timing:"  # what the first build serialised; this build's own is saved after it
    assert timing[0].read_bytes() == b"timing:timing:"
    (tmp_path / "m.source.onnx").write_bytes(b"another graph")
    _, _, changed = _build(major, tmp_path)
    assert changed["engine_cache"] == "miss"  # the ONNX bytes are part of the key


@pytest.mark.parametrize("major", [10, 11])
@pytest.mark.parametrize("precision", [{"half": True}, {"int8": True}])
def test_fp16_and_int8_builds_take_their_types_from_the_onnx_and_set_no_flag(major, precision, tmp_path):
    trt, _, info = _build(major, tmp_path, **precision)
    assert not any(c[0] in ("config.set_flag", "config.clear_flag") for c in trt.calls), trt.calls
    assert ("builder.create_network", 1) in trt.calls and info["engine_cache"] == "miss"


def test_without_a_progress_monitor_the_build_says_so(tmp_path, caplog):
    import logging

    from libreyolo.utils.log import LOGGER

    LOGGER.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger=LOGGER.name):
            trt, _, _ = _build(10, tmp_path, progress=False)
    finally:
        LOGGER.removeHandler(caplog.handler)
    assert not any(c[0] == "config.progress_monitor=" for c in trt.calls)
    assert "reports no progress" in caplog.text


@pytest.mark.parametrize("version", ["8.6.1", "12.0.0"])
def test_a_tensorrt_outside_10_and_11_is_refused_naming_the_pin(version, tmp_path):
    from libreyolo.export.base import ExportOptions
    from libreyolo.export.tensorrt import build_engine
    from tests.trt_standins import standin

    trt = standin(10)
    trt.__version__ = version
    (tmp_path / "m.onnx").write_bytes(b"x")
    with pytest.raises(MissingDependencyError, match=r"TensorRT 10 or 11.*tensorrt>=10.0,<12"):
        build_engine(tmp_path / "m.onnx", tmp_path / "m.engine", ExportOptions("tensorrt", 64), "images", trt=trt,
                     gpu="g", cache=tmp_path)
    assert trt.calls == []


def test_the_tensorrt_11_standin_refuses_what_tensorrt_11_removed():
    """The stand-in is strict: code using a removed API fails against it (what the old build did)."""
    from tests.trt_standins import standin

    old, new = standin(10), standin(11)
    assert old.BuilderFlag.FP16 and old.Builder.platform_has_fast_fp16
    with pytest.raises(AttributeError):
        new.BuilderFlag.FP16  # noqa: B018
    with pytest.raises(AttributeError):
        new.BuilderFlag.INT8  # noqa: B018
    with pytest.raises(AttributeError):
        new.Builder(new.Logger(2)).platform_has_fast_fp16  # noqa: B018
    with pytest.raises(AttributeError, match="int8_calibrator"):
        new.Builder(new.Logger(2)).create_builder_config().int8_calibrator = object()
    assert not hasattr(new, "IInt8EntropyCalibrator2")
