"""YOLOv9-E2E: YOLOv9 with a one-to-one head, decoded without NMS.

The backbone, neck and DFL decoding are YOLOv9's (:mod:`libreyolo.models.yolo9.network`). The head
keeps YOLOv9's one-to-many towers (``cv2``/``cv3``, what training's dense assignment reads) and adds
a second set of the same shape, ``one2one_cv2``/``one2one_cv3``, trained with one positive per
object; inference runs only the one-to-one towers, so each object gets at most one box and the
predictions are a top-k, not NMS (:func:`libreyolo.ops.topk.one2one_postprocess`). Key names and
shapes follow the reference checkpoints (``LibreYOLO9E2E<size>.pt``).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from libreyolo.models.yolo9.network import REG_MAX, SIZES, Backbone, DetectHead, Neck, decode_dfl


class OneToOneHead(DetectHead):
    """YOLOv9's decoupled head plus its one-to-one copy. Eval: the one-to-one level maps only;
    training: ``{"one2many": maps, "one2one": maps}``, the one-to-one towers on detached features
    (their gradient does not reach the network, as in the reference's dual assignment)."""

    def __init__(self, in_channels: tuple[int, ...], nc: int, reg_max: int = REG_MAX) -> None:
        super().__init__(in_channels, nc, reg_max)
        # same widths and the same starting weights as the one-to-many towers
        self.one2one_cv2 = copy.deepcopy(self.cv2)
        self.one2one_cv3 = copy.deepcopy(self.cv3)

    def one2one(self, feats: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.cat((box(x), cls(x)), 1)
                for x, box, cls in zip(feats, self.one2one_cv2, self.one2one_cv3, strict=True)]

    def forward(self, feats: list[torch.Tensor]) -> list[torch.Tensor] | dict[str, list[torch.Tensor]]:
        if self.training:
            return {"one2many": super().forward(feats), "one2one": self.one2one([f.detach() for f in feats])}
        return self.one2one(feats)


class YOLOv9E2E(nn.Module):
    """The network. Eval ``forward``: ``{"predictions": (B, 4+nc, N), "raw_outputs": [...]}`` of the
    one-to-one head, laid out as YOLOv9's (so the same export contract and box decoding)."""

    def __init__(self, size: str = "t", nc: int = 80) -> None:
        super().__init__()
        if size not in SIZES:
            raise ValueError(f"unknown yolo9_e2e size {size!r}; choose one of {sorted(SIZES)}")
        cfg = SIZES[size]
        self.size = size
        self.nc = nc
        self.backbone = Backbone(cfg)
        self.neck = Neck(cfg)
        self.head = OneToOneHead(self.neck.out_channels, nc)

    def forward(self, x: torch.Tensor) -> dict:
        raw = self.head(self.neck(self.backbone(x)))
        if isinstance(raw, dict):  # training: both heads' level maps, undecoded
            return raw
        return {"predictions": decode_dfl(raw, self.nc), "raw_outputs": raw}
