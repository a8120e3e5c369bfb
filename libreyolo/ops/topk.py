"""Set-prediction postprocessing (DETR line): top-k over sigmoid scores, no NMS.

Input: ``pred_logits`` (B, Q, nc) raw class logits and ``pred_boxes`` (B, Q, 4) boxes
(cx, cy, w, h) normalised to the network input. Per image: sigmoid scores, the ``max_det``
best (query, class) pairs over all Q x nc (one query may give several classes), keep those
above ``conf``, boxes to xyxy in source pixels. Boxes are not clipped to the image: the
reference pipelines return them as the network predicts them.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def cxcywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    cx, cy, w, h = boxes.unbind(-1)
    return torch.stack((cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h), dim=-1)


def _to_source(meta: Any, boxes: torch.Tensor) -> torch.Tensor:
    """Normalised xyxy -> source pixels for one image's preprocessing meta.

    Stretch metas map normalised coordinates straight to the source size. Any other meta
    (a letterbox) is read as: content of ``orig_shape * ratio`` placed at ``pad`` and padded
    by the same amount on the far side (true for centred placement and for unpadded inputs,
    such as the validator's plain probes), so boxes go to input pixels and then back.
    """
    direct = getattr(meta, "normalized_to_original", None)
    if direct is not None:
        return direct(boxes)
    h, w = meta.orig_shape
    left, top = meta.pad
    ratio = meta.ratio
    in_w, in_h = w * ratio + 2 * left, h * ratio + 2 * top
    return meta.to_original(boxes * boxes.new_tensor([in_w, in_h, in_w, in_h]))


def topk_postprocess(logits: torch.Tensor, boxes: torch.Tensor, metas: Sequence[Any], *, conf: float,
                     max_det: int, classes: Sequence[int] | None = None) -> list[dict[str, torch.Tensor]]:
    """One dict per image: ``xyxy`` (K, 4) source pixels, ``conf`` (K,), ``cls`` (K,) float; best first.

    ``classes`` removes other classes before the top-k, so up to ``max_det`` detections of the
    wanted classes are returned.
    """
    logits, boxes = logits.float(), boxes.float()
    nc = logits.shape[-1]
    scores = torch.sigmoid(logits)
    if classes is not None:
        allowed = torch.zeros(nc, dtype=torch.bool, device=scores.device)
        allowed[[c for c in classes if 0 <= c < nc]] = True
        scores = scores.masked_fill(~allowed, -1.0)
    k = min(max_det, scores.shape[1] * nc)
    top, index = scores.flatten(1).topk(k, dim=1)
    query, label = index // nc, index % nc
    results = []
    for b, meta in enumerate(metas):
        keep = top[b] > conf
        q = query[b][keep]
        xyxy = _to_source(meta, cxcywh_to_xyxy(boxes[b][q]))
        results.append({"xyxy": xyxy, "conf": top[b][keep], "cls": label[b][keep].to(torch.float32)})
    return results
