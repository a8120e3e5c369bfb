"""LiteRT (TFLite) export (litert-torch -> .tflite + .tflite.json) and its runtime (the LiteRT
interpreter): for a YOLO, a DETR, a classifier and SegFormer the artifact validates against eager
with the float64-derived tolerances and predicts like eager through LibreYOLO(path); a copy whose
head bias was scaled by 5% is refused by its hash and, loaded with verify=False, by compare().
Conversion is slow on two cores (minutes per model), so each family is exported once per module."""
from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("litert_torch", reason="litert-torch is not installed (pip install 'libreyolo[tflite]')")
pytest.importorskip("ai_edge_litert.interpreter", reason="ai-edge-litert is not installed (pip install "
                    "'libreyolo[tflite]')")

from libreyolo import SHAPES_IMAGE, LibreYOLO  # noqa: E402
from libreyolo.errors import ArgumentError, CheckpointError, MissingDependencyError  # noqa: E402
from libreyolo.export.base import get_exporter  # noqa: E402
from libreyolo.export.compare import compare  # noqa: E402
from libreyolo.export.metadata import sidecar_path  # noqa: E402
from tests.edge_formats import (  # noqa: E402
    FAMILIES,
    assert_predicts_like_eager,
    check_val_benchmark_batcher_serve,
    copy_artifact,
    family_model,
    scale_tensor_in_file,
)

_EXPORTS: dict = {}


@pytest.fixture(scope="module")
def tflite_export(tmp_path_factory):
    """family -> export report, each exported once per module (the first test that needs it)."""
    def get(family: str):
        if family not in _EXPORTS:
            model, imgsz = family_model(family)
            out = tmp_path_factory.mktemp(f"tflite-{family}") / f"{family}.tflite"
            _EXPORTS[family] = model.export(format="tflite", imgsz=imgsz, output=out, verbose=False)
        return _EXPORTS[family]
    return get


@pytest.mark.parametrize("family", FAMILIES)
def test_tflite_artifact_validates_and_predicts_like_eager(tflite_export, family):
    report = tflite_export(family)
    v = report.validation
    assert v.status == "passed", v.text()
    assert v.runtime.startswith("ai-edge-litert")
    assert v.worst()["worst_ratio"] <= 1.0
    assert sidecar_path(report.path).is_file()
    runtime = LibreYOLO(report.path)
    assert runtime.format == "tflite" and runtime.metadata["family"] == family
    model, imgsz = family_model(family)
    assert_predicts_like_eager(model, runtime, imgsz)
    ops = get_exporter("tflite").graph_ops(report.path)
    assert not [op for op in ops if "CUSTOM" in op.upper() or "FLEX" in op.upper()], ops


def test_mutated_tflite_artifact_is_refused(tflite_export, tmp_path):
    """Mutation: the bias of the demo detector's class convolution on the finest level (found by its bytes
    in the flatbuffer) scaled by 1.05: scores move by up to 0.09. The hash refuses it on load; loaded
    anyway (verify=False), the same validation as the export's refuses its outputs. (The coarsest
    level's bias, tried first, moves this trained detector's saturated scores by 2e-8 only, within the
    allowance: compare() passed it, rightly.)"""
    report = tflite_export("yolo9")
    model, _ = family_model("yolo9")
    bad = copy_artifact(report.path, tmp_path / "bad.tflite")
    copy_artifact(sidecar_path(report.path), sidecar_path(bad))
    bias = dict(model.net.named_parameters())["head.cv3.0.2.bias"]
    scale_tensor_in_file(bad, bias, 1.05)
    with pytest.raises(CheckpointError, match="model bytes do not match"):
        LibreYOLO(bad)
    assert compare(model, LibreYOLO(bad, verify=False)).status == "failed"


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "yolo9"])
def test_mutated_tflite_artifact_of_each_other_family_is_refused(tflite_export, family, tmp_path):
    """Mutation of the DETR, the classifier and SegFormer: the largest parameter of the network that the
    flatbuffer stores verbatim (a whole weight matrix) scaled by 1.05; refused by the hash on load, and
    by the export's validation when loaded anyway (verify=False). (The last verbatim one, tried first,
    was an inner bias of RT-DETR's box MLP whose 5% moved no output beyond float32 noise: rightly passed.)"""
    report = tflite_export(family)
    model, _ = family_model(family)
    bad = copy_artifact(report.path, tmp_path / f"bad_{family}.tflite")
    copy_artifact(sidecar_path(report.path), sidecar_path(bad))
    data = bad.read_bytes()
    stored = [(n, p) for n, p in model.net.named_parameters() if p.numel() >= 16
              and data.count(p.detach().float().cpu().contiguous().numpy().tobytes()) == 1]
    assert stored, "no parameter stored verbatim in the flatbuffer"
    name, param = max(stored, key=lambda item: item[1].numel())
    scale_tensor_in_file(bad, param, 1.05)
    with pytest.raises(CheckpointError, match="model bytes do not match"):
        LibreYOLO(bad)
    assert compare(model, LibreYOLO(bad, verify=False)).status == "failed", name


def test_tflite_runs_with_val_benchmark_the_batcher_and_serve(tflite_export, tmp_path, capsys):
    check_val_benchmark_batcher_serve(tflite_export("yolo9").path, "tflite", tmp_path, capsys)


def test_tflite_options_and_missing_package_are_one_line_before_any_work(tmp_path, monkeypatch):
    model, imgsz = family_model("yolo9")
    with pytest.raises(ArgumentError, match="must end in .tflite"):
        model.export(format="tflite", imgsz=imgsz, output=tmp_path / "x.onnx")
    with pytest.raises(ArgumentError, match="dynamic=True is not possible for format=tflite"):
        model.export(format="tflite", imgsz=imgsz, dynamic=True, output=tmp_path / "d.tflite")
    monkeypatch.setitem(sys.modules, "litert_torch", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'libreyolo\[tflite\]'"):
        model.export(format="tflite", imgsz=imgsz, output=tmp_path / "m.tflite")
    assert not list(tmp_path.iterdir())


def test_tflite_fp16_weights_validate_and_halve_the_file(tflite_export, tmp_path):
    """half=True: weight-only fp16 (a DEQUANTIZE before the convolutions), validated with the fp16 rules."""
    fp32 = tflite_export("yolo9")
    model, imgsz = family_model("yolo9")
    report = model.export(format="tflite", imgsz=imgsz, half=True, output=tmp_path / "h.tflite", verbose=False)
    assert report.validation.status == "passed", report.validation.text()
    assert report.metadata["precision"] == "fp16" and report.metadata["input_dtype"] == "float32"
    assert report.path.stat().st_size < 0.7 * fp32.path.stat().st_size
    assert "DEQUANTIZE" in get_exporter("tflite").graph_ops(report.path)
    assert_predicts_like_eager(model, LibreYOLO(report.path), imgsz)


@pytest.fixture(scope="module")
def tflite_int8(tmp_path_factory):
    """The demo detector's INT8 flatbuffer (PT2E static, litert-torch's PT2EQuantizer), calibrated on 8
    generated shapes images and gated on 6: one conversion, shared."""
    pytest.importorskip("faster_coco_eval", reason="the accuracy gate needs libreyolo[train] (mAP)")
    from libreyolo.train.shapes import make_shapes_dataset

    model, imgsz = family_model("yolo9")
    data = make_shapes_dataset(tmp_path_factory.mktemp("tflite-int8-shapes"), n_train=8, n_val=6, imgsz=imgsz, seed=3)
    out = tmp_path_factory.mktemp("tflite-int8") / "demo-int8.tflite"
    return model.export(format="tflite", imgsz=imgsz, int8=True, data=str(data), output=out, verbose=False), data


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("LIBREYOLO_LONG_EXPORTS"),
                    reason="one LiteRT INT8 conversion takes 10-20 min on 2 CPU cores, over the CI budget; "
                           "LIBREYOLO_LONG_EXPORTS=1 runs it")
def test_tflite_int8_validates_passes_the_gate_and_runs_int8_kernels(tflite_int8, capsys):
    """Validated against the quantized eager model with the own-toolchain rules (PT2E's converted graph as
    the quantization floor), the accuracy gate passed with its figures in the metadata, int8 tensors and
    QUANTIZE/DEQUANTIZE in the flatbuffer, and `compare` with data= judges it the same way."""
    from libreyolo.cli import main as cli_main

    report, data = tflite_int8
    assert report.validation.status == "passed", report.validation.text()
    gate = report.metadata["validation"]["accuracy"]
    assert gate["metric"] == "mAP50-95" and gate["passed"] and gate["drop"] <= gate["max_drop"] == 0.02, gate
    assert gate["float"] > 0.5  # a trained detector: a broken artifact would show
    q = report.metadata["quantization"]
    assert report.metadata["precision"] == "int8" and q["calibrated"] == "at export" and q["excluded"]
    assert {"QUANTIZE", "DEQUANTIZE"} <= get_exporter("tflite").graph_ops(report.path)
    model, _ = family_model("yolo9")
    float_bytes = 4 * sum(p.numel() for p in model.net.parameters())
    assert report.path.stat().st_size < 0.45 * float_bytes  # int8 weights (float32: about 1.0x)
    runtime = LibreYOLO(report.path)
    assert len(runtime.predict(SHAPES_IMAGE, conf=0.25).boxes) > 0
    capsys.readouterr()
    assert cli_main(["compare", "model=LibreYOLO9t-shapes.pt", f"artifact={report.path}", f"data={data}"]) == 0
    assert capsys.readouterr().out.startswith("validation: passed (ai-edge-litert")


def test_an_int8_input_is_quantized_with_its_own_scale_and_an_int8_output_dequantized():
    """The runtime's one place for integer tensors: round half away from zero (LiteRT's QUANTIZE),
    clamp to the type, and back. np.round (half to even) would give -2 for -2.5 and 2 for 2.5."""
    import numpy as np

    from libreyolo.runtimes.tflite import from_model_dtype, to_model_dtype

    detail = {"dtype": np.int8, "quantization": (0.5, 3)}
    x = np.array([-1.25, 1.25, 0.0, 100.0, -100.0], dtype=np.float32)  # /0.5 = -2.5, 2.5, 0, 200, -200
    q = to_model_dtype(x, detail)
    assert q.dtype == np.int8 and q.tolist() == [0, 6, 3, 127, -128]
    assert from_model_dtype(q, detail).tolist() == [-1.5, 1.5, 0.0, 62.0, -65.5]
    same = to_model_dtype(x, {"dtype": np.float32, "quantization": (0.0, 0)})
    assert same.dtype == np.float32 and same.tolist() == x.tolist()
