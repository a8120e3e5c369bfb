"""RT-DETRv2 (r18, r34, r50, r50m, r101): RT-DETR's PResNet backbone and hybrid encoder with the v2
decoder.

What v2 changes is in the decoder (:class:`libreyolo.models.rtdetr.decoder.RTDETRTransformer`,
parameterised): each layer's deformable attention has its own point count per level, laid out flat
(:class:`libreyolo.models.detr_shared.deformable.ProjectedDeformableAttention`, sampling with bilinear
``grid_sample``, the reference's ``default`` method, which every released size uses), the encoder
output projection is named ``proj``/``norm``, and checkpoints store the 640x640 anchors. r50m
predicts from the third of its six decoder layers; r101's encoder is 384 wide. Key names and shapes
follow the reference checkpoints (``LibreRTDETRv2<size>.pt``).
"""
from __future__ import annotations

from torch import nn

from libreyolo.models.detr_shared.deformable import ProjectedDeformableAttention
from libreyolo.models.rtdetr.backbone import PResNet
from libreyolo.models.rtdetr.decoder import RTDETRTransformer
from libreyolo.models.rtdetr.network import RTDETR, RTDETRSize, build_encoder

# the reference's RT-DETR size table for the ResNet sizes v2 builds (libreyolo 1.6.0,
# models/rtdetr/model.py RTDETR_CONFIGS; v2 takes 4 points on each of the 3 levels)
SIZES: dict[str, RTDETRSize] = {
    "r18": RTDETRSize(18, False, 0.5, 3),
    "r34": RTDETRSize(34, False, 0.5, 4),
    "r50": RTDETRSize(50, True, 1.0, 6),
    "r50m": RTDETRSize(50, True, 0.5, 6, eval_idx=2),
    "r101": RTDETRSize(101, True, 1.0, 6, hidden=384, encoder_ffn=2048, decoder_hidden=256),
}
POINTS = (4, 4, 4)
EVAL_SIZE = 640


class RTDETRv2(RTDETR):
    """The network: ``forward`` returns ``pred_logits`` (B, 300, nc) and ``pred_boxes`` (B, 300, 4)."""

    def __init__(self, size: str, nc: int = 80, points: tuple[int, ...] = POINTS) -> None:
        nn.Module.__init__(self)
        if size not in SIZES:
            raise ValueError(f"unknown rtdetrv2 size {size!r}; known sizes: {', '.join(SIZES)}")
        cfg = SIZES[size]
        self.size, self.nc = size, nc
        self.backbone = PResNet(cfg.depth, (1, 2, 3), frozen_norm=cfg.frozen_norm)
        self.encoder = build_encoder(cfg, self.backbone.out_channels)
        hidden = cfg.decoder_hidden or cfg.hidden
        self.decoder = RTDETRTransformer(
            nc, hidden, [cfg.hidden] * 3, heads=cfg.heads, num_layers=cfg.decoder_layers, ffn=cfg.decoder_ffn,
            num_queries=cfg.num_queries, eval_idx=cfg.eval_idx, named_enc_output=True, eval_size=EVAL_SIZE,
            cross_attn=lambda: ProjectedDeformableAttention(hidden, cfg.heads, points))
