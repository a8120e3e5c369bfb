"""RTMDet detection loss: dynamic soft-label assignment, quality focal loss and GIoU.

The RTMDet head predicts, per point of each level (strides 8, 16, 32), ``nc`` class logits and
four distances (left, top, right, bottom) already in input pixels; a point is its cell's top-left
corner ``(column, row) * stride`` and its box ``point -/+ distances``, decoded exactly as at
inference (:func:`libreyolo.models.rtmdet.network.decode_boxes`). The loss reads the network's
own output ``(cls_logits, distances)``, in train mode as in eval mode.

Assignment is mmdetection's DynamicSoftLabelAssigner (Lyu et al. 2022, "RTMDet: An Empirical
Study of Designing Real-Time Object Detectors"), for the whole batch at once over ground-truth
boxes padded per image:

1. candidates: points strictly inside at least one box of their image; the others are negative
   whatever their cost (as in mmdetection, a candidate may then be matched to any box of its
   image, not only one it lies inside);
2. cost of matching box ``g`` to candidate ``p``, three terms:

   - soft centre prior ``10 ** (d - 3)``, ``d`` the distance from ``p`` to the centre of ``g``
     in strides of ``p``'s level (1e-3 at the centre, 1 three strides away, growing tenfold per
     stride);
   - soft-label class cost: the quality focal term below, summed over the classes, of ``p``'s
     logits against the soft label "class of ``g`` at the IoU of ``p``'s prediction with ``g``";
   - IoU cost ``-3 log IoU`` of ``p``'s predicted box with ``g``;
3. dynamic k: ``g`` takes its ``k_g`` cheapest candidates, ``k_g = max(1, floor(sum of the 13
   largest IoUs of g with the candidates' predictions))``;
4. a point taken by several boxes keeps the box it is cheapest for (over all boxes of its image,
   as mmdetection does), so every positive has exactly one box.

Each positive's quality target is the (detached) IoU of its prediction with its box.

Losses (the mmdetection RTMDet recipe), both divided by the sum of the positives' quality targets
(at least 1; per process under distributed training, where mmdetection averages it over ranks):

- class: quality focal loss (Li et al. 2020, "Generalized Focal Loss"), on every point and every
  class: ``BCE(logit, t) * |t - sigmoid(logit)| ** 2`` with ``t`` the quality target at the
  positive's class and 0 elsewhere (so negatives contribute ``BCE(logit, 0) * p ** 2``), weight 1;
- box: ``1 - GIoU`` of decoded and assigned boxes on positives, each weighted by its quality
  target, weight 2.

The returned loss is ``(box + cls) * B`` like the yolo9 and yolox losses (the trainer's gradient
accumulation and weight-decay scaling treat every family alike). The training recipe itself
(AdamW, learning rate, weight decay) is declared in :class:`libreyolo.models.rtmdet.RTMDetFamily`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from libreyolo.errors import ArgumentError
from libreyolo.models.rtmdet.network import STRIDES, decode_boxes, level_points, level_strides
from libreyolo.ops.boxes import bbox_giou, box_iou
from libreyolo.train.loss.assign import check_targets, pad_targets

__all__ = ["RTMDetLoss", "SoftLabelAssignment", "dynamic_soft_label_assign", "quality_focal_loss"]

_INF = 1e8  # cost of a pair that may never match (not a candidate, or a padding box)
_LOG_EPS = 1e-7  # keeps -log IoU finite for IoU 0


@dataclass(frozen=True)
class SoftLabelAssignment:
    """The positives of a batch: per point, whether it is one, its box and its quality target."""

    fg: torch.Tensor  # (B, N) bool: the point is a positive
    gt: torch.Tensor  # (B, N) long: index of its box among its image's (padded) boxes; 0 where negative
    iou: torch.Tensor  # (B, N) IoU of its predicted box with that box; 0 where negative


def quality_focal_loss(logits: torch.Tensor, target: torch.Tensor, beta: float = 2.0) -> torch.Tensor:
    """Elementwise quality focal loss: ``BCE-with-logits(logits, target) * |target - sigmoid(logits)| ** beta``.

    ``target`` holds soft labels in [0, 1] of ``logits``' shape (a positive's IoU at its class, 0
    elsewhere); the factor damps the many easy negatives and positives whose score already matches.
    """
    scale = (target - logits.sigmoid()).abs().pow(beta)
    return F.binary_cross_entropy_with_logits(logits, target, reduction="none") * scale


def inside_boxes(points: torch.Tensor, gt_boxes: torch.Tensor) -> torch.Tensor:
    """(N, 2) points x (B, G, 4) xyxy boxes -> (B, N, G) bool: the point strictly inside the box."""
    p = points.view(1, -1, 1, 2)
    margins = torch.cat((p - gt_boxes[:, None, :, :2], gt_boxes[:, None, :, 2:] - p), -1)  # (B, N, G, 4)
    return margins.amin(-1) > 0


@torch.no_grad()
def dynamic_soft_label_assign(pred_boxes: torch.Tensor, cls_logits: torch.Tensor, points: torch.Tensor,
                              strides: torch.Tensor, gt_boxes: torch.Tensor, gt_labels: torch.Tensor,
                              gt_mask: torch.Tensor, *, topk: int = 13, iou_weight: float = 3.0,
                              center_radius: float = 3.0, beta: float = 2.0) -> SoftLabelAssignment:
    """The dynamic soft-label assignment of a batch (see the module docstring).

    Args:
        pred_boxes: (B, N, 4) decoded xyxy boxes in pixels.
        cls_logits: (B, N, C) class logits.
        points: (N, 2) the points (x, y) in pixels; strides: (N,) their strides.
        gt_boxes: (B, G, 4) xyxy boxes in pixels, padded per image (any value where padded).
        gt_labels: (B, G) long class indices (any valid index where padded).
        gt_mask: (B, G) bool, True for real boxes.
        topk: how many of a box's largest IoUs are summed into its dynamic k.
        iou_weight: weight of ``-log IoU`` in the cost; center_radius: the distance, in strides,
            at which the centre prior costs 1; beta: exponent of the soft-label class cost.

    Returns:
        :class:`SoftLabelAssignment`; a box with at least one candidate in its image gets at
        least one positive unless other boxes win all it takes.
    """
    b, n, _ = pred_boxes.shape
    g = gt_boxes.shape[1]
    device = pred_boxes.device
    if g == 0:
        zeros = torch.zeros((b, n), device=device)
        return SoftLabelAssignment(zeros.bool(), zeros.long(), zeros)
    candidate = (inside_boxes(points, gt_boxes) & gt_mask[:, None, :]).any(-1)  # (B, N)
    allowed = candidate[:, :, None] & gt_mask[:, None, :]  # (B, N, G)
    iou = box_iou(pred_boxes, gt_boxes) * allowed  # (B, N, G)

    centres = (gt_boxes[..., :2] + gt_boxes[..., 2:]) / 2  # (B, G, 2)
    dist = (points.view(1, n, 1, 2) - centres[:, None]).norm(dim=-1) / strides.view(1, n, 1)
    centre_cost = torch.pow(10.0, dist - center_radius)

    # soft-label class cost, summed over classes without a (B, N, G, C) tensor: every class but
    # the box's own has target 0 whichever the box, so its terms are one sum per point
    negatives = quality_focal_loss(cls_logits, torch.zeros_like(cls_logits), beta)  # (B, N, C)
    own_logit = cls_logits.gather(2, gt_labels[:, None, :].expand(b, n, g))  # (B, N, G)
    own = quality_focal_loss(own_logit, iou, beta) - quality_focal_loss(own_logit, torch.zeros_like(iou), beta)
    cls_cost = negatives.sum(-1, keepdim=True) + own

    cost = cls_cost + iou_weight * -torch.log(iou + _LOG_EPS) + centre_cost
    cost = torch.where(allowed, cost, torch.full_like(cost, _INF))

    # dynamic k, then each box's k cheapest points
    k = iou.topk(min(topk, n), dim=1).values.sum(1).int().clamp(min=1)  # (B, G)
    kmax = min(int(k.max()), n)
    cheapest = cost.topk(kmax, dim=1, largest=False).indices  # (B, kmax, G)
    take = torch.arange(kmax, device=device).view(1, kmax, 1) < k[:, None, :]
    matched = torch.zeros_like(allowed).scatter_(1, cheapest, take) & allowed  # (B, N, G)

    # a point several boxes took keeps the one it is cheapest for
    several = matched.sum(-1) > 1
    cheapest_box = F.one_hot(cost.argmin(-1), g).bool()
    matched = torch.where(several[..., None], cheapest_box, matched)
    fg = matched.any(-1)
    gt = matched.long().argmax(-1)
    return SoftLabelAssignment(fg, gt * fg, (iou * matched).sum(-1))


class RTMDetLoss:
    """The RTMDet training loss, called on the network's ``(cls_logits, distances)`` and the batch's boxes.

    Args:
        nc: number of classes of the head.
        strides: stride of each level, in the order of the maps.
        box: weight of the GIoU loss (RTMDet: 2); cls: weight of the quality focal loss (1).
        beta: exponent of the quality focal loss (2), in the loss and in the assignment cost.
        topk: IoUs summed into each box's dynamic k (13).
        iou_cost: weight of ``-log IoU`` in the assignment cost (3).
        center_radius: distance in strides at which the soft centre prior costs 1 (3).
    """

    def __init__(self, nc: int, *, strides: tuple[int, ...] = STRIDES, box: float = 2.0, cls: float = 1.0,
                 beta: float = 2.0, topk: int = 13, iou_cost: float = 3.0, center_radius: float = 3.0) -> None:
        self.nc = nc
        self.strides = tuple(strides)
        self.box = box
        self.cls = cls
        self.beta = beta
        self.topk = topk
        self.iou_cost = iou_cost
        self.center_radius = center_radius

    def __call__(self, outputs: tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]],
                 targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Loss of one batch.

        Args:
            outputs: the network's ``(cls_logits, distances)``, each a tuple over the levels of
                (B, nc, H, W) logits and (B, 4, H, W) distances in input pixels.
            targets: (M, 6) rows ``[image index, class, x1, y1, x2, y2]`` in input pixels.

        Returns:
            (loss, items): ``loss`` is ``(2 * giou + qfl) * B``, ``items`` the detached weighted
            terms [box_loss, cls_loss]. Computed in float32 whatever the autocast state.
        """
        self._check(outputs, targets)
        logits, distances = outputs
        device = logits[0].device
        with torch.autocast(device_type=device.type, enabled=False):
            return self._loss(tuple(x.float() for x in logits), tuple(d.float() for d in distances),
                              targets.to(device=device, dtype=torch.float32))

    def _loss(self, logits: tuple[torch.Tensor, ...], distances: tuple[torch.Tensor, ...],
              targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b = logits[0].shape[0]
        cls = torch.cat([x.flatten(2) for x in logits], 2).transpose(1, 2)  # (B, N, nc)
        boxes = decode_boxes(distances, self.strides).transpose(1, 2)  # (B, N, 4), differentiable
        points = level_points(distances, self.strides).T  # (N, 2)
        strides = level_strides(distances, self.strides)
        labels, gt_boxes, mask = pad_targets(targets, b, "RTMDetLoss")
        labels, mask = labels[..., 0].long(), mask[..., 0]

        a = dynamic_soft_label_assign(boxes.detach(), cls.detach(), points, strides, gt_boxes, labels, mask,
                                      topk=self.topk, iou_weight=self.iou_cost, center_radius=self.center_radius,
                                      beta=self.beta)
        quality = torch.zeros_like(cls)
        if labels.shape[1]:
            own = labels.gather(1, a.gt)  # (B, N) class of each point's box
            quality.scatter_(2, own.unsqueeze(-1), (a.iou * a.fg).unsqueeze(-1))
        norm = a.iou[a.fg].sum().clamp(min=1)

        loss_cls = quality_focal_loss(cls, quality, self.beta).sum() / norm
        if bool(a.fg.any()):
            assigned = gt_boxes.gather(1, a.gt.unsqueeze(-1).expand(b, -1, 4))  # (B, N, 4)
            giou = bbox_giou(boxes[a.fg], assigned[a.fg])
            loss_box = ((1 - giou) * a.iou[a.fg]).sum() / norm
        else:
            # no positives: a zero box term that stays attached to the distances, so every
            # parameter still gets a (zero) gradient, as distributed data parallel requires
            loss_box = boxes.sum() * 0.0 + 0.0  # + 0.0: never a negative zero in the logs

        items = torch.stack((loss_box * self.box, loss_cls * self.cls))
        return items.sum() * b, items.detach()

    def _check(self, outputs: tuple, targets: torch.Tensor) -> None:
        levels = len(self.strides)
        if not (isinstance(outputs, (tuple, list)) and len(outputs) == 2 and len(outputs[0]) == levels
                and len(outputs[1]) == levels):
            raise ArgumentError(f"RTMDetLoss: expected the network's (cls_logits, distances), each {levels} level "
                                f"maps for strides {self.strides}; pass RTMDet(...)(x)")
        for x, d in zip(*outputs, strict=True):
            if x.ndim != 4 or x.shape[1] != self.nc:
                raise ArgumentError(f"RTMDetLoss: a class map has shape {tuple(x.shape)}, expected (B, {self.nc}, "
                                    f"H, W) for nc={self.nc}; is the loss built with the model's number of classes?")
            if d.shape != (x.shape[0], 4, *x.shape[2:]):
                raise ArgumentError(f"RTMDetLoss: a distance map has shape {tuple(d.shape)}, expected "
                                    f"({x.shape[0]}, 4, {x.shape[2]}, {x.shape[3]}) beside its class map")
        check_targets(targets, self.nc, "RTMDetLoss")
