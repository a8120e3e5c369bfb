"""The dfine family adapter: what predict, graphs, export and runtimes need to know.

The export contract, training recipe and hooks and the postprocessing are the DETR line's
(:class:`libreyolo.models.detr_shared.family.SetDetectFamily`); D-FINE adds its box-distribution heads to
the INT8 exclusions and its fine-grained localisation term to the training items."""
from __future__ import annotations

from torch import nn

from libreyolo.models.detr_shared.family import DETR_EXPORT, DETR_QUANT_EXCLUDE, SetDetectFamily
from libreyolo.models.dfine.network import DFINE, SIZES
from libreyolo.models.registry import register_family
from libreyolo.ops.stretch import Stretch


@register_family
class DFINEFamily(SetDetectFamily):
    name = "dfine"
    sizes = tuple(SIZES)
    default_size = "n"
    default_imgsz = 640
    stride = 32
    filename_pattern = r"LibreDFINE(?P<size>[nsmlx])"
    # also kept in float: the pre-decoder box head and the localisation-quality layers
    quant_exclude = (*DETR_QUANT_EXCLUDE, "decoder.pre_bbox_head.*", "decoder.decoder.lqe_layers.*")
    export = DETR_EXPORT  # its deformable sampling keeps to rank 4, as RT-DETR's
    infinite_ok_keys = ("decoder.anchors",)  # invalid anchors are +inf in reference checkpoints
    training_items = ("vfl_loss", "l1_loss", "giou_loss", "fgl_loss")
    SUPPORTS_CUDA_GRAPH = True  # H200 graph parity matrix passed every check (bench/results/2026-12-01-*parity*)
    SUPPORTS_PIPELINE_GRAPH = True  # top-k postprocessing in the graph: H200 pipeline parity rows (2026-12-04)

    def build(self, size: str, nc: int) -> nn.Module:
        return DFINE(size, nc)

    def letterbox(self, imgsz: int) -> Stretch:
        # the reference resizes with Pillow's bilinear filter to imgsz x imgsz, no letterbox, no mean/std
        return Stretch(imgsz, method="pil-bilinear")

    def filename(self, size: str) -> str:
        return f"LibreDFINE{size}"
