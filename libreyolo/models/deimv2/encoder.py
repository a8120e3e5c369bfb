"""DEIMv2's encoders: the hybrid encoder (sizes n to x, summed level fusion) and the lite
encoder of the HGNetv2 sizes atto, femto, pico (one backbone level, a pooled second level,
global-average fusion, one FPN and one PAN block).

The fusion blocks are CSP-ELAN with the "csp2" inner layer (one 1x1 conv split in two halves,
RepVGG blocks on one of them, the halves summed): with a 3x3 conv after each inner layer
(``tail_conv``, D-FINE's RepNCSPELAN4 layout, sizes atto to n) or without (RepNCSPELAN5, s to x).
"""
from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from libreyolo.models.detr_shared import (
    ConvNormLayer,
    HybridEncoder,
    RepVggBlock,
    TransformerEncoder,
    TransformerEncoderLayer,
)
from libreyolo.models.detr_shared.layers import activation
from libreyolo.models.dfine.network import SCDown


class CSPLayer2(nn.Module):
    """``conv1`` to twice the width, split; RepVGG blocks on the second half, plus the first."""

    def __init__(self, c_in: int, c_out: int, blocks: int, act: str = "silu") -> None:
        super().__init__()
        self.conv1 = ConvNormLayer(c_in, 2 * c_out, 1, 1, act=act)
        self.bottlenecks = nn.Sequential(*(RepVggBlock(c_out, c_out, act) for _ in range(blocks)))
        self.conv3 = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.conv1(x).chunk(2, 1)
        return self.conv3(a + self.bottlenecks(b))


class RepNCSPELAN(nn.Module):
    """Split, two CSP2 branches chained on the second half (each followed by a 3x3 conv when
    ``tail_conv``), concatenate all, project."""

    def __init__(self, c1: int, c2: int, c3: int, c4: int, blocks: int, act: str = "silu", *,
                 tail_conv: bool) -> None:
        super().__init__()
        self.half = c3 // 2

        def branch(c_in: int) -> nn.Sequential:
            layers: list[nn.Module] = [CSPLayer2(c_in, c4, blocks, act)]
            if tail_conv:
                layers.append(ConvNormLayer(c4, c4, 3, 1, act=act))
            return nn.Sequential(*layers)

        self.cv1 = ConvNormLayer(c1, c3, 1, 1, act=act)
        self.cv2 = branch(c3 // 2)
        self.cv3 = branch(c4)
        self.cv4 = ConvNormLayer(c3 + 2 * c4, c2, 1, 1, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = list(self.cv1(x).split((self.half, self.half), 1))
        y.append(self.cv2(y[-1]))
        y.append(self.cv3(y[-1]))
        return self.cv4(torch.cat(y, 1))


def _proj(c_in: int, hidden: int) -> nn.Module:
    if c_in == hidden:
        return nn.Identity()
    return nn.Sequential(OrderedDict([("conv", nn.Conv2d(c_in, hidden, 1, bias=False)),
                                      ("norm", nn.BatchNorm2d(hidden))]))


def _elan(hidden: int, expansion: float, depth_mult: float, tail_conv: bool) -> RepNCSPELAN:
    return RepNCSPELAN(hidden, hidden, 2 * hidden, round(expansion * hidden // 2), round(3 * depth_mult), "silu",
                       tail_conv=tail_conv)


def build_hybrid_encoder(in_channels: list[int], hidden: int, ffn: int, expansion: float, depth_mult: float,
                         tail_conv: bool, heads: int = 8) -> HybridEncoder:
    n = len(in_channels)
    return HybridEncoder(
        input_proj=nn.ModuleList(_proj(c, hidden) for c in in_channels),
        encoder=nn.ModuleList([TransformerEncoder(lambda: TransformerEncoderLayer(hidden, heads, ffn, "gelu"), 1)]),
        use_encoder_idx=(n - 1,),
        hidden_dim=hidden,
        lateral_convs=nn.ModuleList(ConvNormLayer(hidden, hidden, 1, 1) for _ in range(n - 1)),
        fpn_blocks=nn.ModuleList(_elan(hidden, expansion, depth_mult, tail_conv) for _ in range(n - 1)),
        downsample_convs=nn.ModuleList(nn.Sequential(SCDown(hidden, hidden, 3, 2)) for _ in range(n - 1)),
        pan_blocks=nn.ModuleList(_elan(hidden, expansion, depth_mult, tail_conv) for _ in range(n - 1)),
        fuse="sum",
    )


class GAPFusion(nn.Module):
    """Add the global average, then a 1x1 conv."""

    def __init__(self, c: int, act: str = "silu") -> None:
        super().__init__()
        self.cv = ConvNormLayer(c, c, 1, 1, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv(x + F.adaptive_avg_pool2d(x, 1))


def _pool_down(c: int, act: str) -> nn.Sequential:
    return nn.Sequential(nn.AvgPool2d(3, 2, 1), nn.Conv2d(c, c, 1, 1, bias=False), nn.BatchNorm2d(c), activation(act))


class LiteEncoder(nn.Module):
    """One backbone level (stride 16) -> two levels (strides 16, 32) of ``hidden`` channels."""

    def __init__(self, c_in: int, hidden: int, expansion: float, depth_mult: float, act: str = "silu") -> None:
        super().__init__()
        self.input_proj = nn.ModuleList([nn.Sequential(OrderedDict([
            ("conv", nn.Conv2d(c_in, hidden, 1, bias=False)), ("norm", nn.BatchNorm2d(hidden))]))])
        self.down_sample1 = _pool_down(hidden, act)
        self.down_sample2 = _pool_down(hidden, act)
        self.bi_fusion = GAPFusion(hidden, act)
        self.fpn_block = _elan(hidden, expansion, depth_mult, True)
        self.pan_block = _elan(hidden, expansion, depth_mult, True)

    def forward(self, feats: list[torch.Tensor]) -> list[torch.Tensor]:
        (feat,) = feats
        p16 = self.input_proj[0](feat)
        p32 = self.bi_fusion(self.down_sample1(p16))
        o16 = self.fpn_block(p16 + F.interpolate(p32, scale_factor=2.0, mode="nearest"))
        o32 = self.pan_block(p32 + self.down_sample2(o16))
        return [o16, o32]
