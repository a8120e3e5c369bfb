"""The vit family adapter (classify): sizes ti, s, b, l at 224x224, as the reference library offers them."""
from __future__ import annotations

from torch import nn

from libreyolo.models.classify import ClassifyFamily
from libreyolo.models.registry import register_family
from libreyolo.models.vit.network import VIT_SIZES, VisionTransformer


@register_family
class ViT(ClassifyFamily):
    name = "vit"
    sizes = tuple(VIT_SIZES)
    default_size = "ti"
    filename_pattern = r"LibreViT(?P<size>ti|s|b|l)-cls"
    quant_exclude = ("head",)  # the class logits; attention scores are matmuls, not layers, and stay float
    # the reference evaluates its ViTs with Inception-style normalisation and a 0.9 crop
    crop_pct = 0.9
    mean = (0.5, 0.5, 0.5)
    std = (0.5, 0.5, 0.5)
    SUPPORTS_CUDA_GRAPH = True  # H200 graph parity matrix passed every check (bench/results/2026-12-01-graph-parity-*)

    def build(self, size: str, nc: int) -> nn.Module:
        return VisionTransformer(VIT_SIZES[size], nc)

    def filename(self, size: str) -> str:
        return f"LibreViT{size}-cls"
