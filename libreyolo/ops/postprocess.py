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
        keep_mask = scores > conf
        keep_mask &= ((boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])).unsqueeze(1)
        if classes is not None:
            allowed = torch.zeros(scores.shape[1], dtype=torch.bool, device=scores.device)
            allowed[[c for c in classes if 0 <= c < scores.shape[1]]] = True
            keep_mask &= allowed.unsqueeze(0)
        box_idx, cls_idx = keep_mask.nonzero(as_tuple=True)
        cand_scores = scores[box_idx, cls_idx]
        cand_boxes = boxes[box_idx]
        keep = nms(cand_boxes, cand_scores, iou, classes=cls_idx, max_det=max_det)
        results.append({
            "xyxy": cand_boxes[keep],
            "conf": cand_scores[keep],
            "cls": cls_idx[keep].to(torch.float32),
        })
    return results
