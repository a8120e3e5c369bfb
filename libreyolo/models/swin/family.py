"""The swin family adapter (classify): sizes t, s, b at 224x224, as the reference library offers them.

Everything but the network comes from the classify contract (:mod:`libreyolo.models.classify`):
ImageNet normalisation with a 0.9 centre crop and bicubic resize (the reference's Swin recipe),
softmax probabilities, a ``logits`` export output. The input size is fixed at 224 like the
reference's: which blocks shift their windows is decided for that size.
"""
from __future__ import annotations

import dataclasses

from torch import nn

from libreyolo.models.classify import CLASSIFY_EXPORT, ClassifyFamily
from libreyolo.models.registry import register_family
from libreyolo.models.swin.network import SIZES, SwinTransformer


@register_family
class Swin(ClassifyFamily):
    name = "swin"
    sizes = tuple(SIZES)
    default_size = "t"
    stride = 32  # 4x4 patches, then three 2x2 merges
    filename_pattern = r"LibreSwin(?P<size>[tsb])-cls"
    quant_exclude = ("head.fc",)  # the class logits; window-attention scores are matmuls and stay float
    crop_pct = 0.9  # ImageNet mean/std (the ClassifyFamily default), bicubic resize
    fixed_imgsz = 224
    fixed_imgsz_reason = "which blocks shift their windows is laid out for 224 px"
    nc_key = "head.fc.bias"
    export = dataclasses.replace(CLASSIFY_EXPORT, tensor_rank=6)  # window partition (B, H/w, w, W/w, w, C)
    SUPPORTS_CUDA_GRAPH = True  # H200 graph parity matrix passed every check (bench/results/2026-12-01-graph-parity-*)

    def build(self, size: str, nc: int) -> nn.Module:
        return SwinTransformer(size, nc, imgsz=self.fixed_imgsz)

    def filename(self, size: str) -> str:
        return f"LibreSwin{size}-cls"
