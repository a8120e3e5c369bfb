"""The lwdetr family adapter: what predict, export and runtimes need to know.

Preprocessing as the reference: Pillow's bilinear resize of the 8-bit image to ``imgsz`` (640 for
every size), [0, 1], ImageNet mean/std. A 91-wide (COCO) head is read as the 80 COCO classes: its
80 annotated columns are picked before the top-k (the other 11 never take a detection slot), and
their position is the class index, and never more detections than the decoder has queries (the
reference's ``num_select``: 100 for t, 300 otherwise). Export contract and shared behaviour:
:class:`libreyolo.models.detr_shared.family.LWDetectFamily`.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from libreyolo.models.detr_shared.family import LW_EXPORT, LWDetectFamily
from libreyolo.models.lwdetr.network import COCO_HEAD, SIZES, LWDETRNet, head_width
from libreyolo.models.lwdetr.vit import GRID, PATCH
from libreyolo.models.registry import register_family
from libreyolo.ops.topk import topk_postprocess_later

# the 80 COCO category ids that carry annotations, ascending: column i of the 80-class view
COCO80_IDS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 27, 28, 31,
              32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57,
              58, 59, 60, 61, 62, 63, 64, 65, 67, 70, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 84, 85, 86, 87,
              88, 89, 90)


def class_logits(logits: torch.Tensor) -> torch.Tensor:
    """(B, Q, head) logits -> (B, Q, nc): the COCO head's 80 annotated columns, others as they are."""
    if logits.shape[-1] != COCO_HEAD:
        return logits
    return logits.index_select(-1, torch.tensor(COCO80_IDS, device=logits.device))


@register_family
class LWDETRFamily(LWDetectFamily):
    name = "lwdetr"
    sizes = tuple(SIZES)
    default_size = "t"
    default_imgsz = 640
    stride = GRID * PATCH  # input sides: the 4 x 4 window grid of whole patches
    filename_pattern = r"LibreLWDETR(?P<size>[tsmlx])"
    export = replace(LW_EXPORT, class_axes={})  # 91 logits for 80 classes, nc otherwise
    resize_method = "pil-bilinear"
    SUPPORTS_CUDA_GRAPH = False  # not through the GPU parity harness yet
    # the LW-DETR line's recipe, which RF-DETR inherited (the reference trains only RF-DETR)
    training = "libreyolo.train.loss.detr:IaBceLoss"

    def build(self, size: str, nc: int) -> nn.Module:
        return LWDETRNet(size, nc)

    def state_nc(self, state: dict[str, Any]) -> int | None:
        t = state.get(self.nc_key)
        if not isinstance(t, torch.Tensor) or t.ndim != 1:
            return None
        return 80 if t.shape[0] == COCO_HEAD else int(t.shape[0])

    def postprocess_later(self, outputs: dict[str, torch.Tensor], metas: list, opts: Any = None,
                          **kw: Any) -> Callable[[], list[dict]]:
        logits = outputs["pred_logits"]
        o = self.task_options(opts, kw)
        # as the reference: never more detections than queries (its num_select)
        return topk_postprocess_later(class_logits(logits), outputs["pred_boxes"], metas, conf=o.conf,
                                      max_det=min(o.max_det, int(logits.shape[1])), classes=o.classes)

    def loss_kwargs(self, nc: int) -> dict[str, Any]:
        # 80 classes: the 91-column COCO head, class i trained on column COCO80_IDS[i]
        return {"head": head_width(nc), "columns": COCO80_IDS if nc == 80 else None}

    def filename(self, size: str) -> str:
        return f"LibreLWDETR{size}"
