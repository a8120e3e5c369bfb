"""The deim family adapter.

DEIM's network is D-FINE's, key for key and size for size (the reference's DEIM size table equals
its D-FINE one: backbone, widths, depths, point counts, ``reg_scale``); only the decoder's
activation differs: SiLU in the feed-forward layers, the localisation-quality layers and every MLP
head, where D-FINE has ReLU. So the network is :class:`libreyolo.models.dfine.network.DFINE` built
with ``decoder_act="silu"``, and preprocessing (a Pillow-bilinear stretch to ``imgsz``, no
letterbox, no mean/std), decoding (top-k over query x class) and the export contract are D-FINE's.
What is DEIM's own is its name, its checkpoint file names and its training loss (MAL).
"""
from __future__ import annotations

from torch import nn

from libreyolo.models.dfine.family import DFINEFamily
from libreyolo.models.dfine.network import DFINE, SIZES
from libreyolo.models.registry import register_family

# the decoder activation of the reference's DEIM configs (``activation`` and ``mlp_act``, both SiLU
# at every size)
DEIM_DECODER_ACT = "silu"


@register_family
class DEIMFamily(DFINEFamily):
    name = "deim"
    sizes = tuple(SIZES)
    default_size = "n"
    filename_pattern = r"LibreDEIM(?P<size>[nsmlx])"
    # the reference's DEIM criterion: MAL instead of D-FINE's varifocal term (same matcher, gains and
    # box terms); its fine-tuning defaults (AdamW 1e-4, weight decay 1e-4, clip 0.1, no mosaic) are
    # the DETR line's
    training = "libreyolo.train.loss.detr:MalLoss"
    training_items = ("mal_loss", "l1_loss", "giou_loss", "fgl_loss")
    # not proven here: the graph parity matrix has not been run for this family (no GPU)
    SUPPORTS_CUDA_GRAPH = True  # H200 parity matrix, every size and check (bench/results/2026-12-07-graph-parity-new-*)
    SUPPORTS_PIPELINE_GRAPH = True  # the pipeline rows of the same matrix passed for every size

    def build(self, size: str, nc: int) -> nn.Module:
        return DFINE(size, nc, decoder_act=DEIM_DECODER_ACT)

    def filename(self, size: str) -> str:
        return f"LibreDEIM{size}"
