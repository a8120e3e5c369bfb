"""The rtdetrv4 family adapter.

RT-DETRv4's detectors are D-FINE's network (the reference builds its D-FINE model with the same
size table, sizes s/m/l/x) with SiLU as the decoder's activation; what RT-DETRv4 adds upstream is a
training-time distillation from a vision-foundation-model teacher, whose projector
(``encoder.feature_projector.*``) is stored in raw upstream training checkpoints but is not part of
the detector. Loading drops those keys (``training_only_prefixes``); every other key must match as
usual. Preprocessing, decoding and the export contract are D-FINE's.
"""
from __future__ import annotations

from torch import nn

from libreyolo.models.dfine.family import DFINEFamily
from libreyolo.models.dfine.network import DFINE
from libreyolo.models.registry import register_family


@register_family
class RTDETRv4Family(DFINEFamily):
    name = "rtdetrv4"
    sizes = ("s", "m", "l", "x")
    default_size = "s"
    filename_pattern = r"LibreRTDETRv4(?P<size>[smlx])"
    training_only_prefixes = ("encoder.feature_projector.",)
    # the reference fine-tunes RT-DETRv4 with DEIM's trainer and criterion (MAL), at its own
    # learning rate and weight decay (no teacher distillation, there or here)
    training = "libreyolo.train.loss.detr:MalLoss"
    training_items = ("mal_loss", "l1_loss", "giou_loss", "fgl_loss")
    train_defaults = {**DFINEFamily.train_defaults, "lr0": 5e-4, "weight_decay": 1.25e-4}
    # not proven here: the graph parity matrix has not been run for this family (no GPU)
    SUPPORTS_CUDA_GRAPH = True  # H200 parity matrix, every size and check (bench/results/2026-12-07-graph-parity-new-*)
    SUPPORTS_PIPELINE_GRAPH = True  # the pipeline rows of the same matrix passed for every size

    def build(self, size: str, nc: int) -> nn.Module:
        return DFINE(size, nc, decoder_act="silu")  # the reference builds it with activation='silu'

    def filename(self, size: str) -> str:
        return f"LibreRTDETRv4{size}"
