"""What the set-prediction detectors (rtdetr, dfine) share as families: their postprocessing.

Their outputs are ``pred_logits`` (B, Q, nc) and ``pred_boxes`` (B, Q, 4); predictions are the
best (query, class) pairs, no NMS (:mod:`libreyolo.ops.topk`). The fixed-shape stage a
whole-pipeline CUDA graph captures and the eager postprocessing are one function.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from libreyolo.models.base import Family
from libreyolo.ops.topk import SetPostprocess, topk_postprocess_later

_DEVICE_POSTPROCESS = SetPostprocess("pred_logits", "pred_boxes")


class SetDetectFamily(Family):
    """Base of the DETR-line families (task ``detect``)."""

    task = "detect"

    def device_postprocess(self) -> SetPostprocess:
        return _DEVICE_POSTPROCESS

    def postprocess(self, outputs: dict[str, torch.Tensor], metas: list, opts: Any = None, **kw: Any) -> list[dict]:
        return self.postprocess_later(outputs, metas, opts, **kw)()

    def postprocess_later(self, outputs: dict[str, torch.Tensor], metas: list, opts: Any = None,
                          **kw: Any) -> Callable[[], list[dict]]:
        o = self.task_options(opts, kw)
        return topk_postprocess_later(outputs["pred_logits"], outputs["pred_boxes"], metas, conf=o.conf,
                                      max_det=o.max_det, classes=o.classes)
