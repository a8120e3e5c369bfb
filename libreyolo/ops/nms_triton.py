"""Greedy NMS as one Triton kernel: no host synchronisation, so a CUDA graph can capture it.

One program per image walks its sorted candidates in blocks of ``BLOCK`` (see
:mod:`libreyolo.ops.nms` for the algorithm and the exactness argument):

1. a block's candidates are tested against the boxes kept so far, ``KEPT`` at a time (their
   positions are read back from the output row, which the program writes as it goes);
2. the block's own "suppresses" matrix is built (earlier row, same class, IoU > threshold), and
   ``keep = alive and not any(keep[i] and S[i, j])`` is iterated until it stops changing: the
   unique fixed point of this triangular recurrence is the greedy answer;
3. kept positions are appended to the output row (a prefix sum gives each its slot), and the
   walk stops at the end of the valid candidates or once ``max_det`` are kept.

The threshold and the valid counts are read from device memory, so a captured graph takes new
values at every replay. IoU arithmetic is that of :func:`libreyolo.ops.nms.pairwise_iou`:
IEEE division (``div_rn``) and no fused multiply-add (``enable_fp_fusion=False``), so the keep
set equals the torch backend's bit for bit. The module imports without Triton or CUDA.
"""
from __future__ import annotations

import contextlib
import os

import torch

try:
    import triton
    import triton.language as tl

    _IMPORT_ERROR = None
except ImportError as exc:  # pragma: no cover - exercised on machines without Triton
    triton = tl = None
    _IMPORT_ERROR = exc

BLOCK = 64  # candidates per step
KEPT = 64   # kept boxes per tile when testing a block against them
NUM_WARPS = 4


def interpreted() -> bool:
    """Triton's CPU interpreter is on (``TRITON_INTERPRET=1``): the kernel then runs on CPU tensors (tests)."""
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def unavailable() -> str | None:
    """None if the kernel can run on CUDA here, else why not."""
    if triton is None:
        return f"Triton is not installed ({_IMPORT_ERROR}); NMS runs on the host-driven torch path"
    if not torch.cuda.is_available() and not interpreted():
        return "CUDA is not available"
    return None


if triton is not None:

    @triton.jit
    def _suppresses(ax1, ay1, ax2, ay2, a_area, bx1, by1, bx2, by2, b_area, thr):
        # IoU(a[:, None], b[None, :]) > thr, as pairwise_iou computes it
        w = tl.maximum(tl.minimum(ax2[:, None], bx2[None, :]) - tl.maximum(ax1[:, None], bx1[None, :]), 0.0)
        h = tl.maximum(tl.minimum(ay2[:, None], by2[None, :]) - tl.maximum(ay1[:, None], by1[None, :]), 0.0)
        inter = w * h
        union = a_area[:, None] + b_area[None, :] - inter
        iou = tl.where(union > 0, tl.math.div_rn(inter, tl.maximum(union, 1.1754943508222875e-38)), 0.0)
        return iou > thr

    @triton.jit
    def _greedy_nms_kernel(boxes_ptr, cls_ptr, nvalid_ptr, thr_ptr, keep_ptr, count_ptr, K, M,
                           BLOCK: tl.constexpr, KEPT: tl.constexpr):
        img = tl.program_id(0).to(tl.int64)
        n = tl.minimum(tl.load(nvalid_ptr + img).to(tl.int32), K)
        thr = tl.load(thr_ptr)
        box_base = boxes_ptr + img * K * 4
        cls_base = cls_ptr + img * K
        keep_base = keep_ptr + img * M
        lanes = tl.arange(0, BLOCK)
        kept_lanes = tl.arange(0, KEPT)
        count = n * 0  # int32 scalars, so the loop-carried types never change
        start = n * 0
        while (start < n) & (count < M):
            pos = start + lanes
            valid = pos < n
            x1 = tl.load(box_base + pos * 4 + 0, mask=valid, other=0.0)
            y1 = tl.load(box_base + pos * 4 + 1, mask=valid, other=0.0)
            x2 = tl.load(box_base + pos * 4 + 2, mask=valid, other=0.0)
            y2 = tl.load(box_base + pos * 4 + 3, mask=valid, other=0.0)
            c = tl.load(cls_base + pos, mask=valid, other=-1)
            area = tl.maximum(x2 - x1, 0.0) * tl.maximum(y2 - y1, 0.0)
            hit = tl.zeros([BLOCK], dtype=tl.int32)
            k0 = n * 0
            while k0 < count:  # boxes kept in earlier blocks, KEPT at a time
                kslot = k0 + kept_lanes
                kmask = kslot < count
                kpos = tl.load(keep_base + kslot, mask=kmask, other=0)
                kx1 = tl.load(box_base + kpos * 4 + 0, mask=kmask, other=0.0)
                ky1 = tl.load(box_base + kpos * 4 + 1, mask=kmask, other=0.0)
                kx2 = tl.load(box_base + kpos * 4 + 2, mask=kmask, other=0.0)
                ky2 = tl.load(box_base + kpos * 4 + 3, mask=kmask, other=0.0)
                kc = tl.load(cls_base + kpos, mask=kmask, other=-2)
                karea = tl.maximum(kx2 - kx1, 0.0) * tl.maximum(ky2 - ky1, 0.0)
                over = _suppresses(kx1, ky1, kx2, ky2, karea, x1, y1, x2, y2, area, thr)
                over = over & (kc[:, None] == c[None, :]) & kmask[:, None]
                hit = tl.maximum(hit, tl.max(over.to(tl.int32), axis=0))
                k0 += KEPT
            alive = (valid & (hit == 0)).to(tl.int32)
            s = _suppresses(x1, y1, x2, y2, area, x1, y1, x2, y2, area, thr)
            s = s & (c[:, None] == c[None, :]) & (lanes[:, None] < lanes[None, :])
            s = s.to(tl.int32)
            keep = alive
            changed = n * 0 + 1
            while changed > 0:
                suppressed = tl.max(s * keep[:, None], axis=0)
                new = alive * (1 - suppressed)
                changed = tl.max(tl.abs(new - keep), axis=0)
                keep = new
            slot = count + tl.cumsum(keep, axis=0) - 1
            tl.store(keep_base + slot, pos.to(keep_ptr.dtype.element_ty), mask=(keep > 0) & (slot < M))
            count = tl.minimum(count + tl.sum(keep, axis=0), M)
            tl.debug_barrier()  # this block's stores are read by the next block's loads
            start += BLOCK
        tl.store(count_ptr + img, count.to(count_ptr.dtype.element_ty))


def greedy_nms(boxes: torch.Tensor, classes: torch.Tensor, n_valid: torch.Tensor, iou: float | torch.Tensor,
               max_det: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The :func:`libreyolo.ops.nms.greedy_nms` contract, on one kernel launch (CUDA, or Triton's interpreter)."""
    why = unavailable()
    if why is not None:
        raise RuntimeError(why)
    batch, k = classes.shape
    device = boxes.device
    boxes = boxes.float().contiguous()
    classes = classes.to(torch.int32).contiguous()
    n_valid = n_valid.reshape(batch).to(device=device, dtype=torch.int32)
    if isinstance(iou, torch.Tensor):
        thr = iou.reshape(1).to(device=device, dtype=torch.float32)
    else:
        thr = torch.full((1,), float(iou), dtype=torch.float32, device=device)
    keep = torch.full((batch, max_det), -1, dtype=torch.int32, device=device)
    counts = torch.zeros(batch, dtype=torch.int32, device=device)
    if batch and k and max_det:
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            _greedy_nms_kernel[(batch,)](boxes, classes, n_valid, thr, keep, counts, k, max_det,
                                         BLOCK=BLOCK, KEPT=KEPT, num_warps=NUM_WARPS, enable_fp_fusion=False)
    return keep.long(), counts.long()

