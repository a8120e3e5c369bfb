"""Task-aligned label assignment (TOOD, Feng et al. 2021), as used by YOLOv8/YOLOv9-style detectors.

Which anchors learn which ground-truth box is decided from the model's own predictions: an anchor
is a good match for a box when it both classifies it well and localises it well. The alignment
metric ``t = s^alpha * IoU^beta`` (s: the predicted probability of the box's class, IoU: between
the predicted and the ground-truth box) ranks the candidate anchors (those whose centre lies inside
the box); the ``topk`` best become positives. An anchor claimed by several boxes keeps the one it
overlaps most. The soft class target of a positive anchor is ``t`` rescaled per box so that the
box's best anchor gets the box's best IoU, which keeps targets for poorly predicted boxes low.

Everything is dense over (batch, gt, anchor) tensors: no Python loop over images or boxes, so the
cost does not depend on how many boxes an image has beyond the padded width ``M``.
"""
from __future__ import annotations

import torch
from torch import nn

from libreyolo.errors import ArgumentError
from libreyolo.ops.boxes import box_iou

__all__ = ["TaskAlignedAssigner", "check_targets", "pad_targets"]


def check_targets(targets: torch.Tensor, nc: int, owner: str = "the loss") -> None:
    """Detection targets are (M, 6) rows ``[image, class, x1, y1, x2, y2]`` whose classes lie in
    ``0..nc-1``; else an error naming ``owner``, the value and what to check."""
    if targets.ndim != 2 or targets.shape[1] != 6:
        raise ArgumentError(f"{owner}: targets have shape {tuple(targets.shape)}, expected (M, 6) rows "
                            "[image index, class, x1, y1, x2, y2] in input pixels")
    if targets.shape[0]:
        lo, hi = torch.stack(torch.aminmax(targets[:, 1])).tolist()  # one device read
        if lo < 0 or hi >= nc:
            raise ArgumentError(f"{owner}: target classes span {lo:g}..{hi:g}, outside 0..{nc - 1} of a "
                                f"{nc}-class head; check the dataset's labels against the model's nc")


def pad_targets(targets: torch.Tensor, b: int, owner: str = "the loss",
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(M, 6) rows ``[image, class, x1, y1, x2, y2]`` -> per image, padded to the most boxes any
    image has: labels (B, Mmax, 1), boxes (B, Mmax, 4), mask (B, Mmax, 1) bool. Vectorised: each
    row's slot is its rank within its image. ``owner`` names the caller in the error message."""
    device = targets.device
    img = targets[:, 0].long()
    counts = torch.bincount(img, minlength=b)
    if counts.shape[0] > b:
        raise ArgumentError(f"{owner}: targets name image index {counts.shape[0] - 1} in a batch of {b} "
                            "images; column 0 must be the image's index in the batch")
    m = int(counts.max()) if targets.shape[0] else 0
    labels = torch.zeros((b, m, 1), device=device, dtype=targets.dtype)
    boxes = torch.zeros((b, m, 4), device=device, dtype=targets.dtype)
    if m:
        order = torch.argsort(img, stable=True)
        img = img[order]
        first = torch.cumsum(counts, 0) - counts
        slot = torch.arange(img.shape[0], device=device) - first[img]
        labels[img, slot, 0] = targets[order, 1]
        boxes[img, slot] = targets[order, 2:6]
    mask = (torch.arange(m, device=device).view(1, m) < counts.view(b, 1)).unsqueeze(-1)
    return labels, boxes, mask


class TaskAlignedAssigner(nn.Module):
    """Assign ground-truth boxes to anchors by the task-alignment metric.

    Args:
        topk: positives kept per ground-truth box (at most; fewer when fewer anchors lie inside it).
        num_classes: number of classes ``C``; background anchors get the label ``num_classes``.
        alpha: exponent of the class score in the alignment metric.
        beta: exponent of the IoU in the alignment metric.
        eps: keeps divisions finite and defines "strictly inside" for anchor centres.
    """

    def __init__(self, topk: int = 10, num_classes: int = 80, alpha: float = 0.5, beta: float = 6.0,
                 eps: float = 1e-9) -> None:
        super().__init__()
        self.topk = topk
        self.num_classes = num_classes
        self.alpha = alpha
        self.beta = beta
        self.eps = eps

    @torch.no_grad()
    def forward(self, pred_scores: torch.Tensor, pred_bboxes: torch.Tensor, anchor_points: torch.Tensor,
                gt_labels: torch.Tensor, gt_bboxes: torch.Tensor, mask_gt: torch.Tensor,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Assign targets.

        Args:
            pred_scores: (B, N, C) predicted class probabilities (after sigmoid).
            pred_bboxes: (B, N, 4) predicted xyxy boxes in pixels.
            anchor_points: (N, 2) anchor centres (x, y) in pixels.
            gt_labels: (B, M, 1) class index of each ground-truth box (any value where padded).
            gt_bboxes: (B, M, 4) xyxy ground-truth boxes in pixels (any value where padded).
            mask_gt: (B, M, 1) 1/True for real boxes, 0/False for padding.

        Returns:
            target_labels: (B, N) long, the class of the assigned box; ``num_classes`` for background.
            target_bboxes: (B, N, 4) the assigned box (xyxy pixels); zeros for background.
            target_scores: (B, N, C) soft one-hot class targets; zeros for background.
            fg_mask: (B, N) bool, anchors that got a box.
            target_gt_idx: (B, N) long, index into M of the assigned box; 0 for background.
        """
        b, n, c = pred_scores.shape
        m = gt_bboxes.shape[1]
        device, dtype = pred_scores.device, pred_scores.dtype
        if m == 0:
            return (torch.full((b, n), self.num_classes, dtype=torch.long, device=device),
                    torch.zeros((b, n, 4), dtype=gt_bboxes.dtype, device=device),
                    torch.zeros((b, n, c), dtype=dtype, device=device),
                    torch.zeros((b, n), dtype=torch.bool, device=device),
                    torch.zeros((b, n), dtype=torch.long, device=device))

        labels = gt_labels.view(b, m).long().clamp(0, c - 1)  # padded rows may hold anything
        candidates = self._centres_inside(anchor_points, gt_bboxes) & mask_gt.view(b, m, 1).bool()  # (B, M, N)

        iou = box_iou(gt_bboxes.to(pred_bboxes.dtype), pred_bboxes).clamp(0, 1)  # (B, M, N)
        iou = iou.masked_fill(~candidates, 0)
        # probability each anchor gives to each box's class: (B, N, C) -> (B, M, N)
        score = pred_scores.gather(2, labels.unsqueeze(1).expand(b, n, m)).transpose(1, 2)
        align = score.clamp(min=0).pow(self.alpha) * iou.pow(self.beta) * candidates

        k = min(self.topk, n)
        top_idx = align.topk(k, dim=-1).indices  # (B, M, k)
        in_topk = torch.zeros_like(candidates).scatter_(-1, top_idx, True)
        assigned = in_topk & candidates  # (B, M, N)

        # an anchor claimed by several boxes keeps the one it overlaps most
        best_gt = iou.masked_fill(~assigned, -1.0).argmax(1)  # (B, N)
        fg_mask = assigned.any(1)
        assigned = assigned & (torch.arange(m, device=device).view(1, m, 1) == best_gt.unsqueeze(1))
        target_gt_idx = torch.where(fg_mask, best_gt, torch.zeros_like(best_gt))

        target_labels = labels.gather(1, target_gt_idx)
        target_labels = torch.where(fg_mask, target_labels, torch.full_like(target_labels, self.num_classes))
        target_bboxes = gt_bboxes.gather(1, target_gt_idx.unsqueeze(-1).expand(b, n, 4))
        target_bboxes = target_bboxes * fg_mask.unsqueeze(-1)

        # soft targets: alignment rescaled per box so that its best anchor scores the box's best IoU
        align = align * assigned
        max_align = align.amax(-1, keepdim=True)  # (B, M, 1)
        max_iou = (iou * assigned).amax(-1, keepdim=True)
        norm = (align * max_iou / (max_align + self.eps)).amax(1)  # (B, N); one box per anchor left
        one_hot = torch.nn.functional.one_hot(target_labels.clamp(max=c - 1), c).to(dtype)
        target_scores = one_hot * (norm * fg_mask).unsqueeze(-1).to(dtype)
        return target_labels, target_bboxes, target_scores, fg_mask, target_gt_idx

    def _centres_inside(self, anchor_points: torch.Tensor, gt_bboxes: torch.Tensor) -> torch.Tensor:
        """(B, M, N) bool: anchor centre strictly inside the box (by more than ``eps`` on every side)."""
        p = anchor_points.to(gt_bboxes.dtype).view(1, 1, -1, 2)
        x1y1, x2y2 = gt_bboxes.unsqueeze(2).split(2, -1)  # (B, M, 1, 2) each
        margin = torch.cat((p - x1y1, x2y2 - p), -1)  # (B, M, N, 4)
        return margin.amin(-1) > self.eps
