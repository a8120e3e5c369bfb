"""HGNetv2 (PP-HGNetV2), the backbone of D-FINE: a stem, then stages of HG blocks."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from libreyolo.models.detr_shared.layers import batch_norm


@dataclass(frozen=True)
class StageCfg:
    c_in: int
    c_mid: int
    c_out: int
    blocks: int
    downsample: bool
    light: bool
    kernel: int
    layers: int


@dataclass(frozen=True)
class HGNetCfg:
    stem: tuple[int, int, int]  # in, mid, out
    stages: tuple[StageCfg, ...]


_S = StageCfg
ARCHS: dict[str, HGNetCfg] = {  # stages: c_in, c_mid, c_out, blocks, downsample, light, kernel, layers
    # three-stage variants of DEIMv2's smallest sizes (atto, femto, pico)
    "Atto": HGNetCfg((3, 16, 16), (_S(16, 16, 64, 1, False, False, 3, 3), _S(64, 32, 256, 1, True, False, 3, 3),
                                    _S(256, 64, 256, 1, True, True, 3, 3))),
    "Femto": HGNetCfg((3, 16, 16), (_S(16, 16, 64, 1, False, False, 3, 3), _S(64, 32, 256, 1, True, False, 3, 3),
                                     _S(256, 64, 512, 1, True, True, 5, 3))),
    "Pico": HGNetCfg((3, 16, 16), (_S(16, 16, 64, 1, False, False, 3, 3), _S(64, 32, 256, 1, True, False, 3, 3),
                                    _S(256, 64, 512, 2, True, True, 5, 3))),
    "B0": HGNetCfg((3, 16, 16), (_S(16, 16, 64, 1, False, False, 3, 3), _S(64, 32, 256, 1, True, False, 3, 3),
                                  _S(256, 64, 512, 2, True, True, 5, 3), _S(512, 128, 1024, 1, True, True, 5, 3))),
    "B2": HGNetCfg((3, 24, 32), (_S(32, 32, 96, 1, False, False, 3, 4), _S(96, 64, 384, 1, True, False, 3, 4),
                                  _S(384, 128, 768, 3, True, True, 5, 4), _S(768, 256, 1536, 1, True, True, 5, 4))),
    "B4": HGNetCfg((3, 32, 48), (_S(48, 48, 128, 1, False, False, 3, 6), _S(128, 96, 512, 1, True, False, 3, 6),
                                  _S(512, 192, 1024, 3, True, True, 5, 6), _S(1024, 384, 2048, 1, True, True, 5, 6))),
    "B5": HGNetCfg((3, 32, 64), (_S(64, 64, 128, 1, False, False, 3, 6), _S(128, 128, 512, 2, True, False, 3, 6),
                                  _S(512, 256, 1024, 5, True, True, 5, 6), _S(1024, 512, 2048, 2, True, True, 5, 6))),
}


class LearnableAffineBlock(nn.Module):
    """``scale * x + bias`` with one learned scalar each."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([1.0]))
        self.bias = nn.Parameter(torch.tensor([0.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x + self.bias


class ConvBNAct(nn.Module):
    """conv -> bn -> ReLU (optional) -> learnable affine (with ReLU and ``lab`` only)."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1, groups: int = 1, *, act: bool = True,
                 lab: bool = False, frozen: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False)
        self.bn = batch_norm(c_out, frozen)
        self.act: nn.Module = nn.ReLU() if act else nn.Identity()
        self.lab: nn.Module = LearnableAffineBlock() if act and lab else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lab(self.act(self.bn(self.conv(x))))


class LightConvBNAct(nn.Module):
    """1x1 conv (no activation), then a depthwise ``kernel`` conv."""

    def __init__(self, c_in: int, c_out: int, kernel: int, lab: bool, frozen: bool) -> None:
        super().__init__()
        self.conv1 = ConvBNAct(c_in, c_out, 1, act=False, lab=lab, frozen=frozen)
        self.conv2 = ConvBNAct(c_out, c_out, kernel, groups=c_out, lab=lab, frozen=frozen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x))


class StemBlock(nn.Module):
    def __init__(self, c_in: int, c_mid: int, c_out: int, lab: bool, frozen: bool) -> None:
        super().__init__()
        self.stem1 = ConvBNAct(c_in, c_mid, 3, 2, lab=lab, frozen=frozen)
        self.stem2a = ConvBNAct(c_mid, c_mid // 2, 2, 1, lab=lab, frozen=frozen)
        self.stem2b = ConvBNAct(c_mid // 2, c_mid, 2, 1, lab=lab, frozen=frozen)
        self.stem3 = ConvBNAct(c_mid * 2, c_mid, 3, 2, lab=lab, frozen=frozen)
        self.stem4 = ConvBNAct(c_mid, c_out, 1, 1, lab=lab, frozen=frozen)
        self.pool = nn.MaxPool2d(kernel_size=2, stride=1, ceil_mode=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.pad(self.stem1(x), (0, 1, 0, 1))
        x2 = self.stem2b(F.pad(self.stem2a(x), (0, 1, 0, 1)))
        x = torch.cat([self.pool(x), x2], dim=1)
        return self.stem4(self.stem3(x))


class HGBlock(nn.Module):
    """``layers`` convs in a chain, all outputs concatenated, squeezed and excited by two 1x1 convs."""

    def __init__(self, c_in: int, c_mid: int, c_out: int, layers: int, kernel: int, residual: bool, light: bool,
                 lab: bool, frozen: bool) -> None:
        super().__init__()
        self.residual = residual
        self.layers = nn.ModuleList()
        for i in range(layers):
            c = c_in if i == 0 else c_mid
            self.layers.append(LightConvBNAct(c, c_mid, kernel, lab, frozen) if light
                               else ConvBNAct(c, c_mid, kernel, 1, lab=lab, frozen=frozen))
        total = c_in + layers * c_mid
        self.aggregation = nn.Sequential(ConvBNAct(total, c_out // 2, 1, 1, lab=lab, frozen=frozen),
                                         ConvBNAct(c_out // 2, c_out, 1, 1, lab=lab, frozen=frozen))
        self.drop_path = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        outputs = [x]
        for layer in self.layers:
            x = layer(x)
            outputs.append(x)
        x = self.aggregation(torch.cat(outputs, dim=1))
        return self.drop_path(x) + identity if self.residual else x


class HGStage(nn.Module):
    def __init__(self, cfg: StageCfg, lab: bool, frozen: bool) -> None:
        super().__init__()
        self.downsample: nn.Module = (ConvBNAct(cfg.c_in, cfg.c_in, 3, 2, cfg.c_in, act=False, lab=lab, frozen=frozen)
                                      if cfg.downsample else nn.Identity())
        self.blocks = nn.Sequential(*(
            HGBlock(cfg.c_in if i == 0 else cfg.c_out, cfg.c_mid, cfg.c_out, cfg.layers, cfg.kernel, i > 0,
                    cfg.light, lab, frozen) for i in range(cfg.blocks)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.downsample(x))


class HGNetv2(nn.Module):
    def __init__(self, arch: str, return_idx: tuple[int, ...], *, lab: bool, frozen_norm: bool) -> None:
        super().__init__()
        cfg = ARCHS[arch]
        self.stem = StemBlock(*cfg.stem, lab=lab, frozen=frozen_norm)
        self.stages = nn.ModuleList(HGStage(s, lab, frozen_norm) for s in cfg.stages)
        self.return_idx = tuple(return_idx)
        self.out_channels = [cfg.stages[i].c_out for i in self.return_idx]

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(x)
        outs = []
        for i, stage in enumerate(self.stages):
            x = stage(x)
            if i in self.return_idx:
                outs.append(x)
        return outs
