"""D-FINE (n, s, m, l, x): HGNetv2 backbone, hybrid encoder with ELAN fusion, FDR decoder.

Module names and shapes follow the LibreYOLO checkpoint format (schema 1.0); sizes differ only
in the table ``SIZES``. Outputs as RT-DETR's: ``pred_logits`` (B, 300, nc) and ``pred_boxes``
(B, 300, 4) as (cx, cy, w, h) normalised to the input.
"""
from __future__ import annotations

from collections import OrderedDict
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
from libreyolo.models.dfine.backbone import HGNetv2
from libreyolo.models.dfine.decoder import DFINETransformer


@dataclass(frozen=True)
class DFINESize:
    backbone: str
    lab: bool                        # learnable affine blocks in the backbone
    frozen_norm: bool                # backbone BatchNorms stored frozen (buffers only)
    return_idx: tuple[int, ...]
    enc_hidden: int
    enc_ffn: int
    expansion: float
    depth_mult: float
    dec_hidden: int
    dec_ffn: int
    dec_layers: int
    points: tuple[int, ...]
    reg_scale: float = 4.0
    heads: int = 8
    strides: tuple[int, ...] = (8, 16, 32)


SIZES: dict[str, DFINESize] = {
    "n": DFINESize("B0", True, False, (2, 3), 128, 512, 0.34, 0.5, 128, 512, 3, (6, 6), strides=(16, 32)),
    "s": DFINESize("B0", True, False, (1, 2, 3), 256, 1024, 0.5, 0.34, 256, 1024, 3, (3, 6, 3)),
    "m": DFINESize("B2", True, False, (1, 2, 3), 256, 1024, 1.0, 0.67, 256, 1024, 4, (3, 6, 3)),
    "l": DFINESize("B4", False, True, (1, 2, 3), 256, 1024, 1.0, 1.0, 256, 1024, 6, (3, 6, 3)),
    "x": DFINESize("B5", False, True, (1, 2, 3), 384, 2048, 1.0, 1.0, 256, 1024, 6, (3, 6, 3), reg_scale=8.0),
}


class CSPLayer(nn.Module):
    def __init__(self, c_in: int, c_out: int, blocks: int, act: str = "silu") -> None:
        super().__init__()
        self.conv1 = ConvNormLayer(c_in, c_out, 1, 1, act=act)
        self.conv2 = ConvNormLayer(c_in, c_out, 1, 1, act=act)
        self.bottlenecks = nn.Sequential(*(RepVggBlock(c_out, c_out, act) for _ in range(blocks)))
        self.conv3 = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv3(self.bottlenecks(self.conv1(x)) + self.conv2(x))


class RepNCSPELAN4(nn.Module):
    """Split, two CSP+conv branches chained on the second half, concatenate all, project."""

    def __init__(self, c1: int, c2: int, c3: int, c4: int, blocks: int, act: str = "silu") -> None:
        super().__init__()
        self.half = c3 // 2
        self.cv1 = ConvNormLayer(c1, c3, 1, 1, act=act)
        self.cv2 = nn.Sequential(CSPLayer(c3 // 2, c4, blocks, act), ConvNormLayer(c4, c4, 3, 1, act=act))
        self.cv3 = nn.Sequential(CSPLayer(c4, c4, blocks, act), ConvNormLayer(c4, c4, 3, 1, act=act))
        self.cv4 = ConvNormLayer(c3 + 2 * c4, c2, 1, 1, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = list(self.cv1(x).split((self.half, self.half), 1))
        y.append(self.cv2(y[-1]))
        y.append(self.cv3(y[-1]))
        return self.cv4(torch.cat(y, 1))


class SCDown(nn.Module):
    """1x1 conv, then a strided depthwise conv (both without activation)."""

    def __init__(self, c1: int, c2: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.cv1 = ConvNormLayer(c1, c2, 1, 1)
        self.cv2 = ConvNormLayer(c2, c2, kernel, stride, groups=c2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv2(self.cv1(x))


def build_encoder(cfg: DFINESize, in_channels: list[int]) -> HybridEncoder:
    hidden, act = cfg.enc_hidden, "silu"
    c4, blocks = round(cfg.expansion * hidden // 2), round(3 * cfg.depth_mult)
    n = len(in_channels)

    def elan() -> RepNCSPELAN4:
        return RepNCSPELAN4(2 * hidden, hidden, 2 * hidden, c4, blocks, act)

    return HybridEncoder(
        input_proj=nn.ModuleList(nn.Sequential(OrderedDict([
            ("conv", nn.Conv2d(c, hidden, 1, bias=False)), ("norm", nn.BatchNorm2d(hidden))])) for c in in_channels),
        encoder=nn.ModuleList([TransformerEncoder(
            lambda: TransformerEncoderLayer(hidden, cfg.heads, cfg.enc_ffn, "gelu"), 1)]),
        use_encoder_idx=(n - 1,),
        hidden_dim=hidden,
        lateral_convs=nn.ModuleList(ConvNormLayer(hidden, hidden, 1, 1) for _ in range(n - 1)),
        fpn_blocks=nn.ModuleList(elan() for _ in range(n - 1)),
        downsample_convs=nn.ModuleList(nn.Sequential(SCDown(hidden, hidden, 3, 2)) for _ in range(n - 1)),
        pan_blocks=nn.ModuleList(elan() for _ in range(n - 1)),
    )


class DFINE(nn.Module):
    """The D-FINE network; ``decoder_act`` is the decoder's activation (feed-forward layers,
    localisation-quality layers, MLP heads): ReLU for D-FINE, SiLU for the families that reuse this
    network unchanged otherwise (``deim``, ``rtdetrv4``)."""

    def __init__(self, size: str, nc: int = 80, *, decoder_act: str = "relu") -> None:
        super().__init__()
        if size not in SIZES:
            raise ValueError(f"unknown dfine size {size!r}; known sizes: {', '.join(SIZES)}")
        cfg = SIZES[size]
        self.size, self.nc = size, nc
        self.backbone = HGNetv2(cfg.backbone, cfg.return_idx, lab=cfg.lab, frozen_norm=cfg.frozen_norm)
        self.encoder = build_encoder(cfg, self.backbone.out_channels)
        levels = len(cfg.return_idx)
        self.decoder = DFINETransformer(nc, cfg.dec_hidden, [cfg.enc_hidden] * levels, heads=cfg.heads,
                                        num_layers=cfg.dec_layers, ffn=cfg.dec_ffn, points=cfg.points,
                                        reg_scale=cfg.reg_scale, strides=cfg.strides, act=decoder_act)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.decoder(self.encoder(self.backbone(x)))
