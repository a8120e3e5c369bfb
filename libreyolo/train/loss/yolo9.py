"""YOLOv9 detection loss: task-aligned assignment, BCE class loss, CIoU box loss and DFL.

The head predicts, per anchor, class logits and for each side of the box (left, top, right,
bottom) a distribution over ``reg_max`` integer distances in stride units; the box is the
distribution's expectation around the cell centre (``decode_dfl`` in
``libreyolo/models/yolo9/network.py``, which this loss calls so that training and inference
decode boxes the same way). Three terms, each normalised by the sum of the soft class targets:

- class: binary cross-entropy against the assigner's soft targets, over all anchors;
- box: ``1 - CIoU`` between decoded and assigned boxes, on positive anchors;
- DFL (distribution focal loss, Li et al. 2020): cross-entropy pulling the distribution towards
  the two integer bins around the true distance, weighted by closeness, on positive anchors.

Box and DFL terms are weighted per anchor by its soft target, so well-aligned anchors count more.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from libreyolo.errors import ArgumentError
from libreyolo.models.yolo9.network import REG_MAX, STRIDES, decode_dfl
from libreyolo.ops.boxes import bbox_ciou
from libreyolo.train.loss.assign import TaskAlignedAssigner, check_targets, pad_targets

__all__ = ["DetectionLoss", "bbox_ciou", "bbox_to_ltrb", "distribution_focal_loss", "make_anchors"]


def make_anchors(shapes: list[tuple[int, int]], strides: tuple[int, ...], device: torch.device | None = None,
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Anchor centres of every level, in the order ``decode_dfl`` flattens them.

    Returns (points (N, 2) as (x, y) in pixels at cell centres, strides (N, 1)).
    """
    points, scales = [], []
    for (h, w), s in zip(shapes, strides, strict=True):
        ys = (torch.arange(h, device=device, dtype=dtype) + 0.5) * s
        xs = (torch.arange(w, device=device, dtype=dtype) + 0.5) * s
        gy, gx = torch.meshgrid(ys, xs, indexing="ij")
        points.append(torch.stack((gx.flatten(), gy.flatten()), -1))
        scales.append(torch.full((h * w, 1), float(s), device=device, dtype=dtype))
    return torch.cat(points), torch.cat(scales)


def bbox_to_ltrb(anchor_points: torch.Tensor, bboxes: torch.Tensor, strides: torch.Tensor,
                 reg_max: int = REG_MAX) -> torch.Tensor:
    """DFL regression targets: distances (left, top, right, bottom) from each anchor centre to
    the sides of its xyxy box, in stride units, clamped to ``[0, reg_max - 1 - 0.01]`` so the
    upper neighbouring bin still exists. Shapes broadcast: (..., 2), (..., 4), (..., 1) -> (..., 4)."""
    x1y1, x2y2 = bboxes.split(2, -1)
    ltrb = torch.cat((anchor_points - x1y1, x2y2 - anchor_points), -1) / strides
    return ltrb.clamp(0, reg_max - 1 - 0.01)


def distribution_focal_loss(pred_logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """DFL of (K, 4, reg_max) logits against (K, 4) real-valued distances in bins; returns (K,).

    The target distance ``d`` lies between bins ``floor(d)`` and ``floor(d) + 1``; the loss is the
    cross-entropy to each, weighted by how close ``d`` is to it, averaged over the four sides. Its
    minimum is reached when the two bins hold probability in that ratio, whose expectation is ``d``.
    """
    k, sides, reg_max = pred_logits.shape
    left = target.long()
    right = left + 1
    w_left = right.to(target.dtype) - target
    w_right = 1 - w_left
    logits = pred_logits.reshape(-1, reg_max)
    ce_left = F.cross_entropy(logits, left.view(-1), reduction="none").view(k, sides)
    ce_right = F.cross_entropy(logits, right.view(-1), reduction="none").view(k, sides)
    return (ce_left * w_left + ce_right * w_right).mean(-1)


class DetectionLoss:
    """The YOLOv9 training loss, called on the head's raw level maps and the batch's boxes.

    Args:
        nc: number of classes of the head.
        reg_max: bins of the box distributions (the head's ``4 * reg_max`` box channels).
        strides: stride of each level, in the order of ``raw_outputs``.
        box, cls, dfl: gains of the three terms (Ultralytics defaults).
        tal_topk: positives per ground-truth box in the assignment.
    """

    def __init__(self, nc: int, *, reg_max: int = REG_MAX, strides: tuple[int, ...] = STRIDES, box: float = 7.5,
                 cls: float = 0.5, dfl: float = 1.5, tal_topk: int = 10) -> None:
        self.nc = nc
        self.reg_max = reg_max
        self.strides = tuple(strides)
        self.gains = (box, cls, dfl)
        self.assigner = TaskAlignedAssigner(topk=tal_topk, num_classes=nc, alpha=0.5, beta=6.0)

    def __call__(self, raw_outputs: list[torch.Tensor], targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Loss of one batch.

        Args:
            raw_outputs: the level maps ``model.net(x)["raw_outputs"]``, each (B, 4*reg_max + nc, H, W).
            targets: (M, 6) rows ``[image index, class, x1, y1, x2, y2]`` in input pixels.

        Returns:
            (loss, items): ``loss`` is ``(box + cls + dfl) * B`` with each term already multiplied by
            its gain (the Ultralytics convention: gradients scale with the batch, so the learning
            rate does not depend on it), ``items`` the detached gain-weighted terms [box, cls, dfl].
            Computed in float32 whatever the autocast state.
        """
        self._check(raw_outputs, targets)
        device = raw_outputs[0].device
        with torch.autocast(device_type=device.type, enabled=False):
            return self._loss([r.float() for r in raw_outputs], targets.to(device=device, dtype=torch.float32))

    def _loss(self, raw: list[torch.Tensor], targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b = raw[0].shape[0]
        nc, reg_max = self.nc, self.reg_max
        flat = torch.cat([r.flatten(2) for r in raw], 2)  # (B, 4*reg_max + nc, N)
        box_logits, cls_logits = flat.split((4 * reg_max, nc), 1)
        n = flat.shape[2]
        box_logits = box_logits.view(b, 4, reg_max, n).permute(0, 3, 1, 2)  # (B, N, 4, reg_max)
        cls_logits = cls_logits.transpose(1, 2)  # (B, N, nc)
        decoded = decode_dfl(raw, nc, self.strides, reg_max).transpose(1, 2)  # (B, N, 4 + nc)
        pred_bboxes = decoded[..., :4]  # xyxy pixels, differentiable through the box logits
        anchors, strides = self._anchors([tuple(r.shape[2:]) for r in raw], flat.device)

        gt_labels, gt_bboxes, mask_gt = self._pad_targets(targets, b)
        _, target_bboxes, target_scores, fg, _ = self.assigner(
            decoded[..., 4:].detach(), pred_bboxes.detach(), anchors, gt_labels, gt_bboxes, mask_gt)
        norm = target_scores.sum().clamp(min=1)

        loss_cls = F.binary_cross_entropy_with_logits(cls_logits, target_scores, reduction="none").sum() / norm
        if bool(fg.any()):
            weight = target_scores.sum(-1)[fg]  # (K,)
            loss_box = ((1 - bbox_ciou(pred_bboxes[fg], target_bboxes[fg])) * weight).sum() / norm
            ltrb = bbox_to_ltrb(anchors.expand(b, n, 2)[fg], target_bboxes[fg], strides.expand(b, n, 1)[fg], reg_max)
            loss_dfl = (distribution_focal_loss(box_logits[fg], ltrb) * weight).sum() / norm
        else:
            # no positives: the box terms are zero but stay attached to the box logits, so every
            # parameter still gets a (zero) gradient, as distributed data parallel requires
            loss_box = box_logits.sum() * 0.0
            loss_dfl = loss_box.clone()

        items = torch.stack((loss_box * self.gains[0], loss_cls * self.gains[1], loss_dfl * self.gains[2]))
        return items.sum() * b, items.detach()

    def _anchors(self, shapes: list[tuple[int, int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`make_anchors` for these level shapes, built once per shape and device."""
        cache = self.__dict__.setdefault("_anchor_cache", {})
        key = (tuple(shapes), str(device))
        if key not in cache:
            cache[key] = make_anchors(list(shapes), self.strides, device=device)
        return cache[key]

    def _pad_targets(self, targets: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(M, 6) rows -> labels (B, Mmax, 1), boxes (B, Mmax, 4), mask (B, Mmax, 1): :func:`pad_targets`."""
        return pad_targets(targets, b, "DetectionLoss")

    def _check(self, raw_outputs: list[torch.Tensor], targets: torch.Tensor) -> None:
        channels = 4 * self.reg_max + self.nc
        if len(raw_outputs) != len(self.strides):
            raise ArgumentError(f"DetectionLoss: got {len(raw_outputs)} level maps for {len(self.strides)} strides "
                                f"{self.strides}; pass model.net(x)['raw_outputs']")
        for r in raw_outputs:
            if r.ndim != 4 or r.shape[1] != channels:
                raise ArgumentError(f"DetectionLoss: a level map has shape {tuple(r.shape)}, expected (B, {channels}, "
                                    f"H, W) for nc={self.nc}, reg_max={self.reg_max}; is the loss built with the "
                                    "model's number of classes?")
        check_targets(targets, self.nc, "DetectionLoss")
