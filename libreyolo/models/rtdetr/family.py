"""The rtdetr family adapter: what predict, graphs, export and runtimes need to know.

The export contract, training recipe and hooks and the postprocessing are the DETR line's
(:class:`libreyolo.models.detr_shared.family.SetDetectFamily`)."""
from __future__ import annotations

from dataclasses import replace

from torch import nn

from libreyolo.models.detr_shared.family import DETR_EXPORT, SetDetectFamily
from libreyolo.models.registry import register_family
from libreyolo.models.rtdetr.network import RTDETR, SIZES
from libreyolo.ops.stretch import Stretch


@register_family
class RTDETRFamily(SetDetectFamily):
    name = "rtdetr"
    sizes = tuple(SIZES)
    default_size = "r18"
    default_imgsz = 640
    stride = 32
    filename_pattern = r"LibreRTDETR-?(?P<size>r18|r34|r50)"
    SUPPORTS_CUDA_GRAPH = True  # H200 graph parity matrix passed every check (bench/results/2026-12-01-*parity*)
    SUPPORTS_PIPELINE_GRAPH = True  # top-k postprocessing in the graph: H200 pipeline parity rows (2026-12-04)
    # NCNN: exported as two programs around the query selection, run on the host (tests/test_export_ncnn.py)
    export = replace(DETR_EXPORT, host_selection="libreyolo.models.rtdetr.split:SPLIT")

    def build(self, size: str, nc: int) -> nn.Module:
        return RTDETR(size, nc)

    def letterbox(self, imgsz: int) -> Stretch:
        # the reference resizes with cv2.INTER_LINEAR to imgsz x imgsz, no letterbox, no mean/std
        return Stretch(imgsz, method="opencv-linear")

    def filename(self, size: str) -> str:
        return f"LibreRTDETR{size}"
