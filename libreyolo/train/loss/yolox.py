"""YOLOX detection loss: SimOTA assignment, IoU box loss, objectness and class BCE.

The YOLOX head predicts, per cell of each level (strides 8, 16, 32), four raw box offsets, one
objectness logit and ``nc`` class logits (``YOLOX.forward_logits``). Boxes are decoded exactly as
at inference (:func:`libreyolo.models.yolox.network.decode_boxes`: centre ``(offset + cell) *
stride``, size ``exp(log-size) * stride``).

Assignment is SimOTA (Ge et al. 2021, "YOLOX: Exceeding YOLO Series in 2021"), per image:

1. candidates of box ``g``: anchors whose cell centre lies inside ``g``, or within ``radius``
   (2.5) strides of its centre (a square, per axis);
2. cost of matching ``g`` to its candidate ``a``: the class BCE between the anchor's score
   ``sqrt(p_cls * p_obj)`` and the box's one-hot class, plus ``3 * -log IoU`` of the anchor's
   predicted box with ``g``, plus a large penalty (1e5) when ``a`` is not both inside ``g`` and
   within the radius of its centre; anchors that are not candidates of ``g`` are never matched
   to it (the reference lets a box whose k exceeds its own candidates take, at the penalty,
   anchors only another box claims; here it takes fewer instead);
3. dynamic k: ``g`` takes its ``k_g`` cheapest candidates, ``k_g = max(1, floor(sum of the 10
   largest IoUs of g with its candidates' predictions))``, so well-predicted boxes get more
   positives;
4. an anchor taken by several boxes keeps the one it is cheapest for.

Losses (the YOLOX recipe), each normalised by the number of positives (at least 1):

- box: ``1 - IoU^2`` between decoded and assigned boxes on positives (the YOLOX "iou" loss,
  not GIoU), weight 5;
- objectness: BCE on every anchor, target 1 on positives and 0 elsewhere;
- class: BCE on positives, target one-hot times the (detached) IoU of the anchor's prediction
  with its box, so the class score also learns localisation quality;
- optional L1 (``use_l1=True``, YOLOX switches it on for the last epochs): L1 between the raw
  offsets and the assigned box encoded the same way. It adds to the loss but is not one of the
  reported items.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from libreyolo.errors import ArgumentError
from libreyolo.models.yolox.network import STRIDES, decode_boxes, level_grid
from libreyolo.ops.boxes import box_iou
from libreyolo.train.loss.assign import check_targets

__all__ = ["Assignment", "YoloxLoss", "candidate_region", "paired_iou", "simota_assign"]

_NOT_CENTRAL = 1e5  # cost added for anchors not both inside a box and near its centre
_EPS = 1e-8


@dataclass(frozen=True)
class Assignment:
    """The positives of one image: K anchors, each with its ground-truth box."""

    anchors: torch.Tensor  # (K,) long: anchor index into N
    gt: torch.Tensor  # (K,) long: index of the assigned ground-truth box
    iou: torch.Tensor  # (K,) IoU of the anchor's predicted box with that box


def paired_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise IoU of xyxy boxes: (..., 4) x (..., 4) -> (...); 0 for empty boxes; differentiable."""
    wh = (torch.minimum(a[..., 2:], b[..., 2:]) - torch.maximum(a[..., :2], b[..., :2])).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    area_a = (a[..., 2:] - a[..., :2]).clamp(min=0).prod(-1)
    area_b = (b[..., 2:] - b[..., :2]).clamp(min=0).prod(-1)
    return inter / (area_a + area_b - inter + _EPS)


def candidate_region(centres: torch.Tensor, strides: torch.Tensor, gt_boxes: torch.Tensor,
                     radius: float = 2.5) -> tuple[torch.Tensor, torch.Tensor]:
    """Which anchor centres each box claims.

    Args:
        centres: (N, 2) anchor cell centres (x, y) in pixels.
        strides: (N,) each anchor's stride in pixels.
        gt_boxes: (G, 4) xyxy boxes in pixels.
        radius: half-side, in strides, of the square around each box centre.

    Returns:
        (in_box, in_centre), each (G, N) bool: the centre strictly inside the box; the centre
        less than ``radius * stride`` from the box centre along both axes.
    """
    p = centres.unsqueeze(0)  # (1, N, 2)
    margins = torch.cat((p - gt_boxes[:, None, :2], gt_boxes[:, None, 2:] - p), -1)  # (G, N, 4)
    in_box = margins.amin(-1) > 0
    gt_centres = (gt_boxes[:, :2] + gt_boxes[:, 2:]) / 2
    reach = (radius * strides).view(1, -1, 1)
    in_centre = ((p - gt_centres[:, None, :]).abs() < reach).all(-1)
    return in_box, in_centre


@torch.no_grad()
def simota_assign(pred_boxes: torch.Tensor, obj_logits: torch.Tensor, cls_logits: torch.Tensor,
                  centres: torch.Tensor, strides: torch.Tensor, gt_boxes: torch.Tensor, gt_labels: torch.Tensor,
                  *, radius: float = 2.5, iou_weight: float = 3.0, topk: int = 10) -> Assignment:
    """SimOTA for one image (see the module docstring).

    Args:
        pred_boxes: (N, 4) decoded xyxy boxes in pixels.
        obj_logits: (N,) objectness logits.
        cls_logits: (N, C) class logits.
        centres: (N, 2) anchor cell centres in pixels; strides: (N,) their strides.
        gt_boxes: (G, 4) xyxy boxes in pixels, G >= 1; gt_labels: (G,) long class indices.
        radius: centre-prior radius in strides; iou_weight: weight of ``-log IoU`` in the cost;
        topk: how many of a box's largest IoUs are summed into its dynamic k.

    Returns:
        :class:`Assignment` of the positive anchors (at least one per box when the box has a
        candidate; a box keeps fewer than ``k`` when other boxes win its anchors).
    """
    in_box, in_centre = candidate_region(centres, strides, gt_boxes, radius)
    cand = (in_box | in_centre).any(0).nonzero().squeeze(1)  # (Nc,) anchors some box claims
    empty = torch.zeros(0, dtype=torch.long, device=pred_boxes.device)
    if cand.numel() == 0:
        return Assignment(empty, empty, pred_boxes.new_zeros(0))
    own = (in_box | in_centre)[:, cand]  # (G, Nc) each box's own candidates
    central = (in_box & in_centre)[:, cand]
    iou = box_iou(gt_boxes, pred_boxes[cand]) * own  # (G, Nc)

    # class cost: BCE of sqrt(p_cls * p_obj) against the box's one-hot class, summed over classes
    score = (cls_logits[cand].sigmoid() * obj_logits[cand, None].sigmoid()).sqrt().clamp(_EPS, 1 - _EPS)
    neg, pos = -torch.log1p(-score), -torch.log(score)  # (Nc, C) BCE for target 0 and for target 1
    cls_cost = neg.sum(1).unsqueeze(0) + (pos - neg)[:, gt_labels].T  # (G, Nc)
    cost = cls_cost + iou_weight * -torch.log(iou + _EPS) + _NOT_CENTRAL * (~central)
    cost = cost.masked_fill(~own, float("inf"))  # a box never takes an anchor outside its own region

    # dynamic k: the sum of each box's best IoUs, at least one anchor
    k = iou.topk(min(topk, cand.numel()), 1).values.sum(1).int().clamp(min=1)  # (G,)
    cheapest = cost.topk(int(k.max()), 1, largest=False).indices  # (G, kmax)
    take = torch.arange(cheapest.shape[1], device=k.device).unsqueeze(0) < k.unsqueeze(1)
    matched = torch.zeros_like(own).scatter_(1, cheapest, take) & own  # (G, Nc)

    # an anchor several boxes took keeps the box it is cheapest for
    fg = matched.any(0)
    best = cost.masked_fill(~matched, float("inf")).argmin(0)  # (Nc,)
    gt = best[fg]
    return Assignment(cand[fg], gt, iou[gt, fg.nonzero().squeeze(1)])


class YoloxLoss:
    """The YOLOX training loss, called on the per-level logit maps and the batch's boxes.

    Args:
        nc: number of classes of the head.
        use_l1: add the L1 loss on raw box offsets (YOLOX uses it for the last epochs only).
        strides: stride of each level, in the order of the maps.
        box: weight of the IoU loss (YOLOX: 5).
        radius: centre-prior radius of the candidates, in strides (YOLOX: 2.5).
        iou_cost: weight of ``-log IoU`` in the assignment cost (YOLOX: 3).
        topk: IoUs summed into each box's dynamic k (YOLOX: 10).
    """

    def __init__(self, nc: int, use_l1: bool = False, *, strides: tuple[int, ...] = STRIDES, box: float = 5.0,
                 radius: float = 2.5, iou_cost: float = 3.0, topk: int = 10) -> None:
        self.nc = nc
        self.use_l1 = bool(use_l1)
        self.strides = tuple(strides)
        self.box = box
        self.radius = radius
        self.iou_cost = iou_cost
        self.topk = topk

    def __call__(self, raw_outputs: list[torch.Tensor], targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Loss of one batch.

        Args:
            raw_outputs: the level maps ``YOLOX.forward_logits(x)``, each (B, 5 + nc, H, W): raw box
                offsets, objectness logit, class logits.
            targets: (M, 6) rows ``[image index, class, x1, y1, x2, y2]`` in input pixels.

        Returns:
            (loss, items): ``loss`` is ``(5 * iou + obj + cls [+ l1]) * B`` (scaled by the batch
            like the yolo9 loss, so the trainer's accumulation and weight decay treat both alike),
            ``items`` the detached weighted terms [iou_loss, obj_loss, cls_loss]. Computed in
            float32 whatever the autocast state.
        """
        self._check(raw_outputs, targets)
        device = raw_outputs[0].device
        with torch.autocast(device_type=device.type, enabled=False):
            return self._loss([r.float() for r in raw_outputs], targets.to(device=device, dtype=torch.float32))

    def _loss(self, raw: list[torch.Tensor], targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b = raw[0].shape[0]
        flat = torch.cat([r.flatten(2) for r in raw], 2).transpose(1, 2)  # (B, N, 5 + nc)
        reg, obj, cls = flat[..., :4], flat[..., 4], flat[..., 5:]
        boxes = decode_boxes(raw, self.strides).transpose(1, 2)  # (B, N, 4), differentiable
        grid, stride = level_grid(raw, self.strides)
        grid, stride = grid[0].T, stride[0, 0]  # (N, 2) cell indices, (N,) strides
        centres = (grid + 0.5) * stride.unsqueeze(1)

        obj_target = torch.zeros_like(obj)
        pos_img, pos_anchor, pos_box, pos_cls = [], [], [], []
        for i, rows in enumerate(self._per_image(targets, b)):
            if rows.shape[0] == 0:
                continue  # every anchor of the image is negative
            gt_boxes, gt_labels = rows[:, 2:6], rows[:, 1].long()
            a = simota_assign(boxes[i].detach(), obj[i].detach(), cls[i].detach(), centres, stride, gt_boxes,
                              gt_labels, radius=self.radius, iou_weight=self.iou_cost, topk=self.topk)
            obj_target[i, a.anchors] = 1.0
            pos_img.append(torch.full_like(a.anchors, i))
            pos_anchor.append(a.anchors)
            pos_box.append(gt_boxes[a.gt])
            pos_cls.append(F.one_hot(gt_labels[a.gt], self.nc).float() * a.iou.unsqueeze(1))

        n_pos = sum(int(p.numel()) for p in pos_anchor)
        norm = max(n_pos, 1)
        loss_obj = F.binary_cross_entropy_with_logits(obj, obj_target, reduction="sum") / norm
        if n_pos:
            img, anchor = torch.cat(pos_img), torch.cat(pos_anchor)
            target_boxes = torch.cat(pos_box)
            loss_iou = (1 - paired_iou(boxes[img, anchor], target_boxes).square()).sum() / norm
            loss_cls = F.binary_cross_entropy_with_logits(cls[img, anchor], torch.cat(pos_cls), reduction="sum") / norm
            loss_l1 = (F.l1_loss(reg[img, anchor], self._encode(target_boxes, grid[anchor], stride[anchor]),
                                 reduction="sum") / norm) if self.use_l1 else None
        else:
            # no positives: zero box and class terms that stay attached to their logits, so every
            # parameter still gets a (zero) gradient, as distributed data parallel requires
            loss_iou = reg.sum() * 0.0 + 0.0  # + 0.0: never a negative zero in the logs
            loss_cls = cls.sum() * 0.0 + 0.0
            loss_l1 = loss_iou.clone() if self.use_l1 else None

        items = torch.stack((loss_iou * self.box, loss_obj, loss_cls))
        total = items.sum() if loss_l1 is None else items.sum() + loss_l1
        return total * b, items.detach()

    @staticmethod
    def _encode(boxes: torch.Tensor, grid: torch.Tensor, stride: torch.Tensor) -> torch.Tensor:
        """(K, 4) xyxy boxes -> the raw offsets that decode to them: (K, 4) centre offset from the
        cell in strides, log of the size in strides (the inverse of ``decode_boxes``)."""
        s = stride.unsqueeze(1)
        xy = (boxes[:, :2] + boxes[:, 2:]) / 2 / s - grid
        wh = torch.log((boxes[:, 2:] - boxes[:, :2]).clamp(min=0) / s + _EPS)
        return torch.cat((xy, wh), 1)

    def _per_image(self, targets: torch.Tensor, b: int) -> list[torch.Tensor]:
        """(M, 6) rows -> B tensors (M_i, 6), the rows of each image."""
        img = targets[:, 0].long()
        counts = torch.bincount(img, minlength=b)
        if counts.shape[0] > b:
            raise ArgumentError(f"YoloxLoss: targets name image index {counts.shape[0] - 1} in a batch of {b} images; "
                                "column 0 must be the image's index in the batch")
        order = torch.argsort(img, stable=True)
        return list(targets[order].split(counts.tolist()))

    def _check(self, raw_outputs: list[torch.Tensor], targets: torch.Tensor) -> None:
        channels = 5 + self.nc
        if len(raw_outputs) != len(self.strides):
            raise ArgumentError(f"YoloxLoss: got {len(raw_outputs)} level maps for {len(self.strides)} strides "
                                f"{self.strides}; pass YOLOX.forward_logits(x)")
        for r in raw_outputs:
            if r.ndim != 4 or r.shape[1] != channels:
                raise ArgumentError(f"YoloxLoss: a level map has shape {tuple(r.shape)}, expected (B, {channels}, "
                                    f"H, W) for nc={self.nc}; is the loss built with the model's number of classes?")
        check_targets(targets, self.nc, "YoloxLoss")
