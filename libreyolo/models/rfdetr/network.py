"""RF-DETR (n, s, m, l): windowed DINOv2-S/16, a P4 projector, the LW-DETR decoder.

Sizes differ in input resolution (and so the position table) and decoder depth; the table
``SIZES`` is the reference's. The class head has ``nc + 1`` logits (the reference's layout: one
column more than classes). In eval mode the network returns ``pred_logits`` (B, 300, nc + 1),
``pred_boxes`` (B, 300, 4), ``aux_outputs`` (every earlier decoder layer) and ``enc_outputs``
(the selected encoder candidates), as the reference does.

The reference's module tree holds this network under ``model.``, but its state dict (and so
every checkpoint it writes) has no such prefix: the network here is that inner module, so
checkpoints load as they are.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from libreyolo.models.detr_shared.lw import LWDETR, LWBackbone, LWConfig
from libreyolo.models.detr_shared.projector import MultiScaleProjector
from libreyolo.models.rfdetr.dinov2 import DinoV2Encoder

PATCH = 16
WINDOWS = 2
VIT_WIDTH, VIT_DEPTH, VIT_HEADS = 384, 12, 6  # DINOv2 small
OUT_INDICES = (3, 6, 9, 12)


@dataclass(frozen=True)
class RFDETRSize:
    resolution: int   # the native input size
    dec_layers: int

    @property
    def pe_size(self) -> int:
        return self.resolution // PATCH


SIZES: dict[str, RFDETRSize] = {
    "n": RFDETRSize(384, 2),
    "s": RFDETRSize(512, 3),
    "m": RFDETRSize(576, 4),
    "l": RFDETRSize(704, 4),
}


class RFDETR(LWDETR):
    def __init__(self, size: str, nc: int = 80) -> None:
        if size not in SIZES:
            raise ValueError(f"unknown rfdetr size {size!r}; known sizes: {', '.join(SIZES)}")
        s = SIZES[size]
        cfg = LWConfig(hidden=256, sa_heads=8, ca_heads=16, points=2, levels=1, dec_layers=s.dec_layers,
                       num_queries=300, group_detr=13)
        encoder = DinoV2Encoder(dim=VIT_WIDTH, depth=VIT_DEPTH, heads=VIT_HEADS, patch=PATCH, pe_size=s.pe_size,
                                windows=WINDOWS, out_indices=OUT_INDICES)
        projector = MultiScaleProjector([VIT_WIDTH] * len(OUT_INDICES), cfg.hidden, ["P4"], layer_norm=True)
        super().__init__(LWBackbone(encoder, projector), cfg, nc + 1, first_stride=PATCH, aux=True)  # P4
        self.size, self.nc = size, nc
        # the reference's keypoint-schema buffer: empty for detection, kept so state dicts match key for key
        self.register_buffer("_kp_active_mask", torch.zeros(0, 0, dtype=torch.bool))
        with torch.no_grad():
            embed = encoder.encoder.embeddings
            nn.init.trunc_normal_(embed.position_embeddings, std=0.02)
            nn.init.trunc_normal_(embed.cls_token, std=0.02)
