"""The rtdetrv2 family adapter: RT-DETR's (preprocessing, decoding, export contract, training hooks)
with the v2 network (:mod:`libreyolo.models.rtdetrv2.network`)."""
from __future__ import annotations

from torch import nn

from libreyolo.models.registry import register_family
from libreyolo.models.rtdetr.family import RTDETRFamily
from libreyolo.models.rtdetrv2.network import SIZES, RTDETRv2


@register_family
class RTDETRv2Family(RTDETRFamily):
    name = "rtdetrv2"
    sizes = tuple(SIZES)
    default_size = "r18"
    filename_pattern = r"LibreRTDETRv2-?(?P<size>r18|r34|r50m|r50|r101)"
    infinite_ok_keys = ("decoder.anchors",)  # invalid anchors are +inf in reference checkpoints
    SUPPORTS_CUDA_GRAPH = True  # H200 parity matrix, every size and check (bench/results/2026-12-07-graph-parity-new-*)
    SUPPORTS_PIPELINE_GRAPH = True  # the pipeline rows of the same matrix passed for every size
    # export: RT-DETR's contract, NCNN split included (the v2 decoder's per-level sampling converts and validates:
    # docs/export_edge.md; the plain-init model once taken for a v2 failure fails rtdetr-r18 identically)

    def build(self, size: str, nc: int) -> nn.Module:
        return RTDETRv2(size, nc)

    def filename(self, size: str) -> str:
        return f"LibreRTDETRv2{size}"
