"""YOLOv9-E2E-t exported to ONNX and ExecuTorch: validated against eager (the float64-derived raw-output
checks and the decoded top-k detections), predicting the same detections through ``LibreYOLO(artifact)``;
no NMS in any artifact (the graphs hold no NonMaxSuppression and no TopK: the top-k runs after the
runtime, as eager); a wrong artifact is refused."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import pytest
import torch

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from tests.test_export_common import FUSED_OR_CUSTOM, STANDARD_ONNX_OPS, assert_same_detections, seeded_weights

IMGSZ = 160
PREDICT_CONF = 0.3


@lru_cache(maxsize=1)
def seeded_e2e(seed: int = 0) -> Any:
    """YOLOv9-E2E-t with seeded weights, calibrated on the sample image so that its detections do not
    hinge on float rounding: without NMS, thousands of (anchor, class) pairs of an untrained one-to-one
    head sit within 1e-5 of each other, and which of them make the top 300 would be noise. Here every
    fourth class has the widest gap among its five best anchors' logits centred on PREDICT_CONF, the
    other classes are pushed 8 logits below their best anchor: 1 to 5 detections for each of 20
    classes, far below max_det, none within reach of the threshold."""
    from libreyolo.data.sources import load_sources

    model = seeded_weights(LibreYOLO("LibreYOLO9E2Et.yaml"), seed, spread=False)
    convs = [tower[2] for tower in model.net.head.one2one_cv3]
    with torch.no_grad():
        for conv in convs:
            conv.weight.mul_(8.0)  # class logits that differ between anchors by more than noise
        logits: list[torch.Tensor] = []
        hooks = [conv.register_forward_hook(lambda mod, args, out: logits.append(out)) for conv in convs]
        batch, _ = model.family.letterbox(IMGSZ)([load_sources(SAMPLE_IMAGE)[0].data])
        model.net.eval()(batch)
        for h in hooks:
            h.remove()
        ranked = torch.cat([lg[0].flatten(1) for lg in logits], 1).sort(dim=1, descending=True).values  # (nc, N)
        split = (ranked[:, :5] - ranked[:, 1:6]).argmax(1, keepdim=True)  # the widest of the top 5 gaps
        middle = (ranked.gather(1, split) + ranked.gather(1, split + 1)).squeeze(1) / 2
        shift = torch.where(torch.arange(ranked.shape[0]) % 4 == 0,
                            torch.logit(torch.tensor(PREDICT_CONF)) - middle, -8.0 - ranked[:, 0])
        for conv in convs:
            conv.bias.add_(shift)
    return model


_ARTIFACTS: dict[str, Any] = {}


def _exported(tmp_path_factory: pytest.TempPathFactory, fmt: str, suffix: str, **opts: Any) -> Any:
    if fmt not in _ARTIFACTS:
        folder = tmp_path_factory.mktemp(f"e2e-{fmt}")
        _ARTIFACTS[fmt] = seeded_e2e().export(format=fmt, imgsz=IMGSZ, output=folder / f"t{suffix}",
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


def _eager():
    return seeded_e2e().predict(SAMPLE_IMAGE, conf=PREDICT_CONF, imgsz=IMGSZ)


def test_seeded_model_has_enough_detections_to_compare():
    r = _eager()
    assert len(r) >= 20 and len(set(r.boxes.cls.tolist())) >= 10
    assert float(r.boxes.conf.min()) > PREDICT_CONF + 1e-4  # no threshold decided by float noise (~1e-6)


def test_onnx_artifact_validates_and_predicts_the_same_detections(onnx_dynamic):
    v = onnx_dynamic.validation
    assert v.status == "passed", v.text()
    assert {c["group"] for c in v.checks if c["output"] == "predictions"} == {"predictions/box", "predictions/score"}
    assert all(d["passed"] for d in v.detections)
    assert all(d["eager"] > 0 for d in v.detections if d["probe"].startswith("sample")), v.text()
    art = LibreYOLO(onnx_dynamic.path)
    assert art.family.name == "yolo9_e2e"
    assert_same_detections(_eager(), art.predict(SAMPLE_IMAGE, conf=PREDICT_CONF), conf=PREDICT_CONF)


def test_onnx_graph_holds_no_nms_and_only_standard_ops(onnx_dynamic):
    from libreyolo.export.base import get_exporter

    ops = get_exporter("onnx").graph_ops(onnx_dynamic.path)
    assert "NonMaxSuppression" not in ops and "TopK" not in ops, sorted(ops)
    assert ops <= STANDARD_ONNX_OPS, ops - STANDARD_ONNX_OPS
    assert not [op for op in ops if any(bad.lower() in op.lower() for bad in FUSED_OR_CUSTOM)]


def test_executorch_artifact_validates_and_predicts_the_same_detections(pte):
    from libreyolo.export.executorch import pte_ops

    v = pte.validation
    assert v.status == "passed", v.text()
    assert v.runtime.startswith("executorch") and all(d["passed"] for d in v.detections)
    assert not [op for op in pte_ops(pte.path) if "nms" in op.lower() or "topk" in op.lower()]
    assert_same_detections(_eager(), LibreYOLO(pte.path).predict(SAMPLE_IMAGE, conf=PREDICT_CONF), conf=PREDICT_CONF)


def test_a_wrong_artifact_is_refused(onnx_dynamic):
    """The same validator on the artifact's runtime with one one-to-one class bias moved: it must fail."""
    from libreyolo.export.base import ExportOptions, get_exporter
    from libreyolo.export.validate import validate_artifact

    wrong = LibreYOLO("LibreYOLO9E2Et.yaml")
    wrong.net.load_state_dict(seeded_e2e().net.state_dict())
    with torch.no_grad():
        wrong.net.head.one2one_cv3[0][2].bias[3] += 0.05
    opts = ExportOptions("onnx", IMGSZ, dynamic=True, dynamic_spatial=True)
    report = validate_artifact(wrong, get_exporter("onnx"), onnx_dynamic.path, opts)
    assert report.status == "failed", report.text()
