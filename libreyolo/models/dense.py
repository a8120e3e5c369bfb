"""The dense-detector contract: families whose export output is one ``predictions`` tensor
(B, 4 + nc, anchors) of xyxy boxes in input pixels followed by class scores (yolo9, yolox, rtmdet,
yolo9_e2e).

Their decoding, candidate selection and NMS are shared: eagerly by
:func:`libreyolo.ops.postprocess.detect_postprocess`, and as the fixed-shape device stage a
whole-pipeline CUDA graph captures (:class:`libreyolo.ops.postprocess.DetectPostprocess`).
Families with a one-to-one head (:class:`One2OneDetectFamily`) decode the same tensor without NMS:
a top-k (:mod:`libreyolo.ops.topk`).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from libreyolo.models.base import Family
from libreyolo.models.contract import DenseContract
from libreyolo.ops.letterbox import LetterboxMeta
from libreyolo.ops.postprocess import DetectPostprocess, detect_postprocess_later
from libreyolo.ops.topk import One2OnePostprocess, one2one_postprocess_later

_DEVICE_POSTPROCESS = DetectPostprocess("predictions")
_ONE2ONE_POSTPROCESS = One2OnePostprocess("predictions")


class DenseDetectFamily(Family):
    """Base of every dense detection family (task ``detect``)."""

    task = "detect"
    contract_kind = DenseContract

    def device_postprocess(self) -> DetectPostprocess:
        return _DEVICE_POSTPROCESS

    def postprocess(self, outputs: dict[str, torch.Tensor], metas: list[LetterboxMeta], opts: Any = None,
                    **kw: Any) -> list[dict]:
        return self.postprocess_later(outputs, metas, opts, **kw)()

    def postprocess_later(self, outputs: dict[str, torch.Tensor], metas: list[LetterboxMeta], opts: Any = None,
                          **kw: Any) -> Callable[[], list[dict]]:
        o = self.task_options(opts, kw)
        extra = {} if o.max_nms is None else {"max_nms": o.max_nms}
        return detect_postprocess_later(outputs["predictions"], metas, conf=o.conf, iou=o.iou, max_det=o.max_det,
                                        classes=o.classes, **extra)


class One2OneDetectFamily(DenseDetectFamily):
    """Base of the dense detectors with a one-to-one head (at most one prediction per object): the
    same ``predictions`` tensor, decoded by a top-k without NMS, eagerly, in a pipeline graph and
    after any runtime alike (``iou`` and ``max_nms`` do not apply). Their export contract sets
    ``nms_input=None`` and ``nms_free`` (no NMS in any artifact; nms=True is refused)."""

    def device_postprocess(self) -> One2OnePostprocess:
        return _ONE2ONE_POSTPROCESS

    def postprocess_later(self, outputs: dict[str, torch.Tensor], metas: list[LetterboxMeta], opts: Any = None,
                          **kw: Any) -> Callable[[], list[dict]]:
        o = self.task_options(opts, kw)
        return one2one_postprocess_later(outputs["predictions"], metas, conf=o.conf, max_det=o.max_det,
                                         classes=o.classes)
