"""The dense-detector contract: families whose export output is one ``predictions`` tensor
(B, 4 + nc, anchors) of xyxy boxes in input pixels followed by class scores (yolo9, yolox, rtmdet).

Their decoding, candidate selection and NMS are shared: eagerly by
:func:`libreyolo.ops.postprocess.detect_postprocess`, and as the fixed-shape device stage a
whole-pipeline CUDA graph captures (:class:`libreyolo.ops.postprocess.DetectPostprocess`).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from libreyolo.models.base import Family
from libreyolo.ops.letterbox import LetterboxMeta
from libreyolo.ops.postprocess import DetectPostprocess, detect_postprocess_later

_DEVICE_POSTPROCESS = DetectPostprocess("predictions")


class DenseDetectFamily(Family):
    """Base of every dense detection family (task ``detect``)."""

    task = "detect"

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
