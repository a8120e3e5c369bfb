"""Semantic-segmentation postprocessing: per-pixel class ids in the original image, on the device.

The network returns logits at the input resolution (B, nc, S, S). For each image the part of the
input its pixels occupy is cut out (the letterbox padding carries no image), resized bilinearly
(half-pixel centres, float32) to the original (h, w), and the best class of every pixel is taken.
The crop follows the reference LibreYOLO library: the image spans ``round(side * ratio)`` logit
cells, clamped to [1, S], counted from the letterbox offset.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from libreyolo.errors import ArgumentError
from libreyolo.ops.letterbox import LetterboxMeta

__all__ = ["semantic_postprocess"]

# float32 elements one bilinear resize may produce at once (1 GiB): images sharing a size are
# resized together up to this, so a batch of large originals does not need one huge tensor
MAX_RESIZE_ELEMENTS = 1 << 28


def _content_window(meta: LetterboxMeta, in_h: int, in_w: int, input_size: tuple[int, int]) -> tuple[int, ...]:
    """(top, left, height, width) of the image inside an (in_h, in_w) logit map of a network input
    of ``input_size`` (h, w)."""
    h, w = meta.orig_shape
    sy, sx = in_h / input_size[0], in_w / input_size[1]
    left, top = meta.pad
    y0, x0 = min(int(round(top * sy)), in_h - 1), min(int(round(left * sx)), in_w - 1)
    vh = min(in_h - y0, max(int(round(h * meta.ratio * sy)), 1))
    vw = min(in_w - x0, max(int(round(w * meta.ratio * sx)), 1))
    return y0, x0, vh, vw


def _allowed_classes(classes: Sequence[int] | None, nc: int, device: torch.device) -> torch.Tensor | None:
    if classes is None:
        return None
    ids = sorted({int(c) for c in classes})
    if not ids:
        raise ArgumentError("classes=[] leaves no class a pixel could take; pass at least one class id, or "
                            "classes=None for all")
    bad = [c for c in ids if not 0 <= c < nc]
    if bad:
        raise ArgumentError(f"classes {bad} are outside this model's class ids 0..{nc - 1}")
    return torch.tensor(ids, dtype=torch.int64, device=device)


def semantic_postprocess(logits: torch.Tensor, metas: Sequence[LetterboxMeta], classes: Sequence[int] | None = None,
                         input_size: tuple[int, int] | None = None, margins: bool = False,
                         **_: Any) -> list[dict[str, torch.Tensor]]:
    """One dict per image: ``mask`` (h, w) int64 class ids at the original image's resolution.

    ``logits``: (B, nc, H, W) for a network input of ``input_size`` (default: (H, W), the
    network's own output). ``classes``: only these ids can win a pixel (the others are left out
    before the argmax, so ties keep the lowest allowed id). ``margins``: also ``margin`` (h, w)
    float32, the gap between each pixel's best and second-best resized logit (export validation
    reads it to tell a tie from a wrong pixel). Detection arguments (``conf``,
    ``iou``, ``max_det``) do not apply and are ignored.
    """
    if logits.ndim != 4 or logits.shape[0] != len(metas):
        raise ArgumentError(f"semantic_postprocess expects logits (B, nc, H, W) for {len(metas)} image(s), "
                            f"got {tuple(logits.shape)}")
    n, nc, in_h, in_w = logits.shape
    allowed = _allowed_classes(classes, nc, logits.device)
    if allowed is not None:
        logits = logits.index_select(1, allowed)  # bilinear resizing is per channel: select first, resize less
    input_size = (in_h, in_w) if input_size is None else tuple(input_size)
    out: list[dict[str, torch.Tensor]] = []
    start = 0
    while start < n:
        window, shape = _content_window(metas[start], in_h, in_w, input_size), metas[start].orig_shape
        per_image = logits.shape[1] * shape[0] * shape[1]
        stop = start + 1
        while (stop < n and metas[stop].orig_shape == shape and (stop - start + 1) * per_image <= MAX_RESIZE_ELEMENTS
               and _content_window(metas[stop], in_h, in_w, input_size) == window):
            stop += 1
        y0, x0, vh, vw = window
        crop = logits[start:stop, :, y0:y0 + vh, x0:x0 + vw].float()
        resized = F.interpolate(crop, size=shape, mode="bilinear", align_corners=False)
        ids = resized.argmax(1)
        if allowed is not None:
            ids = allowed[ids]
        if margins and resized.shape[1] > 1:
            top2 = resized.topk(2, dim=1).values
            out += [{"mask": m, "margin": g} for m, g in zip(ids, top2[:, 0] - top2[:, 1], strict=True)]
        else:
            out += [{"mask": m} for m in ids]
        start = stop
    return out
