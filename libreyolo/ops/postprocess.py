"""Detection postprocessing shared by every box-regressing family, eager or exported.

Input: ``predictions`` (B, 4 + nc, N), xyxy boxes in network-input pixels followed by
per-class probabilities. Per image: map boxes back to source pixels and clip them to the
image, drop boxes left with no area, take every (box, class) pair whose probability is above
``conf`` (multi-label), run class-aware greedy NMS, keep the best ``max_det``.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from libreyolo.ops.letterbox import LetterboxMeta
from libreyolo.ops.nms import nms


def _select(scores: torch.Tensor, above: torch.Tensor, usable: torch.Tensor, iou: float, boxes: torch.Tensor,
            max_det: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy class-aware NMS over the (box, class) pairs above ``conf``: (box, class, score) kept.

    Visiting order: the pairs in box-major order, sorted by score with ``torch.sort`` (descending,
    not stable), and only then stripped of unusable pairs (boxes with no area, excluded classes).
    That is the order the reference LibreYOLO library visits candidates in, so ties between
    equal scores resolve as they do there (on CPU the choices are identical).
    """
    box_idx, cls_idx = above.nonzero(as_tuple=True)
    cand = scores[box_idx, cls_idx]
    order = torch.sort(cand, descending=True).indices
    box_idx, cls_idx, cand = box_idx[order], cls_idx[order], cand[order]
    ok = usable[box_idx, cls_idx]
    box_idx, cls_idx, cand = box_idx[ok], cls_idx[ok], cand[ok]
    kept = nms(boxes[box_idx], cand, iou, classes=cls_idx, max_det=max_det, presorted=True)
    return box_idx[kept], cls_idx[kept], cand[kept]


def detect_postprocess(
    predictions: torch.Tensor,
    metas: Sequence[LetterboxMeta],
    *,
    conf: float,
    iou: float,
    max_det: int,
    classes: Sequence[int] | None = None,
) -> list[dict[str, torch.Tensor]]:
    """One dict per image: ``xyxy`` (K, 4) source pixels, ``conf`` (K,), ``cls`` (K,) float."""
    results = []
    predictions = predictions.float()
    for pred, meta in zip(predictions, metas, strict=True):
        boxes = meta.to_original(pred[:4].T)
        h, w = meta.orig_shape
        boxes[:, 0::2] = boxes[:, 0::2].clamp(0, w)
        boxes[:, 1::2] = boxes[:, 1::2].clamp(0, h)
        scores = pred[4:].T  # (N, nc)
        above = scores > conf
        usable = ((boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])).unsqueeze(1).expand_as(above)
        if classes is not None:
            allowed = torch.zeros(scores.shape[1], dtype=torch.bool, device=scores.device)
            allowed[[c for c in classes if 0 <= c < scores.shape[1]]] = True
            usable = usable & allowed.unsqueeze(0)
        box_idx, cls_idx, conf_kept = _select(scores, above, usable, iou, boxes, max_det)
        results.append({"xyxy": boxes[box_idx], "conf": conf_kept, "cls": cls_idx.to(torch.float32)})
    return results
