"""OpenVINO IR folders: validated against eager on this CPU, run through LibreYOLO(folder), sealed.

One export per model, shared by the module: the demo detector (YOLOv9-t) at 128 px, and seeded
RT-DETR r18, ViT-ti (2 blocks) and SegFormer-b0 at the sizes of ``tests/mutations.py``. A wrong
artifact is made by mutating one exported IR (a convolution's weights x1.01, resealed so that only
the numbers are wrong), not by exporting again; ``compare`` must refuse it.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("openvino", reason="openvino is not installed (pip install 'libreyolo[openvino]')")

from libreyolo import SAMPLE_IMAGE, LibreYOLO  # noqa: E402
from libreyolo.errors import CheckpointError, MissingDependencyError  # noqa: E402
from libreyolo.export.compare import compare  # noqa: E402
from libreyolo.export.openvino import BIN, METADATA, XML, folder_content_sha256, write_folder_metadata  # noqa: E402
from libreyolo.results import decoded_predictions  # noqa: E402
from libreyolo.tasks import get_task  # noqa: E402
from tests import mutations  # noqa: E402

DEMO, DEMO_IMGSZ = "LibreYOLO9t-shapes.pt", 128
_MODELS: dict = {}
_REPORTS: dict = {}


@pytest.fixture(scope="module", autouse=True)
def _threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two spinning OpenMP threads stall on a shared 2-core machine
    yield
    torch.set_num_threads(threads)


def _model(case: str):
    if case not in _MODELS:
        if case == "yolo9":
            model = LibreYOLO(DEMO)
            model.imgsz = DEMO_IMGSZ
        else:
            seed = {"rtdetr": 5, "vit": 6, "segformer": 7}[case]
            model = mutations.seeded(case, seed, high_gain=case == "vit")  # rtdetr at high gain scores < 1e-12
            if case == "vit":
                model.net.blocks = model.net.blocks[:2]  # 2 of its 12 identical blocks: CI-sized
        _MODELS[case] = model
    return _MODELS[case]


def _export(case: str, tmp_path_factory):
    if case not in _REPORTS:
        model = _model(case)
        folder = tmp_path_factory.mktemp(f"ov-{case}")
        _REPORTS[case] = model.export(format="openvino", imgsz=model.imgsz, output=folder / f"{case}_openvino_model",
                                      verbose=False)
    return _REPORTS[case]


@pytest.fixture(scope="module")
def demo_ir(tmp_path_factory):
    return _model("yolo9"), _export("yolo9", tmp_path_factory)


def mutate_ir(src: Path, dst: Path, factor: float = 1.01) -> Path:
    """A copy of the IR folder ``src`` with the middle convolution's weights scaled by ``factor``,
    resealed (content hash recomputed), so only its numbers are wrong."""
    import numpy as np
    import openvino as ov

    model = ov.Core().read_model(str(src / XML))
    convs = [op for op in model.get_ops() if op.get_type_name() == "Convolution"]
    conv = convs[len(convs) // 2]
    weight = conv.input_value(1).get_node()
    assert weight.get_type_name() == "Constant", weight.get_type_name()
    scaled = ov.opset13.constant(np.asarray(weight.get_data(), dtype=np.float32) * factor)
    conv.input(1).replace_source_output(scaled.output(0))
    dst.mkdir()
    ov.save_model(model, str(dst / XML), compress_to_fp16=False)
    meta = json.loads((src / METADATA).read_text())
    from libreyolo.export.metadata import stamp

    write_folder_metadata(dst, meta, stamp(meta, folder_content_sha256(dst)))
    return dst


def _same_predictions(model, runtime, imgsz: int) -> dict:
    """The sample image through both predict()s: the same predictions, without tie allowances (at the
    highest conf of 0.05, 0.02, 0.01, 0.001 where eager predicts something: seeded models score low)."""
    task = get_task(model.task)
    for conf in (0.05, 0.02, 0.01, 0.001):
        kw = {"imgsz": imgsz, **({"conf": conf} if "conf" in task.options else {})}
        eager = model.predict(SAMPLE_IMAGE, **kw)
        if len(decoded_predictions(model.task, eager).get("conf", [0])):
            break
    e, a = decoded_predictions(model.task, eager), decoded_predictions(model.task, runtime.predict(SAMPLE_IMAGE, **kw))
    m = task.matcher()(e, a, score_tol=1e-4, conf=conf, max_det=300, iou_min=0.99, nms_iou=0.45)
    assert m["passed"] and m.get("tie_swaps", 0) == 0, m
    return m


@pytest.mark.parametrize("case", ["yolo9", "rtdetr", "vit", "segformer"])
def test_an_ir_validates_against_eager_and_predicts_like_it(case, tmp_path_factory):
    report = _export(case, tmp_path_factory)
    v = report.validation
    assert v.status == "passed", v.text()
    assert mutations.worst_ratio(v) <= 1.0
    assert v.runtime.startswith("openvino ") and "f32 inference" in v.runtime
    assert sorted(p.name for p in report.path.iterdir()) == [METADATA, BIN, XML]
    assert report.path.name == f"{case}_openvino_model"
    runtime = LibreYOLO(report.path)
    assert runtime.format == "openvino" and runtime.precision == "f32"
    m = _same_predictions(_model(case), runtime, _model(case).imgsz)
    assert m["eager"] > 0, m


@pytest.mark.parametrize("case", ["yolo9", "rtdetr", "vit", "segformer"])
def test_a_mutated_ir_is_refused_by_compare(case, tmp_path_factory):
    """The IR with one convolution x1.01 (resealed: it loads like an honest file) against the true model."""
    report = _export(case, tmp_path_factory)
    wrong = mutate_ir(report.path, tmp_path_factory.mktemp(f"ov-wrong-{case}") / "w_openvino_model")
    result = compare(_model(case), wrong)
    assert result.status == "failed", result.text()
    assert mutations.worst_ratio(result) > 1.0 or any(not d["passed"] for d in result.decoded)


def test_metadata_records_and_the_runtime_enforces_the_validated_precision(demo_ir):
    _, report = demo_ir
    meta = json.loads((report.path / METADATA).read_text())
    assert meta["format"] == "openvino" and meta["precision"] == "fp32"
    assert meta["runtime_config"] == {"INFERENCE_PRECISION_HINT": "f32"}
    assert meta["versions"]["openvino"] and meta["validation"]["status"] == "passed"
    runtime = LibreYOLO(report.path)
    assert runtime.compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name() == "f32"
    # what OpenVINO's CPU default would change, measured at export and stored with the report
    effect = meta["validation"]["findings"]["cpu_default_precision"]
    assert effect["validated_precision"] == "f32"
    default = runtime.with_config({}).precision
    assert effect["default_precision"] == default
    if default != "f32":  # bf16 on CPUs with AVX512-BF16/AMX (this machine): the difference is measured
        assert effect["raw"]["predictions"]["max_abs"] > 0 and "kept" in effect["line"]
    assert any("default CPU inference precision" in n for n in report.validation.notes)


def test_tampered_files_and_metadata_are_refused(demo_ir, tmp_path):
    _, report = demo_ir
    bad_bin = shutil.copytree(report.path, tmp_path / "a_openvino_model")
    data = bytearray((bad_bin / BIN).read_bytes())
    data[len(data) // 2] ^= 0x01
    (bad_bin / BIN).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="model bytes do not match"):
        LibreYOLO(bad_bin)
    bad_meta = shutil.copytree(report.path, tmp_path / "b_openvino_model")
    meta = json.loads((bad_meta / METADATA).read_text())
    meta["runtime_config"] = {"INFERENCE_PRECISION_HINT": "bf16"}
    (bad_meta / METADATA).write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="edited after export"):
        LibreYOLO(bad_meta)
    with pytest.raises(CheckpointError, match="runtime_config INFERENCE_PRECISION_HINT='bf16'"):
        LibreYOLO(bad_meta, verify=False)  # the bounds hold without the hashes too
    (bad_meta / METADATA).unlink()
    with pytest.raises(CheckpointError, match="metadata.json is missing"):
        LibreYOLO(bad_meta)


def test_missing_openvino_is_one_line_naming_the_extra_before_any_work(demo_ir, monkeypatch, tmp_path, capsys):
    from libreyolo.cli import main as cli_main

    model, report = demo_ir
    monkeypatch.setitem(sys.modules, "openvino", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'libreyolo\[openvino\]'"):
        model.export(format="openvino", output=tmp_path / "x_openvino_model")
    with pytest.raises(MissingDependencyError, match=r"libreyolo\[openvino\]"):
        LibreYOLO(report.path)
    assert not list(tmp_path.iterdir())  # nothing built
    assert cli_main(["export", f"model={DEMO}", "format=openvino", f"output={tmp_path / 'y_openvino_model'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "libreyolo[openvino]" in err[0], err


def test_an_existing_folder_is_replaced_only_by_a_complete_export(demo_ir, tmp_path, monkeypatch):
    from libreyolo.export.openvino import OpenVINOExporter

    model, report = demo_ir
    target = shutil.copytree(report.path, tmp_path / "demo_openvino_model")
    (target / "marker").write_text("old")

    def broken(self, module, example, path, opts, work):
        path.mkdir()
        (path / XML).write_text("<half")
        raise RuntimeError("conversion died half way")

    monkeypatch.setattr(OpenVINOExporter, "build", broken)
    with pytest.raises(RuntimeError, match="half way"):
        model.export(format="openvino", imgsz=DEMO_IMGSZ, output=target, verbose=False)
    assert (target / "marker").read_text() == "old" and (target / BIN).is_file()  # the old folder, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]  # no work folder left behind
    monkeypatch.undo()
    done = model.export(format="openvino", imgsz=DEMO_IMGSZ, output=target, verbose=False, validate=False)
    assert done.path == target and not (target / "marker").exists()  # replaced as a whole
    assert LibreYOLO(target).predict(SAMPLE_IMAGE).boxes is not None


@pytest.fixture(scope="module")
def shapes_val(tmp_path_factory) -> Path:
    from libreyolo.train.shapes import make_shapes_dataset

    return make_shapes_dataset(tmp_path_factory.mktemp("ov-shapes"), n_train=4, n_val=4, imgsz=DEMO_IMGSZ, seed=3)


def test_val_of_an_ir_gives_the_eager_metrics(demo_ir, shapes_val):
    pytest.importorskip("faster_coco_eval", reason="mAP needs libreyolo[train]")
    model, report = demo_ir
    kw = {"data": str(shapes_val), "imgsz": DEMO_IMGSZ, "batch": 4, "workers": 0}
    eager, ir = model.val(**kw), LibreYOLO(report.path).val(**kw)
    assert eager["mAP50-95"] > 0.5, eager
    for key in ("mAP50-95", "mAP50", "recall"):
        assert abs(eager[key] - ir[key]) <= 1e-6, (key, eager[key], ir[key])


def test_the_batcher_and_the_http_server_serve_an_ir_like_its_predict(demo_ir):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from libreyolo.serve import Batcher, create_app

    _, report = demo_ir
    runtime = LibreYOLO(report.path)
    image = Path(SAMPLE_IMAGE).read_bytes()
    direct = runtime.predict(SAMPLE_IMAGE, conf=0.05)
    with Batcher(runtime, max_batch=4, max_wait_ms=50, conf=0.05) as batcher:
        futures = [batcher.submit(image) for _ in range(3)]
        results = [f.result(timeout=120) for f in futures]
    assert len(direct) > 0
    for r in results:
        assert all(torch.equal(getattr(r.boxes, k), getattr(direct.boxes, k)) for k in ("xyxy", "conf", "cls"))
    with TestClient(create_app(runtime, max_batch=2, conf=0.05)) as client:
        info = client.get("/info").json()
        assert info["model"]["runtime"] == "OpenVINOPredictor", info
        body = client.post("/predict", content=image).json()
    assert body["predictions"] == direct.summary()


def test_cli_predict_and_compare_take_the_folder(demo_ir, tmp_path, capsys):
    from libreyolo.cli import main as cli_main

    _, report = demo_ir
    assert cli_main(["predict", f"model={report.path}", f"source={SAMPLE_IMAGE}", f"save_dir={tmp_path}"]) == 0
    assert (tmp_path / Path(SAMPLE_IMAGE).name).is_file()
    capsys.readouterr()
    assert cli_main(["compare", f"model={DEMO}", f"artifact={report.path}/"]) == 0  # a trailing slash too
    assert capsys.readouterr().out.startswith("validation: passed (openvino")


def test_an_fp16_ir_holds_half_weights_and_validates_at_f32_inference(demo_ir, tmp_path):
    model, fp32 = demo_ir
    half = model.export(format="openvino", imgsz=DEMO_IMGSZ, half=True, output=tmp_path / "h_openvino_model",
                        verbose=False)
    assert half.validation.status == "passed", half.validation.text()
    assert half.metadata["precision"] == "fp16" and half.metadata["input_dtype"] == "float32"
    assert half.metadata["runtime_config"] == {"INFERENCE_PRECISION_HINT": "f32"}
    size, full = (half.path / BIN).stat().st_size, (fp32.path / BIN).stat().st_size
    assert 0.45 * full < size < 0.55 * full, (size, full)  # float16 weights
    assert any("fp16 drift" in n for n in half.validation.notes)


@pytest.fixture(scope="module")
def int8_data(tmp_path_factory):
    from libreyolo.train.shapes import make_shapes_dataset

    return make_shapes_dataset(tmp_path_factory.mktemp("ov-int8-shapes"), n_train=8, n_val=6, imgsz=DEMO_IMGSZ, seed=3)


@pytest.fixture(scope="module")
def demo_int8(int8_data, tmp_path_factory):
    """The demo detector's NNCF INT8 IR, calibrated on 8 generated shapes images and gated on 6."""
    pytest.importorskip("nncf", reason="INT8 OpenVINO export needs nncf (pip install 'libreyolo[openvino]')")
    pytest.importorskip("faster_coco_eval", reason="the accuracy gate needs libreyolo[train] (mAP)")
    report = _model("yolo9").export(format="openvino", imgsz=DEMO_IMGSZ, int8=True, data=str(int8_data),
                                    output=tmp_path_factory.mktemp("ov-int8") / "i_openvino_model", verbose=False)
    return report


def test_an_nncf_int8_ir_validates_and_keeps_the_demo_map_within_the_gate(demo_int8):
    import openvino as ov

    v = demo_int8.validation
    assert v.status == "passed", v.text()
    gate = demo_int8.metadata["validation"]["accuracy"]
    assert gate["metric"] == "mAP50-95" and gate["passed"] and gate["drop"] <= gate["max_drop"] == 0.02, gate
    assert gate["float"] > 0.5  # a trained detector: a broken artifact would show
    q = demo_int8.metadata["quantization"]
    assert demo_int8.metadata["precision"] == "int8" and q["calibrated"] == "at export"
    assert q["nncf_fake_quantize_ops"] > 100 and q["nncf_float_layers"] == len(q["excluded"]) > 0
    ops = {op.get_type_name() for op in ov.Core().read_model(str(demo_int8.path / XML)).get_ops()}
    assert "FakeQuantize" in ops
    runtime = LibreYOLO(demo_int8.path)
    assert runtime.precision == "f32" and len(runtime.predict(SAMPLE_IMAGE, conf=0.25).boxes) > 0
    runtime.with_config({})  # the NNCF IR also compiles with OpenVINO's CPU defaults


def test_nncf_leaves_the_float_layers_and_the_decode_unquantized(demo_ir, demo_int8):
    """No FakeQuantize feeds a layer quantize() keeps in float (matched through OpenVINO's
    ``<name>/WithoutBiases`` split of a biased Conv) or an operation of the decode they feed (the
    level concat, the box/class split, the DFL softmax and expectation). Fails on the previous
    ignored scope, which named the bias Add: the 6 prediction convolutions then had quantized inputs
    and the decode's concat/split and DFL sum too (the demo at 640 lost 0.060 mAP50-95)."""
    import openvino as ov

    from libreyolo.export.onnx import node_module
    from libreyolo.export.openvino import WEIGHTED_OPS, float_scope

    excluded = set(demo_int8.metadata["quantization"]["excluded"])
    float_ir = ov.Core().read_model(str(demo_ir[1].path / XML))
    names = {op.get_friendly_name().split("/WithoutBiases")[0] for op in float_ir.get_ops()
             if op.get_type_name() in WEIGHTED_OPS}
    layers = sorted(n for n in names if node_module(n) in excluded)
    layer_ops, fed_ops = float_scope(float_ir, layers)
    assert len(layers) == len(excluded) == 6 and len(layer_ops) == 6, (layers, layer_ops)
    kinds = {op.get_type_name() for op in float_ir.get_ops() if op.get_friendly_name() in set(fed_ops)}
    assert {"Softmax", "ReduceSum", "Sigmoid", "Concat"} <= kinds, kinds
    assert not kinds & set(WEIGHTED_OPS)  # the walk stops at quantized layers
    quantized = ov.Core().read_model(str(demo_int8.path / XML))
    fed_by_fq = {t.get_node().get_friendly_name() for op in quantized.get_ops() if op.get_type_name() == "FakeQuantize"
                 for t in op.output(0).get_target_inputs()}
    wrong = fed_by_fq & (set(layer_ops) | set(fed_ops))
    assert fed_by_fq and not wrong, sorted(wrong)
    assert demo_int8.metadata["quantization"]["nncf_float_operations"] == len(fed_ops)


def test_benchmark_takes_an_ir_folder_and_compare_an_int8_ir_with_its_data(demo_ir, demo_int8, int8_data, capsys):
    """`libreyolo benchmark` on an IR folder (its recorded validation, timed) and `compare` of the INT8 IR
    against the quantized model rebuilt from its calibration data (exit 0); without data= it is refused."""
    from libreyolo.cli import main as cli_main

    assert cli_main(["benchmark", f"model={demo_ir[1].path}", "n=2"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("openvino")]
    assert len(rows) == 1 and rows[0].split()[2] == "passed", rows
    assert cli_main(["compare", f"model={DEMO}", f"artifact={demo_int8.path}", f"data={int8_data}"]) == 0
    assert capsys.readouterr().out.startswith("validation: passed (openvino")
    assert cli_main(["compare", f"model={DEMO}", f"artifact={demo_int8.path}"]) != 0
