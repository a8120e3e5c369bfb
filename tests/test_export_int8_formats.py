"""INT8 artifacts of CoreML and TensorRT.

CoreML: 8-bit weights by coremltools, float activations; the package is built here (Linux) but
not run, so its report says "not validated". TensorRT: the engine needs tensorrt and an NVIDIA
GPU (absent here), so the export stops with the error naming them; the Q/DQ ONNX its strongly typed
build would use (quantize()'s parameters) is checked directly. The demo detector
at imgsz 64 on a tiny generated shapes dataset keeps it fast.
"""
from __future__ import annotations

import importlib.util
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
    """A quantized demo model and the ONNX graph the TensorRT exporter builds its engine from."""
    pytest.importorskip("onnx")
    from libreyolo.export import tensorrt as trt_exporter
    from libreyolo.export.base import ExportError

    seen = {}

    def keep_graph(onnx_path, engine_path, opts, input_name, **kw):
        seen["onnx"] = Path(onnx_path).read_bytes()
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
    path = tmp_path_factory.mktemp("int8f-onnx") / "qdq.onnx"
    path.write_bytes(seen["onnx"])
    return model, path


def test_tensorrt_int8_engine_is_built_from_the_qdq_onnx_with_quantize_scales(quantized_graph):
    """Strongly typed INT8 (TensorRT 10 and 11): explicit quantization, the Q/DQ graph of quantize()'s
    layers with its parameters bit for bit (no calibrator, no INT8 builder flag)."""
    import numpy as np
    import onnx

    from libreyolo.export.onnx import EXPORTER as ONNX
    from libreyolo.quant.qdq import expected_parameters, export_view

    model, path = quantized_graph
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    expected = expected_parameters(export_view(model.net))
    got = ONNX.int8_parameters(path)
    assert len(expected) // 4 == model.quant_info()["count"] > 100
    wrong = [k for k, v in expected.items() if not np.array_equal(got.get(f"net.{k}"), v.numpy())]
    assert not wrong, wrong[:5]


def test_onnx_node_names_map_to_module_paths():
    from libreyolo.export.onnx import node_module

    assert node_module("/net/backbone/elan2/cv2/cv2.0/m/m.1/cv1/conv/Conv") == "backbone.elan2.cv2.0.m.1.cv1.conv"
    assert node_module("/net/head/cv2/cv2.0/cv2.0.2/Conv_1") == "head.cv2.0.2"
    assert node_module("/other/x/Conv") is None
