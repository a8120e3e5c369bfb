"""PResNet: ResNet-vd (deep stem, average-pool shortcuts) as RT-DETR uses it."""
from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from libreyolo.models.detr_shared.layers import ConvNormLayer

BLOCKS_PER_STAGE = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3)}
STAGE_WIDTHS = (64, 128, 256, 512)


def _shortcut(c_in: int, c_out: int, stride: int, frozen: bool) -> nn.Module:
    if stride == 2:  # variant d: average-pool, then a 1x1 conv at stride 1
        return nn.Sequential(OrderedDict([
            ("pool", nn.AvgPool2d(2, 2, 0, ceil_mode=True)),
            ("conv", ConvNormLayer(c_in, c_out, 1, 1, frozen_norm=frozen)),
        ]))
    return ConvNormLayer(c_in, c_out, 1, stride, frozen_norm=frozen)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, c_in: int, c_out: int, stride: int, shortcut: bool, frozen: bool) -> None:
        super().__init__()
        self.shortcut = shortcut
        if not shortcut:
            self.short = _shortcut(c_in, c_out, stride, frozen)
        self.branch2a = ConvNormLayer(c_in, c_out, 3, stride, act="relu", frozen_norm=frozen)
        self.branch2b = ConvNormLayer(c_out, c_out, 3, 1, frozen_norm=frozen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.branch2b(self.branch2a(x))
        return F.relu(out + (x if self.shortcut else self.short(x)))


class BottleNeck(nn.Module):
    expansion = 4

    def __init__(self, c_in: int, c_out: int, stride: int, shortcut: bool, frozen: bool) -> None:
        super().__init__()
        self.shortcut = shortcut
        self.branch2a = ConvNormLayer(c_in, c_out, 1, 1, act="relu", frozen_norm=frozen)
        self.branch2b = ConvNormLayer(c_out, c_out, 3, stride, act="relu", frozen_norm=frozen)
        self.branch2c = ConvNormLayer(c_out, c_out * self.expansion, 1, 1, frozen_norm=frozen)
        if not shortcut:
            self.short = _shortcut(c_in, c_out * self.expansion, stride, frozen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.branch2c(self.branch2b(self.branch2a(x)))
        return F.relu(out + (x if self.shortcut else self.short(x)))


class Blocks(nn.Module):
    def __init__(self, block: type[nn.Module], c_in: int, c_out: int, count: int, first_stage: bool,
                 frozen: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList()
        for i in range(count):
            stride = 2 if i == 0 and not first_stage else 1
            self.blocks.append(block(c_in, c_out, stride, i > 0, frozen))
            c_in = c_out * block.expansion  # type: ignore[attr-defined]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class PResNet(nn.Module):
    """Deep 3-conv stem, max-pool, four residual stages; returns the stages in ``return_idx``."""

    def __init__(self, depth: int, return_idx: tuple[int, ...] = (1, 2, 3), frozen_norm: bool = False) -> None:
        super().__init__()
        if depth not in BLOCKS_PER_STAGE:
            raise ValueError(f"PResNet depth must be one of {sorted(BLOCKS_PER_STAGE)}, got {depth}")
        stem = ((3, 32, 2, "conv1_1"), (32, 32, 1, "conv1_2"), (32, 64, 1, "conv1_3"))
        self.conv1 = nn.Sequential(OrderedDict(
            (name, ConvNormLayer(a, b, 3, s, act="relu", frozen_norm=frozen_norm)) for a, b, s, name in stem))
        block = BottleNeck if depth >= 50 else BasicBlock
        self.res_layers = nn.ModuleList()
        c_in = 64
        for i, (count, width) in enumerate(zip(BLOCKS_PER_STAGE[depth], STAGE_WIDTHS, strict=True)):
            self.res_layers.append(Blocks(block, c_in, width, count, i == 0, frozen_norm))
            c_in = width * block.expansion
        self.return_idx = tuple(return_idx)
        self.out_channels = [STAGE_WIDTHS[i] * block.expansion for i in self.return_idx]

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = F.max_pool2d(self.conv1(x), kernel_size=3, stride=2, padding=1)
        outs = []
        for i, stage in enumerate(self.res_layers):
            x = stage(x)
            if i in self.return_idx:
                outs.append(x)
        return outs
