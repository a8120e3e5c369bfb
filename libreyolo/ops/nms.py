"""Exact greedy non-maximum suppression over sorted candidates, batched, with plain torch (no torchvision).

Exactness: the result is the keep set of textbook greedy class-aware NMS: visit the candidates
in the given order; keep one unless an already kept candidate of the same class overlaps it
with IoU > ``iou``; stop once ``max_det`` are kept. Ties are whatever the given order says
(callers sort; :func:`nms` sorts by descending score, ties by lower index first).

Interface (:func:`greedy_nms`): per image, the candidates sorted in visiting order, padded to a
common length ``K``, with ``n_valid`` the length of each image's valid prefix. Output: the
kept positions padded with -1 to ``(B, max_det)``, and the counts. Fixed shapes in and out.

Algorithm (both backends): candidates are visited in blocks. A block's candidates are first
checked against the boxes kept so far (at most ``max_det``), then resolved among themselves
with the block's "suppresses" matrix ``S[i, j]`` (``i < j``, same class, IoU > ``iou``). The
cost follows the number of *visited* candidates, and visiting stops once ``max_det`` boxes are
kept: never an ``K x K`` matrix, whatever the cap.

Backends, chosen in one place (:func:`nms_backend`):

- ``"triton"`` (CUDA, Triton installed, kernels not switched off with ``LIBREYOLO_KERNELS=off``):
  one kernel launch, one program per image, no host synchronisation, so it can be captured in
  a CUDA graph (:mod:`libreyolo.ops.nms_triton`). Inside a block it iterates the greedy
  recurrence ``keep[j] = alive[j] and not any(keep[i] and S[i, j])`` to its fixed point, which
  is unique and equals the greedy answer (the recurrence is triangular).
- ``"torch"`` (everywhere else): the same blocks with torch ops; inside a block the greedy
  scan runs on the host (one step per *kept* box). It reads counts from the device, so it is
  not capturable; on a CPU that costs nothing.

The IoU arithmetic is the same in both (:func:`pairwise_iou`, float32, no fused multiply-add),
so both return the same keep set on the same inputs.
"""
from __future__ import annotations

import os

import numpy as np
import torch

BLOCK = 128  # candidates resolved together by the torch backend (host scan per kept box)


def pairwise_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of xyxy boxes ``(..., N, 4) x (..., M, 4) -> (..., N, M)``; empty unions give 0.

    Element for element the arithmetic of :func:`libreyolo.ops.boxes.box_iou` (and of the
    Triton kernel), with leading batch dimensions; computed per coordinate, which is several
    times faster on a CPU than broadcasting pairs of corners.
    """
    ax1, ay1, ax2, ay2 = (t.unsqueeze(-1) for t in a.unbind(-1))
    bx1, by1, bx2, by2 = (t.unsqueeze(-2) for t in b.unbind(-1))
    area_a = (ax2 - ax1).clamp(min=0) * (ay2 - ay1).clamp(min=0)
    area_b = (bx2 - bx1).clamp(min=0) * (by2 - by1).clamp(min=0)
    inter = (torch.minimum(ax2, bx2) - torch.maximum(ax1, bx1)).clamp_(min=0)
    inter *= (torch.minimum(ay2, by2) - torch.maximum(ay1, by1)).clamp_(min=0)
    union = area_a + area_b - inter
    iou = inter.div_(union.clamp(min=torch.finfo(union.dtype).tiny))
    return iou.masked_fill_(~(union > 0), 0.0)


def nms_backend(device: torch.device) -> str:
    """``"triton"`` where the capturable kernel runs on ``device``, else ``"torch"``."""
    return "triton" if capture_safe_reason(device) is None else "torch"


def capture_safe_reason(device: torch.device) -> str | None:
    """None if NMS on ``device`` runs without host synchronisation (so a CUDA graph can hold it), else why not."""
    if device.type != "cuda":
        return f"NMS on {device.type} runs on the host-driven torch path"
    if os.environ.get("LIBREYOLO_NMS", "").strip().lower() == "torch":
        return "LIBREYOLO_NMS=torch selects the host-driven torch NMS"
    from libreyolo.kernels import selector

    if selector() == "reference":
        return "LIBREYOLO_KERNELS=off selects the portable torch NMS, which synchronises with the host"
    from libreyolo.ops import nms_triton

    return nms_triton.unavailable()


def greedy_nms(boxes: torch.Tensor, classes: torch.Tensor, n_valid: torch.Tensor, iou: float | torch.Tensor,
               max_det: int, *, backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy class-aware NMS over candidates already in visiting order.

    ``boxes`` (B, K, 4) float32 xyxy, ``classes`` (B, K) integer labels, ``n_valid`` (B,) how
    many leading candidates of each image are real (the rest is padding), ``iou`` the threshold
    (a float or a 0-dim/1-element float32 tensor on the device: a CUDA graph reads it at replay).
    Returns ``(keep, counts)``: ``keep`` (B, max_det) int64 positions in visiting order, -1
    after the ``counts[b]`` kept ones; ``counts`` (B,) int64.
    """
    if boxes.ndim != 3 or boxes.shape[-1] != 4 or classes.shape != boxes.shape[:2]:
        raise ValueError(f"greedy_nms expects boxes (B, K, 4) and classes (B, K), got {tuple(boxes.shape)} "
                         f"and {tuple(classes.shape)}")
    backend = backend or nms_backend(boxes.device)
    if backend == "triton":
        from libreyolo.ops import nms_triton

        return nms_triton.greedy_nms(boxes, classes, n_valid, iou, max_det)
    return _greedy_torch(boxes, classes, n_valid, iou, max_det)


def _scan(suppress: np.ndarray, alive: np.ndarray, room: int) -> list[int]:
    """Greedy within one block: first alive candidate is kept, it removes what it suppresses; repeat."""
    alive = alive.copy()
    kept: list[int] = []
    start, n = 0, alive.shape[0]
    while len(kept) < room and start < n:
        j = start + int(alive[start:].argmax())
        if not alive[j]:
            break
        kept.append(j)
        alive[j + 1:] &= ~suppress[j, j + 1:]
        start = j + 1
    return kept


def _greedy_torch(boxes: torch.Tensor, classes: torch.Tensor, n_valid: torch.Tensor, iou: float | torch.Tensor,
                  max_det: int) -> tuple[torch.Tensor, torch.Tensor]:
    batch, k = classes.shape
    device = boxes.device
    boxes = boxes.float()
    keep = torch.full((batch, max_det), -1, dtype=torch.long)
    counts = [0] * batch
    valid = [min(int(v), k) for v in n_valid.reshape(batch).tolist()]
    if isinstance(iou, torch.Tensor):
        iou = iou.reshape(()).to(device)
    kept_boxes = boxes.new_zeros((batch, max_det, 4))
    kept_cls = torch.full((batch, max_det), -1, dtype=classes.dtype, device=device)
    kept_pos: list[list[int]] = [[] for _ in range(batch)]
    for start in range(0, max(valid, default=0), BLOCK):
        active = [b for b in range(batch) if counts[b] < max_det and valid[b] > start]
        if not active:
            break
        blk, cls = boxes[:, start:start + BLOCK], classes[:, start:start + BLOCK]
        width = blk.shape[1]
        slots = torch.arange(start, start + width, device=device)
        alive = slots.unsqueeze(0) < torch.tensor(valid, device=device).unsqueeze(1)
        m = max(counts)
        if m:
            over = (pairwise_iou(kept_boxes[:, :m], blk) > iou) & (kept_cls[:, :m, None] == cls[:, None, :])
            alive &= ~over.any(1)
        same = cls[:, :, None] == cls[:, None, :]
        suppress = torch.triu((pairwise_iou(blk, blk) > iou) & same, diagonal=1)
        suppress_np, alive_np = suppress.cpu().numpy(), alive.cpu().numpy()
        for b in active:
            new = _scan(suppress_np[b], alive_np[b], max_det - counts[b])
            if not new:
                continue
            pos = torch.tensor([start + j for j in new], device=device)
            kept_boxes[b, counts[b]:counts[b] + len(new)] = boxes[b, pos]
            kept_cls[b, counts[b]:counts[b] + len(new)] = classes[b, pos]
            kept_pos[b] += pos.tolist()
            counts[b] += len(new)
    for b in range(batch):
        keep[b, :counts[b]] = torch.tensor(kept_pos[b], dtype=torch.long)
    return keep.to(device), torch.tensor(counts, dtype=torch.long, device=device)


def nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    iou_thres: float,
    classes: torch.Tensor | None = None,
    max_det: int | None = None,
    presorted: bool = False,
) -> torch.Tensor:
    """Indices of kept boxes of one image, in visiting order (descending score).

    ``boxes`` (N, 4) xyxy, ``scores`` (N,), ``classes`` (N,) integer labels or None for
    class-agnostic NMS. Boxes of different classes never suppress each other. With
    ``presorted=True`` the boxes are visited in the given order (the caller sorted them and
    chose how ties are ordered); otherwise by descending score, ties by lower index.
    A convenience over :func:`greedy_nms` (same implementation).
    """
    n = boxes.shape[0]
    if n == 0:
        return torch.empty(0, dtype=torch.long, device=boxes.device)
    limit = n if max_det is None else min(max_det, n)
    order = (torch.arange(n, device=boxes.device) if presorted
             else torch.sort(scores, descending=True, stable=True).indices)
    cls = torch.zeros(n, dtype=torch.long, device=boxes.device) if classes is None else classes.long()
    keep, counts = greedy_nms(boxes.float()[order].unsqueeze(0), cls[order].unsqueeze(0),
                              torch.tensor([n], device=boxes.device), iou_thres, limit)
    return order[keep[0, :int(counts[0])]]
