"""RTMDet (CSPNeXt backbone, CSPNeXt PAFPN neck, separate-BN head with convs shared across levels).

Module names and tensor shapes follow the LibreYOLO checkpoint format (schema 1.0), which keeps
the mmdetection layout with ``bbox_head`` renamed ``head``, so a reference state dict loads key
for key. Sizes differ only in ``SIZES``: depth and width multipliers, and whether the box
branch exponentiates its distances (m, l, x).

The head's 3x3 tower convolutions are one module per stacked position, shared by the three
levels; each level keeps its own BatchNorm. A shared module appears in the state dict under
every level's name (``head.cls_convs.{0,1,2}.i.conv.weight``), as in the reference's files;
files that store only level 0 (mmdetection conversions) are completed on load.

A freshly built head starts as mmdetection's RTMDet does (``RTMDetSepBNHead.init_weights``):
every head conv drawn from N(0, 0.01) without bias, except the class convs' bias at the prior
probability 0.01 (about -4.6), so an untrained model starts near "nothing here"; the box convs
start near zero distances. Loading a checkpoint overwrites all of it.

The network's output (eval mode) is what the reference module returns:
``(cls_logits, distances)``, each a tuple over the levels P3, P4, P5 of ``(B, nc, H, W)``
class logits and ``(B, 4, H, W)`` left/top/right/bottom distances already in input pixels.
:func:`decode` turns them into detector-agnostic predictions. The input is the letterboxed BGR
image normalised with the mmdetection mean/std (the family's letterbox produces it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from libreyolo.layers import ConvBNAct


@dataclass(frozen=True)
class RTMDetSize:
    depth: float        # multiplier of the CSP block counts
    width: float        # multiplier of the channel counts
    exp_distances: bool  # box distances are exp(raw) * stride rather than raw * stride


SIZES: dict[str, RTMDetSize] = {
    "t": RTMDetSize(0.167, 0.375, False),
    "s": RTMDetSize(0.33, 0.50, False),
    "m": RTMDetSize(0.67, 0.75, True),
    "l": RTMDetSize(1.00, 1.00, True),
    "x": RTMDetSize(1.33, 1.25, True),
}

STRIDES = (8, 16, 32)
# backbone stages at width 1.0: (out channels, blocks, residual blocks, SPP before the CSP layer)
_STAGES = ((128, 3, True, False), (256, 6, True, False), (512, 6, True, False), (1024, 3, False, True))
_STEM = 64
_NECK_BLOCKS = 3
# the checkpoints' BatchNorm settings: PyTorch's defaults (mmdetection's SyncBN config sets none)
_BN = {"bn_eps": 1e-5, "bn_momentum": 0.1}


def _conv(c_in: int, c_out: int, kernel: int = 1, stride: int = 1, groups: int = 1) -> ConvBNAct:
    return ConvBNAct(c_in, c_out, kernel, stride, groups=groups, **_BN)


def _blocks(n: int, depth: float) -> int:
    return max(round(n * depth), 1)


class DepthwiseSeparable(nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel: int) -> None:
        super().__init__()
        self.depthwise_conv = _conv(c_in, c_in, kernel, groups=c_in)
        self.pointwise_conv = _conv(c_in, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise_conv(self.depthwise_conv(x))


class CSPNeXtBlock(nn.Module):
    """3x3 conv, then a depthwise-separable 5x5; a residual when asked and the widths agree."""

    def __init__(self, channels: int, residual: bool) -> None:
        super().__init__()
        self.conv1 = _conv(channels, channels, 3)
        self.conv2 = DepthwiseSeparable(channels, channels, 5)
        self.residual = residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(self.conv1(x))
        return x + y if self.residual else y


class ChannelAttention(nn.Module):
    """Global average, a 1x1 conv and a hard sigmoid gate per channel."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.fc = nn.Conv2d(channels, channels, 1)
        self.gate = nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.fc(x.mean((2, 3), keepdim=True)))


class CSPLayer(nn.Module):
    """Two 1x1 branches (one through ``blocks``), concatenated, optionally gated, then fused."""

    def __init__(self, c_in: int, c_out: int, blocks: int, residual: bool, attention: bool) -> None:
        super().__init__()
        mid = c_out // 2
        self.main_conv = _conv(c_in, mid)
        self.short_conv = _conv(c_in, mid)
        self.final_conv = _conv(2 * mid, c_out)
        self.blocks = nn.Sequential(*(CSPNeXtBlock(mid, residual) for _ in range(blocks)))
        self.attention = ChannelAttention(2 * mid) if attention else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat((self.blocks(self.main_conv(x)), self.short_conv(x)), 1)
        if self.attention is not None:
            y = self.attention(y)
        return self.final_conv(y)


class SPPBottleneck(nn.Module):
    """1x1 halving conv, max pools of 5, 9 and 13 side by side (not chained), then a 1x1 conv."""

    def __init__(self, channels: int, kernels: tuple[int, ...] = (5, 9, 13)) -> None:
        super().__init__()
        mid = channels // 2
        self.conv1 = _conv(channels, mid)
        self.poolings = nn.ModuleList(nn.MaxPool2d(k, 1, k // 2) for k in kernels)
        self.conv2 = _conv(mid * (len(kernels) + 1), channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        return self.conv2(torch.cat([x, *(pool(x) for pool in self.poolings)], 1))


class CSPNeXt(nn.Module):
    """Three-conv stem (stride 2), four stride-2 stages; returns the stage 2, 3, 4 maps (P3-P5)."""

    def __init__(self, size: RTMDetSize) -> None:
        super().__init__()
        stem = int(_STEM * size.width)
        self.stem = nn.Sequential(_conv(3, stem // 2, 3, 2), _conv(stem // 2, stem // 2, 3), _conv(stem // 2, stem, 3))
        c_in = stem
        for i, (c, n, residual, spp) in enumerate(_STAGES, 1):
            c = int(c * size.width)
            layers: list[nn.Module] = [_conv(c_in, c, 3, 2)]
            if spp:
                layers.append(SPPBottleneck(c))
            layers.append(CSPLayer(c, c, _blocks(n, size.depth), residual, attention=True))
            self.add_module(f"stage{i}", nn.Sequential(*layers))
            c_in = c

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.stage2(self.stage1(self.stem(x)))
        p4 = self.stage3(x)
        return x, p4, self.stage4(p4)


class CSPNeXtPAFPN(nn.Module):
    """Top-down then bottom-up path aggregation; a 3x3 conv brings every level to ``c_out``."""

    def __init__(self, channels: tuple[int, int, int], c_out: int, blocks: int) -> None:
        super().__init__()
        c3, c4, c5 = channels

        def csp(c_in: int, c: int) -> CSPLayer:
            return CSPLayer(c_in, c, blocks, residual=False, attention=False)

        self.reduce_layers = nn.ModuleList([_conv(c5, c4), _conv(c4, c3)])
        self.top_down_blocks = nn.ModuleList([csp(2 * c4, c4), csp(2 * c3, c3)])
        self.downsamples = nn.ModuleList([_conv(c3, c3, 3, 2), _conv(c4, c4, 3, 2)])
        self.bottom_up_blocks = nn.ModuleList([csp(2 * c3, c4), csp(2 * c4, c5)])
        self.out_convs = nn.ModuleList(_conv(c, c_out, 3) for c in channels)
        self.upsample = nn.Upsample(scale_factor=2, mode="nearest")

    def forward(self, feats: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        p3, p4, p5 = feats
        r5 = self.reduce_layers[0](p5)
        t4 = self.top_down_blocks[0](torch.cat((self.upsample(r5), p4), 1))
        r4 = self.reduce_layers[1](t4)
        t3 = self.top_down_blocks[1](torch.cat((self.upsample(r4), p3), 1))
        b4 = self.bottom_up_blocks[0](torch.cat((self.downsamples[0](t3), r4), 1))
        b5 = self.bottom_up_blocks[1](torch.cat((self.downsamples[1](b4), r5), 1))
        return tuple(conv(x) for conv, x in zip(self.out_convs, (t3, b4, b5), strict=True))


class RTMDetSepBNHead(nn.Module):
    """Class and box towers of ``stacked`` 3x3 convs, then 1x1 predictors; one set of BNs per level."""

    def __init__(self, nc: int, channels: int, exp_distances: bool, stacked: int = 2,
                 strides: tuple[int, ...] = STRIDES) -> None:
        super().__init__()
        self.strides = strides
        self.exp_distances = exp_distances
        levels = len(strides)
        self.cls_convs = nn.ModuleList(nn.ModuleList(_conv(channels, channels, 3) for _ in range(stacked))
                                       for _ in range(levels))
        self.reg_convs = nn.ModuleList(nn.ModuleList(_conv(channels, channels, 3) for _ in range(stacked))
                                       for _ in range(levels))
        self.rtm_cls = nn.ModuleList(nn.Conv2d(channels, nc, 1) for _ in range(levels))
        self.rtm_reg = nn.ModuleList(nn.Conv2d(channels, 4, 1) for _ in range(levels))
        for towers in (self.cls_convs, self.reg_convs):
            for level in towers[1:]:
                for i, layer in enumerate(level):
                    layer.conv = towers[0][i].conv  # one conv for every level; BNs stay per level
        self.register_load_state_dict_pre_hook(_complete_shared_keys)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self, prior: float = 0.01, std: float = 0.01) -> None:
        """mmdetection's start for a head about to be trained: N(0, ``std``) convs, zero biases,
        class biases at ``prior`` probability (BatchNorms keep PyTorch's 1 and 0)."""
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.normal_(m.weight, 0.0, std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        for conv in self.rtm_cls:
            nn.init.constant_(conv.bias, -math.log((1 - prior) / prior))

    def forward(self, feats: tuple[torch.Tensor, ...]) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        logits, distances = [], []
        for i, (x, stride) in enumerate(zip(feats, self.strides, strict=True)):
            c = x
            for layer in self.cls_convs[i]:
                c = layer(c)
            r = x
            for layer in self.reg_convs[i]:
                r = layer(r)
            d = self.rtm_reg[i](r)
            logits.append(self.rtm_cls[i](c))
            distances.append((d.exp() if self.exp_distances else d) * stride)
        return tuple(logits), tuple(distances)


def _complete_shared_keys(head: RTMDetSepBNHead, state: dict[str, Any], prefix: str, *_: Any) -> None:
    """A file storing the shared tower convs only under level 0 gets them under every level's name."""
    for tower in ("cls_convs", "reg_convs"):
        for i, layer in enumerate(getattr(head, tower)[0]):
            for name in dict(layer.conv.named_parameters()):
                first = f"{prefix}{tower}.0.{i}.conv.{name}"
                if first in state:
                    for level in range(1, len(head.strides)):
                        state.setdefault(f"{prefix}{tower}.{level}.{i}.conv.{name}", state[first])


def level_points(maps: tuple[torch.Tensor, ...], strides: tuple[int, ...] = STRIDES) -> torch.Tensor:
    """The points of the level maps (..., H, W), (2, N) ``(column, row) * stride`` in input pixels,
    in the order :func:`decode` flattens the maps; on the maps' device and dtype."""
    points = []
    for m, stride in zip(maps, strides, strict=True):
        h, w = m.shape[-2:]
        xs = torch.arange(w, device=m.device, dtype=m.dtype) * stride
        ys = torch.arange(h, device=m.device, dtype=m.dtype) * stride
        points.append(torch.stack((xs.view(1, w).expand(h, w), ys.view(h, 1).expand(h, w))).flatten(1))
    return torch.cat(points, 1)


def level_strides(maps: tuple[torch.Tensor, ...], strides: tuple[int, ...] = STRIDES) -> torch.Tensor:
    """(N,) the stride of each point of :func:`level_points`."""
    return torch.cat([torch.full((m.shape[-2] * m.shape[-1],), float(s), device=m.device, dtype=m.dtype)
                      for m, s in zip(maps, strides, strict=True)])


def decode_boxes(distances: tuple[torch.Tensor, ...], strides: tuple[int, ...] = STRIDES) -> torch.Tensor:
    """Per-level distances (B, 4, H, W) -> (B, 4, N) xyxy boxes in input pixels (see :func:`decode`);
    differentiable, so the training loss decodes with it too."""
    point = level_points(distances, strides).unsqueeze(0)  # (1, 2, N)
    dist = torch.cat([d.flatten(2) for d in distances], 2)  # (B, 4, N)
    return torch.cat((point - dist[:, :2], point + dist[:, 2:]), 1)


def decode(outputs: tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]],
           strides: tuple[int, ...] = STRIDES) -> torch.Tensor:
    """``(cls_logits, distances)`` -> (B, 4 + nc, N): xyxy boxes in input pixels, then sigmoid class scores.

    A cell's point is its top-left corner, ``(column, row) * stride`` (the RTMDet recipe's prior
    offset 0), and its box ``point - (left, top)`` to ``point + (right, bottom)``. Every class
    keeps its own score (RTMDet labels multi-label; the shared postprocessing picks the pairs).
    Portable ops only, no host reads: the same code runs eagerly, in graphs and in artifacts.
    """
    logits, distances = outputs
    scores = torch.cat([c.flatten(2) for c in logits], 2).sigmoid()
    return torch.cat((decode_boxes(distances, strides), scores), 1)


class RTMDet(nn.Module):
    """The network. ``forward`` returns ``(cls_logits, distances)`` per level, as the checkpoints' model does."""

    def __init__(self, size: str = "s", nc: int = 80) -> None:
        super().__init__()
        if size not in SIZES:
            raise ValueError(f"unknown RTMDet size {size!r}; choose one of {', '.join(SIZES)}")
        cfg = SIZES[size]
        self.size, self.nc = size, nc
        neck_in = tuple(int(c * cfg.width) for c in (256, 512, 1024))
        width = neck_in[0]
        self.backbone = CSPNeXt(cfg)
        self.neck = CSPNeXtPAFPN(neck_in, width, _blocks(_NECK_BLOCKS, cfg.depth))
        self.head = RTMDetSepBNHead(nc, width, cfg.exp_distances)

    def forward(self, x: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        return self.head(self.neck(self.backbone(x)))
