"""The deit family adapter (classify): sizes t, s, b at 224x224, as the reference library offers them.

The reference's DeiT is the ViT network with DeiT's sizes and ImageNet normalisation: it has
no distillation token and no distillation head (its state dicts hold only ``cls_token`` and
``head``; a state dict with ``dist_token`` / ``head_dist.*`` is refused there), so predictions
come from the class token's head alone. This family does the same, and says so when a
distilled (upstream DeiT) state dict is offered.
"""
from __future__ import annotations

from typing import Any

from torch import nn

from libreyolo.errors import CheckpointError
from libreyolo.models.classify import ClassifyFamily
from libreyolo.models.registry import register_family
from libreyolo.models.vit.network import VisionTransformer, ViTSize

DEIT_SIZES = {
    "t": ViTSize(192, 12, 3),
    "s": ViTSize(384, 12, 6),
    "b": ViTSize(768, 12, 12),
}
DISTILLATION_KEYS = ("dist_token", "head_dist.weight", "head_dist.bias")


@register_family
class DeiT(ClassifyFamily):
    name = "deit"
    sizes = tuple(DEIT_SIZES)
    default_size = "t"
    filename_pattern = r"LibreDeiT(?P<size>[tsb])-cls"
    quant_exclude = ("head",)  # the class logits; attention scores are matmuls, not layers, and stay float
    crop_pct = 0.9  # ImageNet mean/std (the ClassifyFamily default), bicubic resize
    SUPPORTS_CUDA_GRAPH = True  # H200 graph parity matrix passed every check (bench/results/2026-12-01-graph-parity-*)

    def build(self, size: str, nc: int) -> nn.Module:
        return VisionTransformer(DEIT_SIZES[size], nc)

    def state_nc(self, state: dict[str, Any]) -> int | None:
        distilled = [k for k in DISTILLATION_KEYS if k in state]
        if distilled:
            raise CheckpointError(
                f"this DeiT state dict has a distillation token/head ({', '.join(distilled)}); LibreYOLO's DeiT, "
                "like the reference library's, has only the class token and its head. Drop those keys (and the "
                "distillation row of pos_embed, index 1) to use the class-token head alone"
            )
        return super().state_nc(state)

    def filename(self, size: str) -> str:
        return f"LibreDeiT{size}-cls"
