"""The dfine family adapter: what predict, graphs, export and runtimes need to know."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from libreyolo.models.base import Family
from libreyolo.models.dfine.network import DFINE, SIZES
from libreyolo.models.registry import register_family
from libreyolo.models.rtdetr.family import DETR_EXPORT
from libreyolo.ops.stretch import Stretch
from libreyolo.ops.topk import topk_postprocess


@register_family
class DFINEFamily(Family):
    name = "dfine"
    task = "detect"
    sizes = tuple(SIZES)
    default_size = "n"
    default_imgsz = 640
    stride = 32
    filename_pattern = r"LibreDFINE(?P<size>[nsmlx])"
    export = DETR_EXPORT
    nc_key = "decoder.enc_score_head.bias"
    infinite_ok_keys = ("decoder.anchors",)  # invalid anchors are +inf in reference checkpoints
    SUPPORTS_CUDA_GRAPH = True  # H200 graph parity matrix passed every check (bench/results/2026-12-01-*parity*)

    def build(self, size: str, nc: int) -> nn.Module:
        return DFINE(size, nc)

    def export_outputs(self, outputs: Any) -> tuple[torch.Tensor, ...]:
        return outputs["pred_logits"], outputs["pred_boxes"]

    def letterbox(self, imgsz: int) -> Stretch:
        # the reference resizes with Pillow's bilinear filter to imgsz x imgsz, no letterbox, no mean/std
        return Stretch(imgsz, method="pil-bilinear")

    def postprocess(self, outputs: dict[str, torch.Tensor], metas: list, **kw: Any) -> list[dict]:
        return topk_postprocess(outputs["pred_logits"], outputs["pred_boxes"], metas, conf=kw["conf"],
                                max_det=kw["max_det"], classes=kw.get("classes"))

    def filename(self, size: str) -> str:
        return f"LibreDFINE{size}"
