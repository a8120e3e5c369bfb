"""The multi-scale projector of the LW-DETR line (LW-DETR, RF-DETR): a plain ViT's single-stride
feature maps -> a small pyramid for the decoder.

Per output level, every selected ViT feature map is resampled (P3: x2 up, P4: as is, P5: x2 down,
P6: an extra max-pool of the last level), the maps are concatenated on channels, fused by a C2f
block and layer-normalised over channels. Module and parameter names are the reference
checkpoints' (``stages_sampling``, ``stages``, ``cv1``/``cv2``/``m``, ``conv``/``bn``). The two
families differ in the conv units' norm: RF-DETR uses a channel LayerNorm (``layer_norm=True``,
still stored under ``bn``), LW-DETR BatchNorm.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from libreyolo.models.detr_shared.layers import activation

SCALE_OF_LEVEL = {"P3": 2.0, "P4": 1.0, "P5": 0.5, "P6": 0.25}


class ChannelLayerNorm(nn.Module):
    """LayerNorm over the channels of (B, C, H, W) maps (eps 1e-6)."""

    def __init__(self, channels: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.layer_norm(x.permute(0, 2, 3, 1), (x.shape[1],), self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class ConvX(nn.Module):
    """``conv`` (no bias, 'same' padding) -> ``bn`` (BatchNorm, or a channel LayerNorm) -> ``act``."""

    def __init__(self, c_in: int, c_out: int, kernel: int = 3, stride: int = 1, *, act: str = "relu",
                 layer_norm: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, bias=False)
        self.bn = ChannelLayerNorm(c_out) if layer_norm else nn.BatchNorm2d(c_out)
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    """Two 3x3 ConvX, no shortcut (as C2f uses it here)."""

    def __init__(self, c: int, layer_norm: bool) -> None:
        super().__init__()
        self.cv1 = ConvX(c, c, 3, act="silu", layer_norm=layer_norm)
        self.cv2 = ConvX(c, c, 3, act="silu", layer_norm=layer_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv2(self.cv1(x))


class C2f(nn.Module):
    """Split a 1x1 conv's output in two halves, chain ``n`` bottlenecks on the second, concatenate
    everything, fuse with a 1x1 conv."""

    def __init__(self, c_in: int, c_out: int, n: int, layer_norm: bool) -> None:
        super().__init__()
        self.c = c_out // 2
        self.cv1 = ConvX(c_in, 2 * self.c, 1, act="silu", layer_norm=layer_norm)
        self.cv2 = ConvX((2 + n) * self.c, c_out, 1, act="silu", layer_norm=layer_norm)
        self.m = nn.ModuleList(Bottleneck(self.c, layer_norm) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = list(self.cv1(x).split((self.c, self.c), 1))
        for m in self.m:
            y.append(m(y[-1]))
        return self.cv2(torch.cat(y, 1))


def _sampler(scale: float, c: int, layer_norm: bool) -> tuple[nn.Module, int]:
    """The resampling of one ``c``-channel input map for one output level, and its output width."""
    if scale == 2.0:
        if c > 512:  # wide ViTs (LW-DETR x): halve the channels first
            return nn.Sequential(ConvX(c, c // 2, 1, layer_norm=layer_norm),
                                 nn.ConvTranspose2d(c // 2, c // 4, 2, 2)), c // 4
        return nn.Sequential(nn.ConvTranspose2d(c, c // 2, 2, 2)), c // 2
    if scale == 1.0:
        return nn.Sequential(), c
    if scale == 0.5:
        return nn.Sequential(ConvX(c, c, 3, 2, layer_norm=layer_norm)), c
    raise ValueError(f"unsupported projector scale {scale}; expected one of 2.0, 1.0, 0.5 (P6 pools P5)")


class MultiScaleProjector(nn.Module):
    """ViT feature maps (each ``in_channels[i]`` wide, one stride) -> one map per ``levels`` entry
    (``"P3"``..``"P6"``, ascending), each ``out_channels`` wide."""

    def __init__(self, in_channels: Sequence[int], out_channels: int, levels: Sequence[str], *,
                 num_blocks: int = 3, layer_norm: bool = False) -> None:
        super().__init__()
        unknown = [lv for lv in levels if lv not in SCALE_OF_LEVEL]
        if unknown or not levels or list(levels) != sorted(levels):
            raise ValueError(f"projector levels must be ascending names from {sorted(SCALE_OF_LEVEL)}, got {levels}")
        self.extra_pool = "P6" in levels
        self.stages_sampling = nn.ModuleList()
        self.stages = nn.ModuleList()
        for level in levels:
            scale = SCALE_OF_LEVEL[level]
            if scale == 0.25:
                continue
            samplers = [_sampler(scale, c, layer_norm) for c in in_channels]
            self.stages_sampling.append(nn.ModuleList(s for s, _ in samplers))
            fused = sum(width for _, width in samplers)
            self.stages.append(nn.Sequential(C2f(fused, out_channels, num_blocks, layer_norm),
                                             ChannelLayerNorm(out_channels)))

    def forward(self, feats: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        out = []
        for sampling, stage in zip(self.stages_sampling, self.stages, strict=True):
            maps = [s(f) for s, f in zip(sampling, feats, strict=True)]
            out.append(stage(torch.cat(maps, 1) if len(maps) > 1 else maps[0]))
        if self.extra_pool:
            out.append(F.max_pool2d(out[-1], kernel_size=1, stride=2, padding=0))
        return out
