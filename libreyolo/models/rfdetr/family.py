"""The rfdetr family adapter: what predict, export and runtimes need to know.

Preprocessing as the reference: the image scaled to [0, 1], resized in float32 (bilinear, as
``cv2.resize`` on a float image) to the size's input, ImageNet mean/std. Postprocessing is the
DETR line's top-k over every (query, column) pair of the ``nc + 1``-wide head (the reference
keeps the extra column too). Export contract, training recipe (Group-DETR, IA-BCE, the reference's
AdamW schedule and EMA) and shared behaviour: :class:`libreyolo.models.detr_shared.family.LWDetectFamily`.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import nn

from libreyolo.models.detr_shared.family import LW_EXPORT, LWDetectFamily
from libreyolo.models.registry import register_family
from libreyolo.models.rfdetr.network import PATCH, RFDETR, SIZES, WINDOWS


@register_family
class RFDETRFamily(LWDetectFamily):
    name = "rfdetr"
    sizes = tuple(SIZES)
    default_size = "s"
    default_imgsz = SIZES["s"].resolution
    stride = PATCH * WINDOWS  # input sides: whole windows of whole patches
    filename_pattern = r"LibreRFDETR(?P<size>[nsml])"
    # nc + 1 logits; rank 5: DINOv2's q/k/v split (B, N, 3, heads, d) (no window partition, unlike lwdetr)
    export = replace(LW_EXPORT, class_axes={"pred_logits": (2, 1)}, tensor_rank=5)
    resize_method = "float-bilinear"
    SUPPORTS_CUDA_GRAPH = False  # not through the GPU parity harness yet
    training = "libreyolo.train.loss.detr:IaBceLoss"  # Group-DETR, IA-BCE + L1 + GIoU

    def build(self, size: str, nc: int) -> nn.Module:
        return RFDETR(size, nc)

    def default_imgsz_for(self, size: str) -> int:
        return SIZES[size].resolution

    def state_nc(self, state: dict[str, Any]) -> int | None:
        t = state.get(self.nc_key)
        return int(t.shape[0]) - 1 if isinstance(t, torch.Tensor) and t.ndim == 1 else None

    def loss_kwargs(self, nc: int) -> dict[str, Any]:
        return {"head": nc + 1}  # the nc + 1-column head: the last column is never a target (as the reference)

    def filename(self, size: str) -> str:
        return f"LibreRFDETR{size}"
