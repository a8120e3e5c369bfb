"""YOLOv9 (GELAN backbone, PAN neck, decoupled DFL head).

Module names and tensor shapes follow the LibreYOLO checkpoint format (schema 1.0), so a
reference state dict loads key for key. Sizes differ only in the table ``SIZES``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from libreyolo.layers import ConvBNAct


@dataclass(frozen=True)
class Yolo9Size:
    """Channel plan of one size. ``stage1`` and ``down`` name the block kinds it uses."""

    stem: tuple[int, int]          # conv0, conv1 output channels
    stage1: str                    # "elan1" (ELAN1) or "repncspelan" (RepNCSPELAN4)
    stage1_ch: tuple[int, int, int]  # (c_out, c_hidden, c_branch)
    backbone: tuple[tuple[int, int, int], ...]  # elan2..elan4: (c_out, c_hidden, c_branch)
    down: str                      # "aconv" or "adown"
    down_ch: tuple[int, int, int]  # down2..down4 output channels
    spp: tuple[int, int]           # (c_out, c_hidden)
    repeats: int                   # RepNBottlenecks per RepNCSP
    neck_up: tuple[tuple[int, int, int], tuple[int, int, int]]    # elan_up1, elan_up2
    neck_down: tuple[tuple[int, int, int], tuple[int, int, int]]  # elan_down1, elan_down2
    neck_down_ch: tuple[int, int]  # neck down1, down2 output channels


SIZES: dict[str, Yolo9Size] = {
    "t": Yolo9Size((16, 32), "elan1", (32, 32, 16), ((64, 64, 32), (96, 96, 48), (128, 128, 64)),
                   "aconv", (64, 96, 128), (128, 64), 3,
                   ((96, 96, 48), (64, 64, 32)), ((96, 96, 48), (128, 128, 64)), (48, 64)),
    "s": Yolo9Size((32, 64), "elan1", (64, 64, 32), ((128, 128, 64), (192, 192, 96), (256, 256, 128)),
                   "aconv", (128, 192, 256), (256, 128), 3,
                   ((192, 192, 96), (128, 128, 64)), ((192, 192, 96), (256, 256, 128)), (96, 128)),
    "m": Yolo9Size((32, 64), "repncspelan", (128, 128, 64),
                   ((240, 240, 120), (360, 360, 180), (480, 480, 240)),
                   "aconv", (240, 360, 480), (480, 240), 1,
                   ((360, 360, 180), (240, 240, 120)), ((360, 360, 180), (480, 480, 240)), (184, 240)),
    "c": Yolo9Size((64, 128), "repncspelan", (256, 128, 64),
                   ((512, 256, 128), (512, 512, 256), (512, 512, 256)),
                   "adown", (256, 512, 512), (512, 256), 1,
                   ((512, 512, 256), (256, 256, 128)), ((512, 512, 256), (512, 512, 256)), (256, 512)),
}

STRIDES = (8, 16, 32)
REG_MAX = 16


class RepConvN(nn.Module):
    """3x3 and 1x1 convolutions summed, then SiLU (the re-parameterisable conv of YOLOv9)."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv1 = ConvBNAct(c_in, c_out, 3, act=False)
        self.conv2 = ConvBNAct(c_in, c_out, 1, act=False)
        self.act = nn.SiLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv1(x) + self.conv2(x))


class RepNBottleneck(nn.Module):
    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.cv1 = RepConvN(c_in, c_out)
        self.cv2 = ConvBNAct(c_out, c_out, 3)
        self.add = c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class RepNCSP(nn.Module):
    """CSP block: a bottleneck branch and a shortcut branch, concatenated and fused."""

    def __init__(self, c_in: int, c_out: int, repeats: int) -> None:
        super().__init__()
        hidden = c_out // 2
        self.cv1 = ConvBNAct(c_in, hidden, 1)
        self.cv2 = ConvBNAct(c_in, hidden, 1)
        self.cv3 = ConvBNAct(2 * hidden, c_out, 1)
        self.m = nn.Sequential(*(RepNBottleneck(hidden, hidden) for _ in range(repeats)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class RepNCSPELAN4(nn.Module):
    """GELAN block: split, two RepNCSP+conv stages fed in sequence, concatenate all, fuse."""

    def __init__(self, c_in: int, c_out: int, c_hidden: int, c_branch: int, repeats: int) -> None:
        super().__init__()
        self.cv1 = ConvBNAct(c_in, c_hidden, 1)
        self.cv2 = nn.Sequential(RepNCSP(c_hidden // 2, c_branch, repeats), ConvBNAct(c_branch, c_branch, 3))
        self.cv3 = nn.Sequential(RepNCSP(c_branch, c_branch, repeats), ConvBNAct(c_branch, c_branch, 3))
        self.cv4 = ConvBNAct(c_hidden + 2 * c_branch, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = list(self.cv1(x).chunk(2, 1))
        y.append(self.cv2(y[-1]))
        y.append(self.cv3(y[-1]))
        return self.cv4(torch.cat(y, 1))


class ELAN1(nn.Module):
    """The light GELAN block of the small sizes: plain 3x3 convs instead of RepNCSP."""

    def __init__(self, c_in: int, c_out: int, c_hidden: int, c_branch: int) -> None:
        super().__init__()
        self.cv1 = ConvBNAct(c_in, c_hidden, 1)
        self.cv2 = ConvBNAct(c_hidden // 2, c_branch, 3)
        self.cv3 = ConvBNAct(c_branch, c_branch, 3)
        self.cv4 = ConvBNAct(c_hidden + 2 * c_branch, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = list(self.cv1(x).chunk(2, 1))
        y.append(self.cv2(y[-1]))
        y.append(self.cv3(y[-1]))
        return self.cv4(torch.cat(y, 1))


class AConv(nn.Module):
    """Downsample: 2x2 average (stride 1) then a strided 3x3 conv."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.cv = ConvBNAct(c_in, c_out, 3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv(F.avg_pool2d(x, 2, 1, 0, False, True))


class ADown(nn.Module):
    """Downsample in two halves: strided 3x3 conv, and 3x3 max-pool followed by a 1x1 conv."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        half = c_out // 2
        self.cv1 = ConvBNAct(c_in // 2, half, 3, 2)
        self.cv2 = ConvBNAct(c_in // 2, half, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1, x2 = F.avg_pool2d(x, 2, 1, 0, False, True).chunk(2, 1)
        return torch.cat((self.cv1(x1), self.cv2(F.max_pool2d(x2, 3, 2, 1))), 1)


class SPPELAN(nn.Module):
    """Spatial pyramid pooling: three chained 5x5 max-pools, all concatenated and fused."""

    def __init__(self, c_in: int, c_out: int, c_hidden: int) -> None:
        super().__init__()
        self.cv1 = ConvBNAct(c_in, c_hidden, 1)
        self.cv5 = ConvBNAct(4 * c_hidden, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = [self.cv1(x)]
        for _ in range(3):
            y.append(F.max_pool2d(y[-1], 5, 1, 2))
        return self.cv5(torch.cat(y, 1))


def _elan(c_in: int, spec: tuple[int, int, int], repeats: int) -> RepNCSPELAN4:
    c_out, c_hidden, c_branch = spec
    return RepNCSPELAN4(c_in, c_out, c_hidden, c_branch, repeats)


def _down(kind: str, c_in: int, c_out: int) -> nn.Module:
    return AConv(c_in, c_out) if kind == "aconv" else ADown(c_in, c_out)


class Backbone(nn.Module):
    def __init__(self, cfg: Yolo9Size, in_ch: int = 3) -> None:
        super().__init__()
        c0, c1 = cfg.stem
        self.conv0 = ConvBNAct(in_ch, c0, 3, 2)
        self.conv1 = ConvBNAct(c0, c1, 3, 2)
        out, hidden, branch = cfg.stage1_ch
        if cfg.stage1 == "elan1":
            self.elan1: nn.Module = ELAN1(c1, out, hidden, branch)
        else:
            self.elan1 = RepNCSPELAN4(c1, out, hidden, branch, cfg.repeats)
        c = out
        for i, (d_ch, spec) in enumerate(zip(cfg.down_ch, cfg.backbone, strict=True), start=2):
            setattr(self, f"down{i}", _down(cfg.down, c, d_ch))
            setattr(self, f"elan{i}", _elan(d_ch, spec, cfg.repeats))
            c = spec[0]
        self.spp = SPPELAN(c, cfg.spp[0], cfg.spp[1])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.elan1(self.conv1(self.conv0(x)))
        p3 = self.elan2(self.down2(x))
        p4 = self.elan3(self.down3(p3))
        p5 = self.spp(self.elan4(self.down4(p4)))
        return p3, p4, p5


class Neck(nn.Module):
    """PAN: top-down with nearest upsampling, then bottom-up with the down blocks."""

    def __init__(self, cfg: Yolo9Size) -> None:
        super().__init__()
        c3, c4, c5 = cfg.backbone[0][0], cfg.backbone[1][0], cfg.spp[0]
        up1, up2 = cfg.neck_up
        dn1, dn2 = cfg.neck_down
        self.elan_up1 = _elan(c5 + c4, up1, cfg.repeats)
        self.elan_up2 = _elan(up1[0] + c3, up2, cfg.repeats)
        self.down1 = _down(cfg.down, up2[0], cfg.neck_down_ch[0])
        self.elan_down1 = _elan(cfg.neck_down_ch[0] + up1[0], dn1, cfg.repeats)
        self.down2 = _down(cfg.down, dn1[0], cfg.neck_down_ch[1])
        self.elan_down2 = _elan(cfg.neck_down_ch[1] + c5, dn2, cfg.repeats)
        self.out_channels = (up2[0], dn1[0], dn2[0])

    def forward(self, feats: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> list[torch.Tensor]:
        p3, p4, p5 = feats
        n4 = self.elan_up1(torch.cat((F.interpolate(p5, scale_factor=2.0, mode="nearest"), p4), 1))
        n3 = self.elan_up2(torch.cat((F.interpolate(n4, scale_factor=2.0, mode="nearest"), p3), 1))
        o4 = self.elan_down1(torch.cat((self.down1(n3), n4), 1))
        o5 = self.elan_down2(torch.cat((self.down2(o4), p5), 1))
        return [n3, o4, o5]


class DetectHead(nn.Module):
    """Decoupled head: per level, DFL box logits (4 x reg_max) and class logits."""

    def __init__(self, in_channels: tuple[int, ...], nc: int, reg_max: int = REG_MAX) -> None:
        super().__init__()
        self.nc = nc
        self.reg_max = reg_max
        c_box = max(in_channels[0] // 4, reg_max * 4, 16)
        c_box = -(-c_box // 4) * 4
        c_cls = max(in_channels[0], min(nc, 100))
        self.cv2 = nn.ModuleList(
            nn.Sequential(ConvBNAct(c, c_box, 3), ConvBNAct(c_box, c_box, 3, groups=4),
                          nn.Conv2d(c_box, 4 * reg_max, 1, groups=4))
            for c in in_channels
        )
        self.cv3 = nn.ModuleList(
            nn.Sequential(ConvBNAct(c, c_cls, 3), ConvBNAct(c_cls, c_cls, 3), nn.Conv2d(c_cls, nc, 1))
            for c in in_channels
        )
        self.init_biases()

    @torch.no_grad()
    def init_biases(self, strides: tuple[int, ...] = STRIDES, imgsz: int = 640) -> None:
        """The usual detector prior for an untrained head: box logits 1, class probabilities about
        5 objects per image spread over the classes and cells, so a fresh model predicts few
        boxes (as one about to be trained should) instead of every anchor at 0.5."""
        for box, cls, s in zip(self.cv2, self.cv3, strides, strict=True):
            box[-1].bias.fill_(1.0)
            cls[-1].bias.fill_(math.log(5 / self.nc / (imgsz / s) ** 2))

    def forward(self, feats: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.cat((box(x), cls(x)), 1) for x, box, cls in zip(feats, self.cv2, self.cv3, strict=True)]


def decode_dfl(raw: list[torch.Tensor], nc: int, strides: tuple[int, ...] = STRIDES,
               reg_max: int = REG_MAX) -> torch.Tensor:
    """Raw level maps -> (B, 4 + nc, N): xyxy boxes in input pixels, then class probabilities.

    Written with portable ops only (softmax, matmul-free weighted sum, arange grids), so the
    same code runs eagerly, under CUDA-graph capture and inside exported graphs.
    """
    b = raw[0].shape[0]
    flat = torch.cat([r.flatten(2) for r in raw], 2)  # (B, 4*reg_max + nc, N)
    box, cls = flat.split((4 * reg_max, nc), 1)
    bins = torch.arange(reg_max, device=box.device, dtype=box.dtype)
    dist = (box.view(b, 4, reg_max, -1).softmax(2) * bins.view(1, 1, reg_max, 1)).sum(2)  # (B, 4, N)
    points, scales = [], []
    for r, s in zip(raw, strides, strict=True):
        h, w = r.shape[2], r.shape[3]
        ys = torch.arange(h, device=box.device, dtype=box.dtype) + 0.5
        xs = torch.arange(w, device=box.device, dtype=box.dtype) + 0.5
        gy, gx = torch.meshgrid(ys, xs, indexing="ij")
        points.append(torch.stack((gx.flatten(), gy.flatten()), 0))
        scales.append(torch.full((1, h * w), float(s), device=box.device, dtype=box.dtype))
    anchor = torch.cat(points, 1).unsqueeze(0)  # (1, 2, N) in grid units
    stride = torch.cat(scales, 1).unsqueeze(0)  # (1, 1, N)
    lt, rb = dist.split(2, 1)
    xyxy = torch.cat((anchor - lt, anchor + rb), 1) * stride
    return torch.cat((xyxy, cls.sigmoid()), 1)


class YOLOv9(nn.Module):
    """The network. ``forward`` returns ``{"predictions": (B, 4+nc, N), "raw_outputs": [...]}``."""

    def __init__(self, size: str = "t", nc: int = 80) -> None:
        super().__init__()
        if size not in SIZES:
            raise ValueError(f"unknown yolo9 size {size!r}; choose one of {sorted(SIZES)}")
        cfg = SIZES[size]
        self.size = size
        self.nc = nc
        self.backbone = Backbone(cfg)
        self.neck = Neck(cfg)
        self.head = DetectHead(self.neck.out_channels, nc)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor | list[torch.Tensor]]:
        raw = self.head(self.neck(self.backbone(x)))
        return {"predictions": decode_dfl(raw, self.nc), "raw_outputs": raw}
