"""Convolution + BatchNorm + activation, the unit most CNN detectors are made of."""
from __future__ import annotations

import torch
from torch import nn


def autopad(kernel: int, dilation: int = 1) -> int:
    """'Same' padding for an odd kernel at stride 1."""
    return dilation * (kernel - 1) // 2


class ConvBNAct(nn.Module):
    """``conv`` -> ``bn`` -> ``act``; the submodule names are part of the checkpoint format."""

    def __init__(
        self,
        c_in: int,
        c_out: int,
        kernel: int = 1,
        stride: int = 1,
        *,
        groups: int = 1,
        act: bool = True,
        bn_eps: float = 1e-3,
        bn_momentum: float = 0.03,
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel, stride, autopad(kernel), groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(c_out, eps=bn_eps, momentum=bn_momentum)
        self.act: nn.Module = nn.SiLU(inplace=True) if act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))
