"""YOLOX (CSPDarknet backbone with a Focus stem, PAFPN neck, decoupled anchor-free head).

Module names and tensor shapes follow the LibreYOLO checkpoint format (schema 1.0), so a
reference state dict loads key for key. Sizes differ only in the table ``SIZES``: depth and
width multipliers, and whether 3x3 convolutions are depthwise-separable (nano only).

The network's output (eval mode) is what reference checkpoints were trained to produce: one map
per level, ``(B, 4 + 1 + nc, H, W)`` holding raw box offsets, the objectness probability and the
class probabilities. :func:`decode` turns those maps into detector-agnostic predictions.
``forward_logits`` returns the same maps with logits instead of probabilities, for training.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from libreyolo.layers import ConvBNAct


@dataclass(frozen=True)
class YoloxSize:
    depth: float       # multiplier of the CSP bottleneck counts
    width: float       # multiplier of the channel counts
    depthwise: bool    # 3x3 convs as depthwise 3x3 + pointwise 1x1 (the nano model)


SIZES: dict[str, YoloxSize] = {
    "n": YoloxSize(0.33, 0.25, True),
    "t": YoloxSize(0.33, 0.375, False),
    "s": YoloxSize(0.33, 0.50, False),
    "m": YoloxSize(0.67, 0.75, False),
    "l": YoloxSize(1.00, 1.00, False),
    "x": YoloxSize(1.33, 1.25, False),
}

STRIDES = (8, 16, 32)
NECK_CHANNELS = (256, 512, 1024)  # P3, P4, P5 at width 1.0
HEAD_CHANNELS = 256  # at width 1.0


class SeparableConv(nn.Module):
    """Depthwise ``k x k`` conv (``dconv``) then pointwise 1x1 conv (``pconv``), each with BN + SiLU."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1) -> None:
        super().__init__()
        self.dconv = ConvBNAct(c_in, c_in, kernel, stride, groups=c_in)
        self.pconv = ConvBNAct(c_in, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pconv(self.dconv(x))


def _conv3(c_in: int, c_out: int, stride: int, depthwise: bool) -> nn.Module:
    """The 3x3 convolution of a size: plain, or depthwise-separable for the nano model."""
    return SeparableConv(c_in, c_out, 3, stride) if depthwise else ConvBNAct(c_in, c_out, 3, stride)


class Bottleneck(nn.Module):
    def __init__(self, c_in: int, c_out: int, shortcut: bool, depthwise: bool) -> None:
        super().__init__()
        self.conv1 = ConvBNAct(c_in, c_out, 1)
        self.conv2 = _conv3(c_out, c_out, 1, depthwise)
        self.add = shortcut and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(self.conv1(x))
        return x + y if self.add else y


class CSPLayer(nn.Module):
    """Two 1x1 branches, bottlenecks on the first, concatenated and fused by a 1x1 conv."""

    def __init__(self, c_in: int, c_out: int, repeats: int, *, shortcut: bool, depthwise: bool) -> None:
        super().__init__()
        hidden = c_out // 2
        self.conv1 = ConvBNAct(c_in, hidden, 1)
        self.conv2 = ConvBNAct(c_in, hidden, 1)
        self.conv3 = ConvBNAct(2 * hidden, c_out, 1)
        self.m = nn.Sequential(*(Bottleneck(hidden, hidden, shortcut, depthwise) for _ in range(repeats)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv3(torch.cat((self.m(self.conv1(x)), self.conv2(x)), 1))


class SPPBottleneck(nn.Module):
    """Spatial pyramid pooling: parallel 5/9/13 max-pools of a halved map, concatenated, fused."""

    def __init__(self, c_in: int, c_out: int, kernels: tuple[int, ...] = (5, 9, 13)) -> None:
        super().__init__()
        hidden = c_in // 2
        self.conv1 = ConvBNAct(c_in, hidden, 1)
        self.m = nn.ModuleList(nn.MaxPool2d(k, stride=1, padding=k // 2) for k in kernels)
        self.conv2 = ConvBNAct(hidden * (len(kernels) + 1), c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        return self.conv2(torch.cat([x] + [pool(x) for pool in self.m], 1))


class Focus(nn.Module):
    """Space-to-depth (each 2x2 block's four pixels become channels), then a 3x3 conv."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv = ConvBNAct(4 * c_in, c_out, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # channel groups in the order the checkpoints were trained with: even rows/even cols,
        # odd rows/even cols, even rows/odd cols, odd rows/odd cols
        return self.conv(torch.cat((x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]), 1))


class CSPDarknet(nn.Module):
    def __init__(self, cfg: YoloxSize) -> None:
        super().__init__()
        c = int(cfg.width * 64)
        n = max(round(cfg.depth * 3), 1)
        dw = cfg.depthwise
        self.stem = Focus(3, c)
        self.dark2 = nn.Sequential(_conv3(c, 2 * c, 2, dw), CSPLayer(2 * c, 2 * c, n, shortcut=True, depthwise=dw))
        self.dark3 = nn.Sequential(_conv3(2 * c, 4 * c, 2, dw),
                                   CSPLayer(4 * c, 4 * c, 3 * n, shortcut=True, depthwise=dw))
        self.dark4 = nn.Sequential(_conv3(4 * c, 8 * c, 2, dw),
                                   CSPLayer(8 * c, 8 * c, 3 * n, shortcut=True, depthwise=dw))
        self.dark5 = nn.Sequential(_conv3(8 * c, 16 * c, 2, dw), SPPBottleneck(16 * c, 16 * c),
                                   CSPLayer(16 * c, 16 * c, n, shortcut=False, depthwise=dw))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.dark2(self.stem(x))
        c3 = self.dark3(x)
        c4 = self.dark4(c3)
        return c3, c4, self.dark5(c4)


class PAFPN(nn.Module):
    """The backbone plus a top-down then bottom-up path; ``backbone`` is a submodule (checkpoint layout)."""

    def __init__(self, cfg: YoloxSize) -> None:
        super().__init__()
        c3, c4, c5 = (int(c * cfg.width) for c in NECK_CHANNELS)
        n = round(3 * cfg.depth)
        dw = cfg.depthwise
        self.backbone = CSPDarknet(cfg)
        self.upsample = nn.Upsample(scale_factor=2.0, mode="nearest")
        self.lateral_conv0 = ConvBNAct(c5, c4, 1)
        self.C3_p4 = CSPLayer(2 * c4, c4, n, shortcut=False, depthwise=dw)
        self.reduce_conv1 = ConvBNAct(c4, c3, 1)
        self.C3_p3 = CSPLayer(2 * c3, c3, n, shortcut=False, depthwise=dw)
        self.bu_conv2 = _conv3(c3, c3, 2, dw)
        self.C3_n3 = CSPLayer(2 * c3, c4, n, shortcut=False, depthwise=dw)
        self.bu_conv1 = _conv3(c4, c4, 2, dw)
        self.C3_n4 = CSPLayer(2 * c4, c5, n, shortcut=False, depthwise=dw)
        self.out_channels = (c3, c4, c5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c3, c4, c5 = self.backbone(x)
        top5 = self.lateral_conv0(c5)
        td4 = self.C3_p4(torch.cat((self.upsample(top5), c4), 1))
        top4 = self.reduce_conv1(td4)
        p3 = self.C3_p3(torch.cat((self.upsample(top4), c3), 1))
        p4 = self.C3_n3(torch.cat((self.bu_conv2(p3), top4), 1))
        p5 = self.C3_n4(torch.cat((self.bu_conv1(p4), top5), 1))
        return p3, p4, p5


class YoloxHead(nn.Module):
    """Decoupled head per level: a 1x1 stem, then a class branch and a box branch (box + objectness)."""

    def __init__(self, in_channels: tuple[int, ...], nc: int, width: float, depthwise: bool) -> None:
        super().__init__()
        self.nc = nc
        hidden = int(HEAD_CHANNELS * width)
        levels = range(len(in_channels))
        # registration order = the checkpoints' key order
        self.cls_convs = nn.ModuleList(
            nn.Sequential(_conv3(hidden, hidden, 1, depthwise), _conv3(hidden, hidden, 1, depthwise)) for _ in levels)
        self.reg_convs = nn.ModuleList(
            nn.Sequential(_conv3(hidden, hidden, 1, depthwise), _conv3(hidden, hidden, 1, depthwise)) for _ in levels)
        self.cls_preds = nn.ModuleList(nn.Conv2d(hidden, nc, 1) for _ in levels)
        self.reg_preds = nn.ModuleList(nn.Conv2d(hidden, 4, 1) for _ in levels)
        self.obj_preds = nn.ModuleList(nn.Conv2d(hidden, 1, 1) for _ in levels)
        self.stems = nn.ModuleList(ConvBNAct(c, hidden, 1) for c in in_channels)
        self.init_biases()

    @torch.no_grad()
    def init_biases(self, prior: float = 0.01) -> None:
        """The usual prior for an untrained head: objectness and class probabilities start at ``prior``,
        so a fresh model predicts almost nothing (as one about to be trained should)."""
        for conv in (*self.cls_preds, *self.obj_preds):
            conv.bias.fill_(-math.log((1 - prior) / prior))

    def forward(self, feats: tuple[torch.Tensor, ...], logits: bool = False) -> list[torch.Tensor]:
        """Per level ``(B, 4 + 1 + nc, H, W)``: raw box offsets, then objectness and class
        probabilities, or (``logits=True``, what the training loss reads) their logits."""
        out = []
        for x, stem, cls_convs, reg_convs, cls_pred, reg_pred, obj_pred in zip(
                feats, self.stems, self.cls_convs, self.reg_convs, self.cls_preds, self.reg_preds, self.obj_preds,
                strict=True):
            x = stem(x)
            cls_feat = cls_convs(x)
            reg_feat = reg_convs(x)
            reg, obj, cls = reg_pred(reg_feat), obj_pred(reg_feat), cls_pred(cls_feat)
            if not logits:
                obj, cls = obj.sigmoid(), cls.sigmoid()
            out.append(torch.cat((reg, obj, cls), 1))
        return out


def level_grid(levels: list[torch.Tensor], strides: tuple[int, ...] = STRIDES) -> tuple[torch.Tensor, torch.Tensor]:
    """The cells of every level, in the order the maps flatten (level, then row, then column).

    Returns (grid (1, 2, N): each cell's (column, row) index, stride (1, 1, N): its level's stride
    in input pixels), in the maps' dtype and on their device.
    """
    ref = levels[0]
    centres, scales = [], []
    for lv, s in zip(levels, strides, strict=True):
        h, w = lv.shape[2], lv.shape[3]
        gy, gx = torch.meshgrid(torch.arange(h, device=ref.device, dtype=ref.dtype),
                                torch.arange(w, device=ref.device, dtype=ref.dtype), indexing="ij")
        centres.append(torch.stack((gx.flatten(), gy.flatten()), 0))
        scales.append(torch.full((1, h * w), float(s), device=ref.device, dtype=ref.dtype))
    return torch.cat(centres, 1).unsqueeze(0), torch.cat(scales, 1).unsqueeze(0)


def _box_corners(flat: torch.Tensor, levels: list[torch.Tensor],
                 strides: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, C >= 4, N) flattened maps -> the (B, 2, N) top-left and bottom-right box corners in pixels."""
    grid, stride = level_grid(levels, strides)
    xy = (flat[:, 0:2] + grid) * stride
    half_wh = torch.exp(flat[:, 2:4]) * stride / 2
    return xy - half_wh, xy + half_wh


def decode_boxes(levels: list[torch.Tensor], strides: tuple[int, ...] = STRIDES) -> torch.Tensor:
    """Per-level maps (their first 4 channels: raw box offsets) -> (B, 4, N) xyxy boxes in input pixels.

    A cell's box centre is ``(offset + cell index) * stride`` and its size ``exp(log-size) *
    stride``. The same arithmetic as :func:`decode` (inference, export), for the training loss;
    differentiable.
    """
    flat = torch.cat([lv[:, :4].flatten(2) for lv in levels], 2)  # (B, 4, N)
    return torch.cat(_box_corners(flat, levels, strides), 1)


def decode(levels: list[torch.Tensor], strides: tuple[int, ...] = STRIDES, best_only: bool = True) -> torch.Tensor:
    """Per-level maps -> (B, 4 + nc, N): xyxy boxes in input pixels (as :func:`decode_boxes`), then class scores.

    A box's score is objectness times class probability, for its best class only (zero
    for the others): YOLOX labels each box once, so the shared multi-label postprocessing then
    keeps exactly one class per box. The best class is taken on the class probabilities, first
    index on ties. Portable ops only (arange grids, exp, argmax, where), so the same code runs
    eagerly, under CUDA-graph capture and inside exported graphs; nothing reads values back to
    the host. ``best_only=False``: every class's score (export validation's tie evidence).
    """
    flat = torch.cat([lv.flatten(2) for lv in levels], 2)  # (B, 5 + nc, N)
    top_left, bottom_right = _box_corners(flat, levels, strides)
    obj, cls = flat[:, 4:5], flat[:, 5:]
    if not best_only:
        return torch.cat((top_left, bottom_right, cls * obj), 1)
    best = cls.argmax(1, keepdim=True)
    classes = torch.arange(cls.shape[1], device=flat.device).view(1, -1, 1)
    scores = torch.where(classes == best, cls * obj, torch.zeros_like(cls))
    return torch.cat((top_left, bottom_right, scores), 1)


class YOLOX(nn.Module):
    """The network. ``forward`` returns the per-level maps (P3, P4, P5), as the checkpoints' model does.

    Its input is what reference YOLOX checkpoints were trained on: BGR pixel values in 0..255
    (the family's letterbox produces exactly that).
    """

    def __init__(self, size: str = "s", nc: int = 80) -> None:
        super().__init__()
        if size not in SIZES:
            raise ValueError(f"unknown yolox size {size!r}; choose one of {sorted(SIZES)}")
        cfg = SIZES[size]
        self.size = size
        self.nc = nc
        self.backbone = PAFPN(cfg)
        self.head = YoloxHead(self.backbone.out_channels, nc, cfg.width, cfg.depthwise)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self.head(self.backbone(x))

    def forward_logits(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The training forward: the same per-level maps ``(B, 4 + 1 + nc, H, W)`` as ``forward``
        but with objectness and class *logits* (no sigmoid), which the training loss
        (:class:`libreyolo.train.loss.yolox.YoloxLoss`) reads for numerically stable BCE."""
        return self.head(self.backbone(x), logits=True)
