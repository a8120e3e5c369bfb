"""Helpers shared by the export and runtime tests (no tests here).

Artifacts are exported once per test session and shared between test files through
:func:`exported`; every export is validated against eager unless a test says otherwise.
"""
from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from libreyolo.export.validate import match_detections

from .conftest import spread_scores

IMGSZ = 256  # a multiple of the stride; small so the suite stays fast on 2 CPU cores
_MODELS: dict[int, Any] = {}
_ARTIFACTS: dict[tuple, Any] = {}


def seeded_weights(model: Any, seed: int = 0, spread: bool = True) -> Any:
    """Deterministic weights with realistic magnitudes (fan-in scaled), in sorted key order.

    With ``spread`` the class scores are separated (conftest.spread_scores) so that eager and
    artifact detections do not depend on float rounding.
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for key, t in sorted(model.net.state_dict().items()):
            if not t.is_floating_point():
                continue
            if key.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=g) * 0.5 + 0.75)
            elif key.endswith("running_mean"):
                t.copy_(torch.randn(t.shape, generator=g) * 0.1)
            elif t.ndim >= 2:
                t.copy_(torch.randn(t.shape, generator=g) / math.sqrt(max(1, t[0].numel())))
            elif key.endswith("weight"):
                t.copy_(1.0 + 0.1 * torch.randn(t.shape, generator=g))
            else:
                t.copy_(0.1 * torch.randn(t.shape, generator=g))
    return spread_scores(model, seed) if spread else model


def model(seed: int = 0) -> Any:
    """YOLOv9-t with seeded weights (the same rule as the compat fixtures, seed 0)."""
    if seed not in _MODELS:
        from libreyolo import LibreYOLO

        _MODELS[seed] = seeded_weights(LibreYOLO("LibreYOLO9t.yaml"), seed)
    return _MODELS[seed]


def exported(tmp_path_factory: pytest.TempPathFactory, fmt: str, **opts: Any) -> Any:
    """Export the seeded model once per (format, options) and session; returns the ExportReport."""
    key = (fmt, tuple(sorted(opts.items())))
    if key not in _ARTIFACTS:
        folder = tmp_path_factory.mktemp(f"export-{fmt}")
        opts.setdefault("imgsz", IMGSZ)
        _ARTIFACTS[key] = model().export(format=fmt, output=folder / ("m" + _SUFFIX[fmt]), verbose=False, **opts)
    return _ARTIFACTS[key]


_SUFFIX = {"onnx": ".onnx", "executorch": ".pte", "coreml": ".mlpackage", "tensorrt": ".engine"}


def as_dets(result: Any) -> dict[str, torch.Tensor]:
    return {"xyxy": result.boxes.xyxy, "conf": result.boxes.conf, "cls": result.boxes.cls}


def assert_same_detections(eager: Any, artifact: Any, conf: float = 0.25, score_tol: float = 1e-4) -> dict:
    """Same detections as sets, every one matched directly.

    The seeded weights separate the scores (``spread_scores``), so no difference may be left to
    the tie-aware matcher's allowances: tie swaps, cascades and threshold flips must all be zero.
    """
    m = match_detections(as_dets(eager), as_dets(artifact), conf=conf, max_det=300, iou_min=0.99,
                         score_tol=score_tol)
    assert m["passed"], m
    assert m["tie_swaps"] == 0 and m["swap_cascade"] == 0 and m["matched"] == m["eager"], m
    assert m["eager"] == m["artifact"], m
    assert m["min_iou"] > 0.999 and m["max_conf_diff"] < 1e-5, m
    return m


# what an exported detector graph may contain: plain ONNX-domain operators only
STANDARD_ONNX_OPS = {
    "Add", "AveragePool", "Cast", "Concat", "Constant", "ConstantOfShape", "Conv", "CumSum", "Div", "Equal",
    "Expand", "Floor", "Gather", "GatherElements", "Greater", "LessOrEqual", "MatMul", "Max", "MaxPool", "Min",
    "Mul", "Range", "ReduceSum", "Relu", "Reshape", "Resize", "Shape", "Sigmoid", "Slice", "Softmax", "Split",
    "Squeeze", "Sub", "TopK", "Transpose", "Trilu", "Unsqueeze", "Where", "Clip", "Neg", "Not", "And", "Less",
    "Identity", "Flatten", "Sqrt", "Pow", "Exp", "Log", "Tile", "Mod", "Abs", "ReduceMax", "ArgMax", "Xor", "Or",
    "GreaterOrEqual", "ScatterND", "NonZero", "HardSigmoid", "Mish", "Sign", "Ceil",
}
FUSED_OR_CUSTOM = ("Attention", "MultiHeadAttention", "scaled_dot_product", "flash", "com.microsoft", "libreyolo",
                   "kernels::", "triton", "ms_deform")


def test_a_box_clipped_flat_at_the_image_edge_matches_by_its_coordinates():
    """A box of (nearly) zero height at the image's edge (0.19 px against 0.01 px: IoU 0.06) is the same
    box when every coordinate is within what IoU 0.99 allows a square of its longer side; a normal box
    moved by 1% of its side is not matched (only a tie swap, with its own rules, could explain it)."""
    import torch

    from libreyolo.export.matching import match_detections

    def dets(*boxes):
        return {"xyxy": torch.tensor(boxes), "conf": torch.ones(len(boxes)), "cls": torch.zeros(len(boxes))}
    kw = {"conf": 0.25, "max_det": 300, "iou_min": 0.99, "score_tol": 1e-3}
    flat = match_detections(dets([0.0, 479.81, 640.0, 480.0]), dets([0.0, 479.99, 640.0, 480.0]), **kw)
    assert flat["passed"] and flat["matched"] == 1, flat
    moved = match_detections(dets([100.0, 100.0, 120.0, 120.0]), dets([100.2, 100.0, 120.2, 120.0]), **kw)
    assert moved["matched"] == 0, moved
