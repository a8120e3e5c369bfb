"""RT-DETR (r18, r34, r50): PResNet backbone, hybrid encoder, deformable-attention decoder.

Module names and shapes follow the LibreYOLO checkpoint format (schema 1.0); sizes differ only
in the table ``SIZES``. The network returns ``pred_logits`` (B, 300, nc), raw class logits, and
``pred_boxes`` (B, 300, 4), boxes (cx, cy, w, h) normalised to the input image.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from libreyolo.models.detr_shared import (
    ConvNormLayer,
    HybridEncoder,
    RepVggBlock,
    TransformerEncoder,
    TransformerEncoderLayer,
)
from libreyolo.models.rtdetr.backbone import PResNet
from libreyolo.models.rtdetr.decoder import RTDETRTransformer


@dataclass(frozen=True)
class RTDETRSize:
    depth: int               # PResNet depth
    frozen_norm: bool        # backbone BatchNorms stored frozen (buffers only)
    expansion: float         # CSPRepLayer hidden width / output width
    decoder_layers: int
    hidden: int = 256
    encoder_ffn: int = 1024
    decoder_ffn: int = 1024
    heads: int = 8
    points: int = 4
    num_queries: int = 300
    depth_mult: float = 1.0
    decoder_hidden: int | None = None  # None: ``hidden`` (RT-DETRv2-r101 encodes at 384, decodes at 256)
    eval_idx: int = -1     # the decoder layer whose outputs are the predictions (all layers are built)


SIZES: dict[str, RTDETRSize] = {
    "r18": RTDETRSize(18, False, 0.5, 3),
    "r34": RTDETRSize(34, False, 0.5, 4),
    "r50": RTDETRSize(50, True, 1.0, 6),
}


class CSPRepLayer(nn.Module):
    """Two 1x1 branches, one through RepVGG blocks, summed, then an optional 1x1 projection."""

    def __init__(self, c_in: int, c_out: int, blocks: int, expansion: float, act: str = "silu") -> None:
        super().__init__()
        hidden = int(c_out * expansion)
        self.conv1 = ConvNormLayer(c_in, hidden, 1, 1, act=act)
        self.conv2 = ConvNormLayer(c_in, hidden, 1, 1, act=act)
        self.bottlenecks = nn.Sequential(*(RepVggBlock(hidden, hidden, act) for _ in range(blocks)))
        self.conv3 = ConvNormLayer(hidden, c_out, 1, 1, act=act) if hidden != c_out else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv3(self.bottlenecks(self.conv1(x)) + self.conv2(x))


def build_encoder(cfg: RTDETRSize, in_channels: list[int]) -> HybridEncoder:
    hidden, act = cfg.hidden, "silu"
    blocks = round(3 * cfg.depth_mult)
    n = len(in_channels)
    return HybridEncoder(
        input_proj=nn.ModuleList(nn.Sequential(nn.Conv2d(c, hidden, 1, bias=False), nn.BatchNorm2d(hidden))
                                 for c in in_channels),
        encoder=nn.ModuleList([TransformerEncoder(
            lambda: TransformerEncoderLayer(hidden, cfg.heads, cfg.encoder_ffn, "gelu"), 1)]),
        use_encoder_idx=(n - 1,),
        hidden_dim=hidden,
        lateral_convs=nn.ModuleList(ConvNormLayer(hidden, hidden, 1, 1, act=act) for _ in range(n - 1)),
        fpn_blocks=nn.ModuleList(CSPRepLayer(2 * hidden, hidden, blocks, cfg.expansion, act) for _ in range(n - 1)),
        downsample_convs=nn.ModuleList(ConvNormLayer(hidden, hidden, 3, 2, act=act) for _ in range(n - 1)),
        pan_blocks=nn.ModuleList(CSPRepLayer(2 * hidden, hidden, blocks, cfg.expansion, act) for _ in range(n - 1)),
    )


class RTDETR(nn.Module):
    def __init__(self, size: str, nc: int = 80) -> None:
        super().__init__()
        if size not in SIZES:
            raise ValueError(f"unknown rtdetr size {size!r}; known sizes: {', '.join(SIZES)}")
        cfg = SIZES[size]
        self.size, self.nc = size, nc
        self.backbone = PResNet(cfg.depth, (1, 2, 3), frozen_norm=cfg.frozen_norm)
        self.encoder = build_encoder(cfg, self.backbone.out_channels)
        self.decoder = RTDETRTransformer(nc, cfg.hidden, [cfg.hidden] * 3, heads=cfg.heads,
                                         num_layers=cfg.decoder_layers, ffn=cfg.decoder_ffn, points=cfg.points,
                                         num_queries=cfg.num_queries)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.decoder(self.encoder(self.backbone(x)))
