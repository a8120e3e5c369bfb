"""The deimv2 family adapter: what predict, graphs, export and runtimes need to know.

The export contract and postprocessing are the DETR line's
(:class:`libreyolo.models.detr_shared.family.SetDetectFamily`); the quantization exclusions are
D-FINE's (the same head and localisation-quality module names). Preprocessing as the reference:
Pillow's bilinear resize to ``imgsz x imgsz`` (no letterbox), scaled to [0, 1]; the ViT sizes'
ImageNet normalisation is inside the network (:mod:`libreyolo.models.deimv2.network`).
Input sizes per size as the reference: atto 320, femto 416, the others 640.

Training uses D-FINE's recipe and loss (Hungarian matching, denoising groups, VFL + L1 + GIoU +
fine-grained localisation), not DEIM's matchability-aware loss and dense one-to-one matching: a
reference checkpoint fine-tunes here, but not with the reference's objective. The ViT sizes' training
images are normalised by the network's own first operation (:meth:`DEIMv2Family.train_encode`).
CUDA graphs are not claimed: not proven on a GPU for this family.
"""
from __future__ import annotations

import torch
from torch import nn

from libreyolo.models.deimv2.network import SIZES, DEIMv2
from libreyolo.models.detr_shared.family import SetDetectFamily
from libreyolo.models.detr_shared.training import train_encode
from libreyolo.models.dfine.family import DFINEFamily
from libreyolo.models.registry import register_family
from libreyolo.ops.stretch import Stretch


@register_family
class DEIMv2Family(SetDetectFamily):
    name = "deimv2"
    sizes = tuple(SIZES)
    default_size = "s"
    default_imgsz = 640
    stride = 32
    filename_pattern = r"LibreDEIMv2(?P<size>atto|femto|pico|[nsmlx])"
    quant_exclude = DFINEFamily.quant_exclude
    infinite_ok_keys = ("decoder.anchors",)  # checkpoints converted from upstream may mark invalid anchors inf
    training_items = DFINEFamily.training_items  # D-FINE's loss terms, FGL included
    export = DFINEFamily.export  # D-FINE's decoder and contract (its ViT attention keeps to rank 4 too)
    SUPPORTS_CUDA_GRAPH = False
    SUPPORTS_PIPELINE_GRAPH = False

    def build(self, size: str, nc: int) -> nn.Module:
        return DEIMv2(size, nc)

    def train_encode(self, net: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return train_encode(net, net.normalize(images))  # the backbone takes what forward() gives it

    def default_imgsz_for(self, size: str) -> int:
        return SIZES[size].imgsz

    def letterbox(self, imgsz: int) -> Stretch:
        return Stretch(imgsz, method="pil-bilinear")

    def filename(self, size: str) -> str:
        return f"LibreDEIMv2{size}"
