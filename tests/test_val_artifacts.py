"""val() on exported artifacts: the eager model's metrics, from the same code, on the same data.

The demo detector (``LibreYOLO9t-shapes.pt``, trained on the shapes dataset) is validated on a
small generated shapes val split at imgsz 160, eager and through each artifact's runtime.

Tolerance: the artifacts' raw outputs differ from eager by ~1e-5 (float32 rounding of another
kernel order). mAP depends only on the ranking of the detections by score and on whether their
IoU with a ground-truth box clears each threshold (0.50..0.95); with a trained detector no two
scores on these images are within 1e-5 of each other and no IoU lies within 1e-5 of a threshold,
so the metrics are identical (measured: equal in every printed digit). ``1e-9`` leaves room only
for the float summation of the metric itself; a single changed detection moves mAP50-95 of
this 8-image split by more than 1e-3.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("faster_coco_eval", reason="mAP needs libreyolo[train] (faster-coco-eval)")

from libreyolo import LibreYOLO  # noqa: E402
from libreyolo.cli import main as cli_main  # noqa: E402
from libreyolo.errors import ArgumentError  # noqa: E402
from libreyolo.train.shapes import make_shapes_dataset  # noqa: E402
from tests.conftest import DEMO_IMGSZ  # noqa: E402

IMGSZ = DEMO_IMGSZ  # 160: the demo ExecuTorch program (conftest.demo_pte) is exported at it
TOL = 1e-9
VAL = {"batch": 4, "workers": 0}


@pytest.fixture(scope="session")
def shapes_val(tmp_path_factory) -> Path:
    return make_shapes_dataset(tmp_path_factory.mktemp("val-shapes"), n_train=1, n_val=8, imgsz=IMGSZ, seed=3)


@pytest.fixture(scope="session")
def eager_metrics(demo, shapes_val) -> dict[str, float]:
    metrics = demo.val(data=str(shapes_val), imgsz=IMGSZ, **VAL)
    assert metrics["mAP50-95"] > 0.5, metrics  # a trained detector: a drop would be visible
    return metrics


def _same(a: dict[str, float], b: dict[str, float]) -> None:
    for key in ("mAP50-95", "mAP50", "recall"):
        assert abs(a[key] - b[key]) <= TOL, (key, a[key], b[key])
    assert a["images"] == b["images"] and a["instances"] == b["instances"]


def test_onnx_artifact_validates_to_the_eager_metrics(demo_onnx, shapes_val, eager_metrics):
    _same(LibreYOLO(demo_onnx).val(data=str(shapes_val), **VAL), eager_metrics)


def test_a_static_batch_artifact_is_fed_in_chunks_of_its_batch(demo, shapes_val, eager_metrics, tmp_path):
    report = demo.export(format="onnx", imgsz=IMGSZ, batch=2, output=tmp_path / "b2.onnx", verbose=False)
    artifact = LibreYOLO(report.path)
    assert artifact.batch == 2 and not artifact.dynamic_batch
    _same(artifact.val(data=str(shapes_val), batch=3, workers=0), eager_metrics)  # 3, 3, 2 -> padded chunks of 2


def test_a_static_size_artifact_refuses_another_imgsz_naming_its_own(demo_onnx, shapes_val):
    with pytest.raises(ArgumentError, match=f"exported for imgsz={IMGSZ} .*validate with imgsz={IMGSZ}"):
        LibreYOLO(demo_onnx).val(data=str(shapes_val), imgsz=IMGSZ + 32, **VAL)


@pytest.mark.parametrize("opts, message", [
    ({"conf": 1.5}, "conf must be a number from 0 to 1, got 1.5"),
    ({"iou": -0.1}, "iou must be a number from 0 to 1, got -0.1"),
    ({"batch": 0}, "batch must be an integer from 1 to 1024, got 0"),
    ({"max_det": 0}, "max_det must be an integer from 1 to 10000, got 0"),
    ({"imgsz": 100}, "imgsz must be a positive multiple of the model stride 32"),
    ({"workers": -1}, "workers must be an integer from 0 to 64, got -1"),
])
def test_val_options_are_checked_the_same_way_for_eager_and_artifacts(demo, demo_onnx, shapes_val, opts, message):
    for model in (demo, LibreYOLO(demo_onnx)):
        with pytest.raises(ArgumentError, match=message):
            model.val(data=str(shapes_val), **{**VAL, **opts})


def test_cli_val_on_an_onnx_artifact_prints_the_eager_metrics(demo_onnx, shapes_val, eager_metrics, capsys):
    assert cli_main(["val", f"model={demo_onnx}", f"data={shapes_val}", "batch=4", "workers=0"]) == 0
    _same(json.loads(capsys.readouterr().out), eager_metrics)


def test_cli_val_on_an_artifact_that_cannot_run_here_is_one_clean_line(shapes_val, tmp_path, capsys):
    import torch

    from libreyolo.export.metadata import write_sidecar

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine may run TensorRT engines")
    engine = tmp_path / "x.engine"
    engine.write_bytes(b"an engine is only ever built where TensorRT runs")
    write_sidecar(engine, {"libreyolo_metadata": "1", "format": "tensorrt", "family": "yolo9", "size": "t",
                           "task": "detect", "names": {"0": "square", "1": "circle", "2": "triangle"},
                           "imgsz": IMGSZ, "batch": 1, "stride": 32, "input_name": "images",
                           "output_names": ["predictions"], "input_dtype": "float32", "precision": "fp32",
                           "dynamic_axes": {}, "letterbox": {"placement": "topleft", "pad_value": 114.0}})
    assert cli_main(["val", f"model={engine}", f"data={shapes_val}", "workers=0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "NVIDIA GPU" in err[0] and "Traceback" not in err[0], err


@pytest.mark.slow
def test_executorch_artifact_validates_to_the_eager_metrics(demo_pte, shapes_val, eager_metrics):
    # the session's one ExecuTorch lowering of the demo (conftest.demo_pte, imgsz 160 = IMGSZ)
    assert demo_pte.validation.status == "passed", demo_pte.validation.text()
    _same(LibreYOLO(demo_pte.path).val(data=str(shapes_val), **VAL), eager_metrics)


def test_a_classifier_artifact_validates_to_the_eager_top1_on_an_image_folder(tmp_path):
    # untrained ViT-ti: its top-2 logits on these 12 images are >= 3e-3 apart (measured), three
    # orders of magnitude above the artifact's ~1e-6 error, so every prediction, and top-1, must agree
    root = make_shapes_dataset(tmp_path / "cls", n_train=3, n_val=12, imgsz=64, seed=1, task="classify")
    model = LibreYOLO("LibreViTti-cls.yaml", nc=3, names=["circle", "square", "triangle"])
    report = model.export(format="onnx", output=tmp_path / "vit.onnx", verbose=False)
    assert report.validation.status == "passed", report.validation.text()
    eager = model.val(data=str(root), batch=6, workers=0)
    assert LibreYOLO(report.path).val(data=str(root), batch=6, workers=0) == eager
