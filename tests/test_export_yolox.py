"""YOLOX-n exported to ONNX and ExecuTorch, validated against eager (decoded ``predictions`` output)."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import pytest
import torch

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from tests.test_export_common import FUSED_OR_CUSTOM, STANDARD_ONNX_OPS, assert_same_detections, seeded_weights

IMGSZ = 320
PREDICT_CONF = 0.2  # a few dozen detections on the sample image, scores well apart


@lru_cache(maxsize=2)
def seeded_yolox(seed: int = 0, imgsz: int = IMGSZ) -> Any:
    """YOLOX-n with the compat fixtures' weight rule and a head calibrated on the sample image.

    Like the yolox-n fixture's overrides: class logits scaled, objectness and box-size biases
    raised; then each class's bias is set so that its best cell on the sample image (letterboxed
    at ``imgsz``) scores a distinct probability in 0.011 .. 0.27. Detections then spread over
    ~20-40 classes and survive float noise (a relative 1e-6 weight perturbation changes nothing).
    """
    from libreyolo.data.sources import load_sources

    model = seeded_weights(LibreYOLO("LibreYOLOXn.yaml"), seed, spread=False)
    head = model.net.head
    with torch.no_grad():
        for key, t in model.net.state_dict().items():
            if key.startswith("head.cls_preds.") and key.endswith(".weight"):
                t.mul_(80.0)
            elif key.startswith("head.obj_preds.") and key.endswith(".bias"):
                t.add_(6.0)
            elif key.startswith("head.reg_preds.") and key.endswith(".bias"):
                t.add_(1.5)
        logits: list[torch.Tensor] = []
        hooks = [conv.register_forward_hook(lambda mod, args, out: logits.append(out)) for conv in head.cls_preds]
        batch, _ = model.family.letterbox(imgsz)([load_sources(SAMPLE_IMAGE)[0].data])
        model.net(batch)
        for h in hooks:
            h.remove()
        g = torch.Generator().manual_seed(seed + 7)
        for conv, lg in zip(head.cls_preds, logits, strict=True):
            peak = lg.amax(dim=(0, 2, 3)) - conv.bias
            conv.bias.copy_(-4.5 + 3.5 * torch.rand(peak.shape, generator=g) - peak)
    return model


_ARTIFACTS: dict[tuple, Any] = {}


def _exported(tmp_path_factory: pytest.TempPathFactory, fmt: str, suffix: str, **opts: Any) -> Any:
    key = (fmt, tuple(sorted(opts.items())))
    if key not in _ARTIFACTS:
        folder = tmp_path_factory.mktemp(f"yolox-{fmt}")
        _ARTIFACTS[key] = seeded_yolox().export(format=fmt, imgsz=IMGSZ, output=folder / f"n{suffix}",
                                                verbose=False, **opts)
    return _ARTIFACTS[key]


@pytest.fixture(scope="module")
def onnx_static(tmp_path_factory):
    pytest.importorskip("onnxruntime")
    return _exported(tmp_path_factory, "onnx", ".onnx")


@pytest.fixture(scope="module")
def pte(tmp_path_factory):
    pytest.importorskip("executorch.exir", reason="executorch is not installed (pip install 'libreyolo[executorch]')")
    return _exported(tmp_path_factory, "executorch", ".pte")


def test_seeded_detections_survive_float_noise():
    from tests.compat_utils import set_match

    a = seeded_yolox().predict(SAMPLE_IMAGE, conf=PREDICT_CONF, imgsz=IMGSZ)
    noisy = LibreYOLO("LibreYOLOXn.yaml")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for t, src in zip(noisy.net.state_dict().values(), seeded_yolox().net.state_dict().values(), strict=True):
            t.copy_(src * (1 + 1e-6 * torch.randn(src.shape, generator=g)) if src.is_floating_point() else src)
    c = noisy.predict(SAMPLE_IMAGE, conf=PREDICT_CONF, imgsz=IMGSZ)
    dets = lambda r: {"xyxy": r.boxes.xyxy, "conf": r.boxes.conf, "cls": r.boxes.cls}  # noqa: E731
    assert len(a) >= 10 and set_match(dets(a), dets(c)) == (1.0, 1.0)


def test_onnx_artifact_validates_against_eager_and_predicts_the_same(onnx_static):
    v = onnx_static.validation
    assert v.status == "passed", v.text()
    assert {c["output"] for c in v.checks} == {"predictions", "preprocessing"}
    assert {c["group"] for c in v.checks if c["output"] == "predictions"} == {"predictions/box", "predictions/score"}
    assert v.worst()["worst_ratio"] <= 1.0 and all(d["passed"] for d in v.detections)
    eager = seeded_yolox().predict(SAMPLE_IMAGE, conf=PREDICT_CONF, imgsz=IMGSZ)
    art = LibreYOLO(onnx_static.path).predict(SAMPLE_IMAGE, conf=PREDICT_CONF)
    assert len(eager) >= 10
    assert_same_detections(eager, art, conf=PREDICT_CONF)


def test_onnx_graph_holds_only_standard_ops_and_records_the_preprocessing(onnx_static):
    from libreyolo.export.base import get_exporter

    ops = get_exporter("onnx").graph_ops(onnx_static.path)
    assert ops <= STANDARD_ONNX_OPS, ops - STANDARD_ONNX_OPS
    assert not [op for op in ops if any(bad.lower() in op.lower() for bad in FUSED_OR_CUSTOM)]
    meta = LibreYOLO(onnx_static.path).metadata
    assert meta["family"] == "yolox" and meta["letterbox"]["channels"] == "BGR"
    assert meta["normalization"]["color"] == "BGR" and meta["normalization"]["scale"] == 1.0


def test_executorch_artifact_validates_against_eager_and_predicts_the_same(pte):
    v = pte.validation
    assert v.status == "passed", v.text()
    assert v.runtime.startswith("executorch")
    assert v.worst()["worst_ratio"] <= 1.0 and all(d["passed"] for d in v.detections)
    eager = seeded_yolox().predict(SAMPLE_IMAGE, conf=PREDICT_CONF, imgsz=IMGSZ)
    assert_same_detections(eager, LibreYOLO(pte.path).predict(SAMPLE_IMAGE, conf=PREDICT_CONF), conf=PREDICT_CONF)


def test_export_contract_covers_every_format():
    from libreyolo.models.registry import get_family

    contract = get_family("yolox").export
    assert contract.output_names == ("predictions",) and contract.nms_input == "predictions"
    assert contract.dynamic_batch and contract.dynamic_spatial
    assert {g.kind for g in contract.groups} == {"box", "score"}  # boxes by their extent, scores absolute
    assert set(contract.min_cosine) >= {"fp32", "fp16"}  # TensorRT fp16 engines are validated at fp16
