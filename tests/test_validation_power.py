"""The validator's power, measured: correct artifacts pass at several seeds and at high activation
gain (the situation of the refused yolox-s and rtdetr-r34 checkpoints), and every wrong artifact
of the mutation suite is refused. docs/export.md records the counts and ratios
(``python tools/validation_survey.py`` runs the longer survey)."""
from __future__ import annotations

import pytest

from libreyolo.export.compare import compare
from tests import mutations

pytest.importorskip("onnxruntime")

# (family, seed, high gain): CI-sized; the survey tool runs more seeds
TRUE_CASES = [("yolo9", 1, False), ("yolo9", 2, True), ("yolox", 3, False), ("yolox", 4, True),
              ("rtdetr", 5, True), ("vit", 6, True), ("segformer", 7, False), ("segformer", 8, True)]
_MODELS: dict = {}
_ARTIFACTS: dict = {}


def _model(family: str, seed: int, high_gain: bool):
    key = (family, seed, high_gain)
    if key not in _MODELS:
        _MODELS[key] = mutations.seeded(family, seed, high_gain)
    return _MODELS[key]


def _export(tmp_path_factory, model, tag: str, fmt: str = "onnx", validate: bool = True):
    key = (tag, fmt, validate)
    if key not in _ARTIFACTS:
        folder = tmp_path_factory.mktemp("power")
        suffix = {"onnx": ".onnx", "executorch": ".pte"}[fmt]
        _ARTIFACTS[key] = model.export(format=fmt, imgsz=model.imgsz, output=folder / f"a{suffix}",
                                       validate=validate, verbose=False)
    return _ARTIFACTS[key]


@pytest.mark.parametrize("family,seed,high_gain", TRUE_CASES)
def test_an_artifact_of_the_true_weights_validates(tmp_path_factory, family, seed, high_gain):
    model = _model(family, seed, high_gain)
    report = _export(tmp_path_factory, model, f"{family}-{seed}-{high_gain}").validation
    assert report.status == "passed", report.text()
    assert mutations.worst_ratio(report) <= 1.0


def test_high_gain_yolox_has_the_refused_checkpoints_cancelling_box_corners():
    """The high-gain recipe reproduces the field case: boxes hundreds of pixels wide whose corner
    (centre - half width) is far smaller than its operands, at near-zero scores."""
    import torch

    model = _model("yolox", 4, True)
    with torch.inference_mode():
        pred = model.family.named_outputs(model.net(255 * torch.rand(1, 3, 160, 160)))["predictions"]
    x1, x2 = pred[0, 0], pred[0, 2]
    width = x2 - x1
    assert float(width.max()) > 300
    assert float((x1.abs() / width).min()) < 0.01  # cancellation: |x1| a hundredth of its operands
    assert float(pred[0, 4:].amax(0).median()) < 0.05  # most of them at near-zero scores


@pytest.mark.parametrize("mutation", sorted(mutations.MODEL_MUTATIONS))
@pytest.mark.parametrize("family,seed,high_gain", [("yolo9", 1, False), ("yolox", 4, True), ("rtdetr", 5, True),
                                                   ("vit", 6, True), ("segformer", 8, True)])
def test_a_wrong_artifact_is_refused(tmp_path_factory, family, seed, high_gain, mutation):
    model = _model(family, seed, high_gain)
    wrong = mutations.MODEL_MUTATIONS[mutation](model)
    artifact = _export(tmp_path_factory, wrong, f"{family}-{seed}-{high_gain}-{mutation}", validate=False)
    report = compare(model, artifact.path)
    assert report.status == "failed", report.text()
    assert mutations.worst_ratio(report) > 1.0 or any(not d["passed"] for d in report.detections)


@pytest.mark.parametrize("family,seed,high_gain", [("yolo9", 2, True), ("yolox", 4, True), ("rtdetr", 5, True),
                                                   ("vit", 6, True), ("segformer", 8, True)])
def test_every_output_scaled_by_one_permille_is_refused_by_the_error_distribution(tmp_path_factory, family, seed,
                                                                                  high_gain):
    """A systematic error that may stay within the largest element's allowance (an ill-conditioned
    model's own float32 error can exceed 0.1% of a value) moves the error distribution's quantiles
    far past the eager model's: the correct artifact's outputs scaled by 1.001 at run time."""
    from libreyolo.api import LibreYOLO

    model = _model(family, seed, high_gain)
    artifact = _export(tmp_path_factory, model, f"{family}-{seed}-{high_gain}")
    runtime = LibreYOLO(artifact.path)
    real = runtime._forward
    runtime._forward = lambda batch, **kw: {k: v * 1.001 if v.is_floating_point() else v
                                            for k, v in real(batch, **kw).items()}
    report = compare(model, runtime)
    assert report.status == "failed"
    assert [c for c in report.checks if c["probe"] == "all probes" and not c["passed"]], report.text()


@pytest.mark.parametrize("family,seed,high_gain", [("yolo9", 1, False), ("vit", 6, True)])
def test_a_runtime_with_other_preprocessing_is_refused(tmp_path_factory, family, seed, high_gain):
    from libreyolo.api import LibreYOLO
    from libreyolo.export.base import ExportOptions, get_exporter
    from libreyolo.export.validate import validate_artifact

    model = _model(family, seed, high_gain)
    artifact = _export(tmp_path_factory, model, f"{family}-{seed}-{high_gain}")
    runtime = mutations.wrong_preprocessing(LibreYOLO(artifact.path))
    opts = ExportOptions("onnx", model.imgsz)
    report = validate_artifact(model, get_exporter("onnx"), artifact.path, opts, runtime=runtime)
    assert report.status == "failed"
    assert [c for c in report.checks if c["output"] == "preprocessing" and not c["passed"]], report.text()


def test_metadata_that_claims_other_preprocessing_is_refused_at_load(tmp_path_factory):
    """A padding value changed in the artifact's metadata (hashes recomputed) no longer matches the
    family's preprocessing: the runtime refuses the file before anything runs."""
    import shutil

    import onnx

    from libreyolo.api import LibreYOLO
    from libreyolo.errors import CheckpointError
    from libreyolo.export.base import get_exporter
    from libreyolo.export.metadata import decode, stamp

    model = _model("yolo9", 1, False)
    artifact = _export(tmp_path_factory, model, "yolo9-1-False")
    bad = tmp_path_factory.mktemp("pad") / "pad.onnx"
    shutil.copy(artifact.path, bad)
    meta = decode({p.key: p.value for p in onnx.load(str(bad)).metadata_props}, str(bad))
    meta["letterbox"]["pad_value"] = 0.0
    exporter = get_exporter("onnx")
    exporter.write_metadata(bad, stamp(meta, exporter.content_sha256(bad)), meta)
    with pytest.raises(CheckpointError, match="preprocess"):
        LibreYOLO(bad)


def test_executorch_artifacts_of_the_high_gain_yolox_validate_and_a_wrong_one_is_refused(tmp_path_factory):
    pytest.importorskip("executorch")
    model = mutations.seeded("yolox", 4, True)
    model.imgsz = 96
    report = _export(tmp_path_factory, model, "yolox-4-True-96", fmt="executorch").validation
    assert report.status == "passed", report.text()
    wrong = mutations.scale_one_conv(model)
    artifact = _export(tmp_path_factory, wrong, "yolox-4-True-96-conv", fmt="executorch", validate=False)
    assert compare(model, artifact.path).status == "failed"
