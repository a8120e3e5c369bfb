"""Greedy NMS as Triton kernels: no host synchronisation, so a CUDA graph can capture it.

Two launches per call:

0. **Suppression mask** (``_suppression_mask_kernel``, one program per image and 64x64 tile,
   all in parallel): for the first ``KM`` candidates of each image (:func:`mask_rows`: all of them
   up to ``MASK_CAP``, fewer for large batches, none above ``MASK_MAX_BATCH`` images), bit
   ``j`` of word ``w`` of row ``i`` says that candidate ``64 w + j`` comes after ``i``, has its
   class and overlaps it with IoU above the threshold. Only the words at or right of the
   diagonal are written and read.

Then one program per image walks its sorted candidates in blocks of ``BLOCK`` (see
:mod:`libreyolo.ops.nms` for the algorithm and the exactness argument):

1. a block's candidates are tested against the boxes kept so far. Inside the mask, that is
   one word of the image's *removed* row (the OR of the mask rows of every kept box, kept up to
   date after each block); past it, the kept boxes are tested ``KEPT`` at a time (their
   positions are read back from the output row, which the program writes as it goes);
2. the block's own "suppresses" matrix (earlier row, same class, IoU > threshold: the mask's
   diagonal word, or computed), and ``keep = alive and not any(keep[i] and S[i, j])`` iterated
   until it stops changing: the unique fixed point of this triangular recurrence is the greedy
   answer;
3. kept positions are appended to the output row (a prefix sum gives each its slot), their
   mask rows are OR-ed into the removed row, and the walk stops at the end of the valid
   candidates or once ``max_det`` are kept.

The mask moves the work that grows with the number of kept boxes (each block against every
kept box, one tile after another) into the parallel stage; the walk then reads words. Both
paths give the same keep set (tests run both, and a cap between them, in the interpreter).

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
WORDS = 32  # mask words per tile when a block's kept rows are OR-ed into the removed row
MASK_CAP = 8192  # candidates per image with a precomputed suppression mask (see mask_rows)
MASK_BYTES = 1 << 26  # the masks of one call stay under 64 MiB
# The mask pays when few images share the walk: H200, dense YOLOv9-t at 640 (300 kept of ~6,000
# walked per image), detect_padded b1 2.06 ms with the mask against 4.95 without; at b32 7.19
# against 6.04 (32 walks already run side by side, and the masks cost 32 times one image's)
# (bench/results/2026-12-01-serving-profile-h200-mask.json). The crossover estimated from those
# two points (mask ~0.3 ms per image, walk ~4.5 ms without it, ~0.6 ms with) is near 13 images;
# at b8 the graphed dense predict measured the mask about 0.3 ms ahead in fp16 and level within
# the ~1 ms run noise in fp32 (bench/results/2026-12-01-serving-h200-NOTES.md, run4).
MASK_MAX_BATCH = 8
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
    def _bit_or(a, b):
        return a | b

    @triton.jit
    def _suppression_mask_kernel(boxes_ptr, cls_ptr, nvalid_ptr, thr_ptr, mask_ptr, K, KM, W,
                                 BLOCK: tl.constexpr):
        """Word ``cw`` of rows ``64 rb ..``: bit j of ``mask[img, i, cw]`` = candidate ``64 cw + j``
        comes after ``i``, has its class and IoU > threshold. Only words at or right of the diagonal."""
        img = tl.program_id(0).to(tl.int64)
        rb = tl.program_id(1)
        cw = tl.program_id(2)
        n = tl.minimum(tl.minimum(tl.load(nvalid_ptr + img).to(tl.int32), K), KM)
        if (cw >= rb) & (rb * BLOCK < n) & (cw * BLOCK < n):
            lanes = tl.arange(0, BLOCK)
            rows = rb * BLOCK + lanes
            cols = cw * BLOCK + lanes
            rv = rows < n
            cv = cols < n
            box_base = boxes_ptr + img * K * 4
            cls_base = cls_ptr + img * K
            ax1 = tl.load(box_base + rows * 4 + 0, mask=rv, other=0.0)
            ay1 = tl.load(box_base + rows * 4 + 1, mask=rv, other=0.0)
            ax2 = tl.load(box_base + rows * 4 + 2, mask=rv, other=0.0)
            ay2 = tl.load(box_base + rows * 4 + 3, mask=rv, other=0.0)
            ac = tl.load(cls_base + rows, mask=rv, other=-1)
            bx1 = tl.load(box_base + cols * 4 + 0, mask=cv, other=0.0)
            by1 = tl.load(box_base + cols * 4 + 1, mask=cv, other=0.0)
            bx2 = tl.load(box_base + cols * 4 + 2, mask=cv, other=0.0)
            by2 = tl.load(box_base + cols * 4 + 3, mask=cv, other=0.0)
            bc = tl.load(cls_base + cols, mask=cv, other=-2)
            a_area = tl.maximum(ax2 - ax1, 0.0) * tl.maximum(ay2 - ay1, 0.0)
            b_area = tl.maximum(bx2 - bx1, 0.0) * tl.maximum(by2 - by1, 0.0)
            s = _suppresses(ax1, ay1, ax2, ay2, a_area, bx1, by1, bx2, by2, b_area, tl.load(thr_ptr))
            s = s & (ac[:, None] == bc[None, :]) & (rows[:, None] < cols[None, :]) & cv[None, :]
            words = tl.sum(s.to(tl.int64) << lanes[None, :].to(tl.int64), axis=1)
            tl.store(mask_ptr + (img * KM + rows) * W + cw, words, mask=rv)

    @triton.jit
    def _greedy_nms_kernel(boxes_ptr, cls_ptr, nvalid_ptr, thr_ptr, keep_ptr, count_ptr, mask_ptr, removed_ptr,
                           K, M, KM, W, BLOCK: tl.constexpr, KEPT: tl.constexpr, WORDS: tl.constexpr):
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
            in_mask = start < KM  # KM is a multiple of BLOCK: the whole block has mask rows
            wb = start // BLOCK
            if in_mask:  # suppressed by a kept box: its bit in this block's word of the removed row
                rw = tl.load(removed_ptr + img * W + wb)
                hit = ((rw >> lanes.to(tl.int64)) & 1).to(tl.int32)
            k0 = n * 0
            if in_mask:
                k0 = count  # no kept-box tiles: the mask said it all
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
            if in_mask:  # the block's own suppressions: its diagonal word
                diag = tl.load(mask_ptr + (img * KM + pos) * W + wb, mask=valid, other=0)
                s = ((diag[:, None] >> lanes[None, :].to(tl.int64)) & 1).to(tl.int32)
            else:
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
            if in_mask:  # what this block keeps removes, in the words of the blocks after it
                n_words = (tl.minimum(n, KM) + BLOCK - 1) // BLOCK
                w0 = wb + 1
                while w0 < n_words:
                    wcols = w0 + tl.arange(0, WORDS)
                    wok = wcols < n_words
                    tile = tl.load(mask_ptr + (img * KM + pos[:, None]) * W + wcols[None, :],
                                   mask=(keep[:, None] > 0) & wok[None, :], other=0)
                    rows_or = tl.reduce(tile, 0, _bit_or)
                    old = tl.load(removed_ptr + img * W + wcols, mask=wok, other=0)
                    tl.store(removed_ptr + img * W + wcols, old | rows_or, mask=wok)
                    w0 += WORDS
            slot = count + tl.cumsum(keep, axis=0) - 1
            tl.store(keep_base + slot, pos.to(keep_ptr.dtype.element_ty), mask=(keep > 0) & (slot < M))
            count = tl.minimum(count + tl.sum(keep, axis=0), M)
            tl.debug_barrier()  # this block's stores are read by the next block's loads
            start += BLOCK
        tl.store(count_ptr + img, count.to(count_ptr.dtype.element_ty))


def greedy_nms(boxes: torch.Tensor, classes: torch.Tensor, n_valid: torch.Tensor, iou: float | torch.Tensor,
               max_det: int, *, mask_cap: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
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
        km = mask_rows(batch, k) if mask_cap is None else min(mask_cap, -(-k // BLOCK) * BLOCK)
        words = km // BLOCK
        mask = torch.empty((batch, km, max(words, 1)), dtype=torch.int64, device=device)
        removed = torch.zeros((batch, max(words, 1)), dtype=torch.int64, device=device)
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            if km:
                _suppression_mask_kernel[(batch, words, words)](boxes, classes, n_valid, thr, mask, k, km, words,
                                                                BLOCK=BLOCK, num_warps=NUM_WARPS,
                                                                enable_fp_fusion=False)
            _greedy_nms_kernel[(batch,)](boxes, classes, n_valid, thr, keep, counts, mask, removed, k, max_det, km,
                                         max(words, 1), BLOCK=BLOCK, KEPT=KEPT, WORDS=WORDS, num_warps=NUM_WARPS,
                                         enable_fp_fusion=False)
    return keep.long(), counts.long()


def mask_rows(batch: int, k: int) -> int:
    """How many leading candidates per image get the precomputed suppression mask: all ``k`` (rounded
    up to a block) up to ``MASK_CAP``, and fewer for large batches so the masks stay under
    ``MASK_BYTES`` (``batch * rows * rows / 8`` bytes); none above ``MASK_MAX_BATCH`` images.
    ``LIBREYOLO_NMS_MASK=0`` turns the mask off."""
    if batch > MASK_MAX_BATCH or os.environ.get("LIBREYOLO_NMS_MASK", "").strip() == "0":
        return 0
    rows = min(-(-k // BLOCK) * BLOCK, MASK_CAP)
    while rows > BLOCK and batch * rows * rows // 8 > MASK_BYTES:
        rows //= 2
    return rows - rows % BLOCK

