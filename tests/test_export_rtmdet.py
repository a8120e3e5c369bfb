"""RTMDet-t exported to ONNX and ExecuTorch, validated against eager, predicting the same detections;
converted to CoreML (which predicts, and so validates, on macOS only).

The network takes the normalised BGR tensor (``image_input=False``); its artifacts record the
mean/std, and ``LibreYOLO(artifact).predict`` preprocesses exactly as eager does (checked by the
validator bit for bit, and here through the detections).
"""
from __future__ import annotations

import sys
from functools import lru_cache
from typing import Any

import pytest
import torch

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from tests.test_export_common import FUSED_OR_CUSTOM, STANDARD_ONNX_OPS, assert_same_detections, seeded_weights

IMGSZ = 160
COREML_IMGSZ = 64  # off macOS only the conversion runs (a few seconds); macOS also validates it
PREDICT_CONF = 0.2


@lru_cache(maxsize=1)
def seeded_rtmdet(seed: int = 0) -> Any:
    """RTMDet-t with seeded weights and each class's best point on the sample image at a distinct
    probability in 0.011 .. 0.27 (as the yolox export tests calibrate theirs): a few dozen
    detections over many classes, none decided by float rounding."""
    from libreyolo.data.sources import load_sources

    model = seeded_weights(LibreYOLO("LibreRTMDett.yaml"), seed, spread=False)
    head = model.net.head
    with torch.no_grad():
        for conv in head.rtm_reg:
            conv.bias.add_(1.0)  # boxes of a few strides, not points
        logits: list[torch.Tensor] = []
        hooks = [conv.register_forward_hook(lambda mod, args, out: logits.append(out)) for conv in head.rtm_cls]
        batch, _ = model.family.letterbox(IMGSZ)([load_sources(SAMPLE_IMAGE)[0].data])
        model.net(batch)
        for h in hooks:
            h.remove()
        g = torch.Generator().manual_seed(seed + 7)
        for conv, lg in zip(head.rtm_cls, logits, strict=True):
            conv.weight.mul_(8.0)
            peak = 8.0 * (lg.amax(dim=(0, 2, 3)) - conv.bias) + conv.bias
            conv.bias.copy_(-4.5 + 3.5 * torch.rand(peak.shape, generator=g) - (peak - conv.bias))
    return model


_ARTIFACTS: dict[str, Any] = {}


def _exported(tmp_path_factory: pytest.TempPathFactory, fmt: str, suffix: str, **opts: Any) -> Any:
    if fmt not in _ARTIFACTS:
        folder = tmp_path_factory.mktemp(f"rtmdet-{fmt}")
        _ARTIFACTS[fmt] = seeded_rtmdet().export(format=fmt, imgsz=IMGSZ, output=folder / f"t{suffix}",
                                                 verbose=False, **opts)
    return _ARTIFACTS[fmt]


@pytest.fixture(scope="module")
def onnx_dynamic(tmp_path_factory):
    pytest.importorskip("onnxruntime")
    return _exported(tmp_path_factory, "onnx", ".onnx", dynamic=True)


@pytest.fixture(scope="module")
def pte(tmp_path_factory):
    pytest.importorskip("executorch.exir", reason="executorch is not installed (pip install 'libreyolo[executorch]')")
    return _exported(tmp_path_factory, "executorch", ".pte")


@pytest.fixture(scope="module")
def coreml_package(tmp_path_factory):
    pytest.importorskip("coremltools", reason="coremltools is not installed (pip install 'libreyolo[coreml]')")
    return seeded_rtmdet().export(format="coreml", imgsz=COREML_IMGSZ,
                                  output=tmp_path_factory.mktemp("rtmdet-coreml") / "t.mlpackage", verbose=False)


def _eager():
    return seeded_rtmdet().predict(SAMPLE_IMAGE, conf=PREDICT_CONF, imgsz=IMGSZ)


def test_seeded_rtmdet_has_enough_detections_to_compare():
    r = _eager()
    assert len(r) >= 10 and len(set(r.boxes.cls.tolist())) >= 5


def test_onnx_artifact_validates_and_predicts_the_same_detections(onnx_dynamic):
    v = onnx_dynamic.validation
    assert v.status == "passed", v.text()
    assert {c["group"] for c in v.checks if c["output"] == "predictions"} == {"predictions/box", "predictions/score"}
    assert any("x" in c["probe"] and c["probe"].split("x")[0].isdigit() for c in v.checks), \
        "the dynamic height/width probe was not run"
    assert all(d["passed"] for d in v.detections)
    art = LibreYOLO(onnx_dynamic.path)
    assert_same_detections(_eager(), art.predict(SAMPLE_IMAGE, conf=PREDICT_CONF), conf=PREDICT_CONF)
    meta = art.metadata
    assert meta["letterbox"]["channels"] == "BGR" and meta["letterbox"]["mean"] == [103.53, 116.28, 123.675]


def test_onnx_graph_holds_only_standard_ops(onnx_dynamic):
    from libreyolo.export.base import get_exporter

    ops = get_exporter("onnx").graph_ops(onnx_dynamic.path)
    allowed = STANDARD_ONNX_OPS | {"ReduceMean"}  # CSPNeXt's channel attention pools globally
    assert ops <= allowed, ops - allowed
    assert not [op for op in ops if any(bad.lower() in op.lower() for bad in FUSED_OR_CUSTOM)]


def test_executorch_artifact_validates_and_predicts_the_same_detections(pte):
    v = pte.validation
    assert v.status == "passed", v.text()
    assert v.runtime.startswith("executorch") and all(d["passed"] for d in v.detections)
    assert_same_detections(_eager(), LibreYOLO(pte.path).predict(SAMPLE_IMAGE, conf=PREDICT_CONF), conf=PREDICT_CONF)


def test_a_wrong_artifact_is_refused(onnx_dynamic, tmp_path):
    """The same validator on the artifact's runtime with one class bias moved: it must fail."""
    from libreyolo.export.base import ExportOptions, get_exporter
    from libreyolo.export.validate import validate_artifact

    wrong = LibreYOLO("LibreRTMDett.yaml")
    wrong.net.load_state_dict(seeded_rtmdet().net.state_dict())
    with torch.no_grad():
        wrong.net.head.rtm_cls[0].bias[3] += 0.05
    opts = ExportOptions("onnx", IMGSZ, dynamic=True, dynamic_spatial=True)
    report = validate_artifact(wrong, get_exporter("onnx"), onnx_dynamic.path, opts)
    assert report.status == "failed", report.text()


# CSPNeXt's channel attention: a global mean and a hard sigmoid; SPPF: max pools
RTMDET_MIL_OPS = {"add", "concat", "const", "conv", "max_pool", "mul", "reduce_mean", "reshape", "sigmoid",
                  "sigmoid_hard", "silu", "slice_by_index", "sub", "upsample_nearest_neighbor", "transpose",
                  "real_div", "cast", "expand_dims", "squeeze", "split"}


def test_coreml_package_takes_the_normalised_tensor_and_is_portable_ops(coreml_package):
    import coremltools as ct

    from libreyolo.export.coreml import mlpackage_ops

    path = coreml_package.path
    assert path.is_dir() and (path / "Manifest.json").is_file()
    ops = mlpackage_ops(path)
    assert "conv" in ops and ops <= RTMDET_MIL_OPS, sorted(ops - RTMDET_MIL_OPS)
    spec = ct.models.MLModel(str(path), skip_model_load=True).get_spec()
    (inp,) = spec.description.input
    # image_input=False: a float tensor of the BGR mean/std-normalised image, not an 8-bit ImageType
    assert inp.type.WhichOneof("Type") == "multiArrayType"
    assert list(inp.type.multiArrayType.shape) == [1, 3, COREML_IMGSZ, COREML_IMGSZ]
    assert [o.name for o in spec.description.output] == ["predictions"]


def test_coreml_metadata_and_report_are_honest_about_validation(coreml_package):
    from libreyolo.runtimes.coreml import read_metadata

    meta = read_metadata(coreml_package.path)
    assert meta["family"] == "rtmdet" and meta["normalization"]["color"] == "BGR"
    assert meta["normalization"]["mean"] == [103.53, 116.28, 123.675] and meta["normalization"]["scale"] == 1.0
    if sys.platform == "darwin":
        assert coreml_package.validation.status == "passed", coreml_package.validation.text()
    else:
        assert coreml_package.validation.status == "not validated"
        assert coreml_package.validation.headline() == "not validated: CoreML runs only on macOS"
        assert meta["validation"]["status"] == "not validated"
