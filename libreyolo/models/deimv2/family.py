"""The deimv2 family adapter: what predict, graphs, export and runtimes need to know.

The export contract and postprocessing are the DETR line's
(:class:`libreyolo.models._detr.family.SetDetectFamily`); the quantization exclusions are
D-FINE's (the same head and localisation-quality module names). Preprocessing as the reference:
Pillow's bilinear resize to ``imgsz x imgsz`` (no letterbox), scaled to [0, 1]; the ViT sizes'
ImageNet normalisation is inside the network (:mod:`libreyolo.models.deimv2.network`).
Input sizes per size as the reference: atto 320, femto 416, the others 640.

Training is not wired here (``training = None``): the decoder has no denoising training path yet.
CUDA graphs are not claimed: not proven on a GPU for this family.
"""
from __future__ import annotations

from torch import nn

from libreyolo.models._detr.family import SetDetectFamily
from libreyolo.models.deimv2.network import SIZES, DEIMv2
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
    training = None
    train_capture = None
    SUPPORTS_CUDA_GRAPH = False
    SUPPORTS_PIPELINE_GRAPH = False

    def build(self, size: str, nc: int) -> nn.Module:
        return DEIMv2(size, nc)

    def default_imgsz_for(self, size: str) -> int:
        return SIZES[size].imgsz

    def letterbox(self, imgsz: int) -> Stretch:
        return Stretch(imgsz, method="pil-bilinear")

    def filename(self, size: str) -> str:
        return f"LibreDEIMv2{size}"
