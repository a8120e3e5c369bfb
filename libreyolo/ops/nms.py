"""Greedy non-maximum suppression written with plain torch ops (no torchvision).

Exactness: the result is the keep set of standard greedy class-aware NMS (visit boxes by
descending score, ties by lower index first; keep a box unless a kept box of the same class
overlaps it with IoU > ``iou_thres``), truncated to ``max_det``.

How: candidates are visited in score order in chunks. Inside a chunk the greedy recurrence
``keep[j] = alive[j] and not any(keep[i] and S[i, j] for i < j)`` (``S`` = "suppresses",
strictly upper triangular) is solved by Jacobi iteration. Because ``keep[j]`` depends only on
earlier boxes, iteration ``t`` fixes at least the first ``t`` entries, so it reaches the
unique fixed point, which is the greedy answer, in at most ``chunk`` steps (a handful in
practice). Work stops as soon as ``max_det`` boxes are kept, so the cost follows the
number of kept boxes, not the number of candidates.
"""
from __future__ import annotations

import torch

from libreyolo.ops.boxes import box_iou

_CHUNK = 1024


def _greedy_in_chunk(suppress: torch.Tensor, alive: torch.Tensor) -> torch.Tensor:
    """Solve the greedy recurrence for one chunk. ``suppress`` is (K, K) bool, strictly upper."""
    s = suppress.to(torch.float32)
    keep = alive.clone()
    for _ in range(suppress.shape[0] + 1):
        hit = (keep.to(torch.float32).unsqueeze(0) @ s).squeeze(0) > 0
        new = alive & ~hit
        if torch.equal(new, keep):
            return keep
        keep = new
    return keep  # unreachable: the recurrence settles within K + 1 steps


def nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    iou_thres: float,
    classes: torch.Tensor | None = None,
    max_det: int | None = None,
    presorted: bool = False,
) -> torch.Tensor:
    """Indices of kept boxes, in visiting order (descending score).

    ``boxes`` (N, 4) xyxy, ``scores`` (N,), ``classes`` (N,) integer labels or None for
    class-agnostic NMS. Boxes of different classes never suppress each other. With
    ``presorted=True`` the boxes are visited in the given order (the caller sorted them and
    chose how ties are ordered); otherwise by descending score, ties by lower index.
    """
    n = boxes.shape[0]
    if n == 0:
        return torch.empty(0, dtype=torch.long, device=boxes.device)
    limit = n if max_det is None else min(max_det, n)
    order = (torch.arange(n, device=boxes.device) if presorted
             else torch.sort(scores, descending=True, stable=True).indices)
    boxes = boxes.float()
    kept: list[torch.Tensor] = []
    kept_boxes = boxes.new_zeros((0, 4))
    kept_cls = None if classes is None else classes.new_zeros((0,))
    n_kept = 0
    for start in range(0, n, _CHUNK):
        idx = order[start:start + _CHUNK]
        b = boxes[idx]
        c = None if classes is None else classes[idx]
        alive = torch.ones(idx.shape[0], dtype=torch.bool, device=boxes.device)
        if n_kept:
            over = box_iou(kept_boxes, b) > iou_thres
            if c is not None:
                over &= kept_cls.unsqueeze(1) == c.unsqueeze(0)
            alive &= ~over.any(0)
        over = box_iou(b, b) > iou_thres
        if c is not None:
            over &= c.unsqueeze(1) == c.unsqueeze(0)
        over = torch.triu(over, diagonal=1)
        keep = _greedy_in_chunk(over, alive)
        sel = idx[keep]
        kept.append(sel)
        kept_boxes = torch.cat((kept_boxes, boxes[sel]))
        if classes is not None:
            kept_cls = torch.cat((kept_cls, classes[sel]))
        n_kept += int(sel.shape[0])
        if n_kept >= limit:
            break
    return torch.cat(kept)[:limit]
