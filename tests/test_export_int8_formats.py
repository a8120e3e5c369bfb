"""INT8 artifacts of the formats that quantize with their own toolchain (``int8_mode = "own"``).

CoreML: 8-bit weights by coremltools, float activations; the package is built here (Linux) but
not run, so its report says "not validated". TensorRT: the engine needs tensorrt and an NVIDIA
GPU (absent here), so the export stops with the error naming them; the calibration cache it would
use (quantize()'s input ranges in TensorRT's text format) is checked directly. The demo detector
at imgsz 64 on a tiny generated shapes dataset keeps it fast.
"""
from __future__ import annotations

import importlib.util
import struct
import sys
from pathlib import Path

import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.train.shapes import make_shapes_dataset

IMGSZ = 64
DEMO = "LibreYOLO9t-shapes.pt"
HAS_TRT = importlib.util.find_spec("tensorrt") is not None and torch.cuda.is_available()


@pytest.fixture(scope="module", autouse=True)
def _threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(min(2, threads))
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    return make_shapes_dataset(tmp_path_factory.mktemp("int8f-shapes"), n_train=4, n_val=2, imgsz=IMGSZ, seed=3)


def _weights_bytes(package: Path) -> int:
    return sum(f.stat().st_size for f in (package / "Data").rglob("*") if f.is_file() and "weights" in f.parts)


@pytest.fixture(scope="module")
def coreml_pair(shapes, tmp_path_factory):
    pytest.importorskip("coremltools", reason="coremltools is not installed (pip install 'libreyolo[coreml]')")
    folder = tmp_path_factory.mktemp("int8f-coreml")
    model = LibreYOLO(DEMO)
    fp32 = model.export(format="coreml", imgsz=IMGSZ, output=folder / "fp32.mlpackage", verbose=False)
    int8 = model.export(format="coreml", imgsz=IMGSZ, int8=True, data=str(shapes), output=folder / "int8.mlpackage",
                        verbose=False)
    return fp32, int8


def test_coreml_int8_package_has_8_bit_weights_and_is_much_smaller(coreml_pair):
    from libreyolo.export.coreml import mlpackage_ops

    fp32, int8 = coreml_pair
    assert int8.path.is_dir() and (int8.path / "Manifest.json").is_file()
    small, big = _weights_bytes(int8.path), _weights_bytes(fp32.path)
    assert big > 0 and small < 0.4 * big, (small, big)
    ops, float_ops = mlpackage_ops(int8.path), mlpackage_ops(fp32.path)
    weight_ops = {o for o in ops if o.startswith("constexpr_")}
    assert weight_ops & {"constexpr_affine_dequantize", "constexpr_blockwise_shift_scale"}, ops
    assert not any(o.startswith("constexpr_") for o in float_ops)  # the float package keeps float weights
    assert "conv" in ops


def test_coreml_int8_metadata_says_what_was_quantized(coreml_pair):
    from libreyolo.runtimes.coreml import read_metadata

    _, int8 = coreml_pair
    meta = read_metadata(int8.path)
    q = meta["quantization"]
    assert meta["precision"] == "int8" and q["recipe"] == "int8"
    assert q["coreml"].startswith("8-bit linear symmetric per-channel weights") and "float activations" in q["coreml"]
    assert q["activations_calibrated"] is False and q["coreml_weight_ops"]
    assert "float activations" in q["scheme"]
    assert meta["validation"]["status"] == "not validated"


@pytest.mark.skipif(sys.platform == "darwin", reason="on macOS the reason differs (weight-only INT8)")
def test_coreml_int8_report_says_not_validated_here(coreml_pair):
    _, int8 = coreml_pair
    v = int8.validation
    assert v.status == "not validated" and v.headline() == "not validated: CoreML runs only on macOS"
    assert any("INT8 accuracy gate: not run" in n and "not validated here" in n for n in v.notes), v.notes
    assert "accuracy" not in int8.metadata["validation"]  # no gate result is claimed


def test_coreml_int8_on_macos_is_not_compared_with_the_w8a8_eager_model(monkeypatch):
    pytest.importorskip("coremltools")
    from libreyolo.export.base import ExportOptions, get_exporter

    monkeypatch.setattr(sys, "platform", "darwin")
    exporter = get_exporter("coreml")
    assert exporter.not_validated_reason(ExportOptions("coreml", IMGSZ)) is None
    reason = exporter.not_validated_reason(ExportOptions("coreml", IMGSZ, int8=True))
    assert "weights only" in reason and "not validated here" in reason


@pytest.mark.skipif(HAS_TRT, reason="tensorrt and a GPU are present: the engine would really be built")
def test_tensorrt_int8_without_tensorrt_stops_naming_the_extra_and_writes_nothing(shapes, tmp_path):
    pytest.importorskip("onnx")
    from libreyolo.errors import MissingDependencyError

    with pytest.raises(MissingDependencyError, match=r"libreyolo\[tensorrt\].*ONNX graph the engine is built from"):
        LibreYOLO(DEMO).export(format="tensorrt", imgsz=IMGSZ, int8=True, data=str(shapes),
                               output=tmp_path / "x.engine", verbose=False)
    assert not list(tmp_path.iterdir())


@pytest.fixture(scope="module")
def quantized_graph(shapes, tmp_path_factory):
    """A quantized demo model and the float ONNX graph the TensorRT exporter builds the engine from."""
    pytest.importorskip("onnx")
    from libreyolo.export import tensorrt as trt_exporter
    from libreyolo.export.base import ExportError

    seen = {}

    def keep_graph(onnx_path, engine_path, opts, input_name, cache=None):
        seen["onnx"] = Path(onnx_path).read_bytes()
        seen["cache"] = Path(cache).read_text()
        raise ExportError("stop here: no TensorRT in this test")

    mp = pytest.MonkeyPatch()
    mp.setattr(trt_exporter, "build_engine", keep_graph)
    try:
        model = LibreYOLO(DEMO)
        model.quantize(recipe="int8", data=str(shapes), samples=4)
        with pytest.raises(ExportError, match="stop here"):
            model.export(format="tensorrt", imgsz=IMGSZ, data=str(shapes),
                         output=tmp_path_factory.mktemp("int8f-trt") / "x.engine", verbose=False)
    finally:
        mp.undo()
    path = tmp_path_factory.mktemp("int8f-onnx") / "float.onnx"
    path.write_bytes(seen["onnx"])
    return model, path, seen["cache"]


def test_tensorrt_calibration_cache_holds_quantize_ranges_of_every_quantized_layer(quantized_graph):
    import onnx

    from libreyolo.export.tensorrt import calibration_cache, input_amax, quantized_inputs
    from libreyolo.quant.simulate import QuantConv2d, QuantLinear

    model, path, cache = quantized_graph
    layers = {n: m for n, m in model.net.named_modules() if isinstance(m, (QuantConv2d, QuantLinear))}
    assert len(layers) == model.quant_info()["count"] > 100
    lines = cache.splitlines()
    assert lines[0] == "TRT-0-EntropyCalibration2"  # no TensorRT here: version 0 (the build stops anyway)
    assert calibration_cache(model.net, path, "8.6.1").splitlines()[0] == "TRT-8601-EntropyCalibration2"
    assert calibration_cache(model.net, path, "10.3.0").splitlines()[1:] == lines[1:]
    graph = onnx.load(str(path)).graph
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in graph.node)  # the float graph
    tensors = {i.name for i in graph.input} | {o for n in graph.node for o in n.output}
    entries = dict(line.split(": ") for line in lines[1:])
    assert len(entries) == len(lines) - 1 and set(entries) <= tensors
    assert "images" in entries  # the first conv reads the network input
    inputs = quantized_inputs(model.net, path)
    covered = {name for _, names in inputs.values() for name in names}
    assert covered == set(layers)  # every quantized layer's input has a range; the excluded ones none
    assert not covered & set(model.quant_info()["excluded"])
    for tensor, (_amax, names) in inputs.items():
        scale = struct.unpack(">f", bytes.fromhex(entries[tensor]))[0]
        want = max(input_amax(float(layers[n].quant_input_scale), int(layers[n].quant_input_zero_point))
                   for n in names)
        assert scale == pytest.approx(want / 127, rel=1e-6) and scale > 0, tensor


def test_tensorrt_cache_helpers_match_the_format():
    from libreyolo.export.tensorrt import hex_scale, input_amax, node_module, version_tag

    assert hex_scale(0.5) == "3f000000" and hex_scale(1.0) == "3f800000"
    assert version_tag("8.6.1.6") == "8601" and version_tag("10.3.0") == "100300" and version_tag("7.1.3.4") == "7103"
    assert input_amax(0.1, -28) == pytest.approx(15.5)  # low (-128+28)*0.1 = -10, high (127+28)*0.1 = 15.5
    assert input_amax(0.1, 100) == pytest.approx(22.8)  # low -22.8, high 2.7
    assert node_module("/net/backbone/elan2/cv2/cv2.0/m/m.1/cv1/conv/Conv") == "backbone.elan2.cv2.0.m.1.cv1.conv"
    assert node_module("/net/head/cv2/cv2.0/cv2.0.2/Conv_1") == "head.cv2.0.2"
    assert node_module("/other/x/Conv") is None
