"""NMS inside an exported graph, from portable ops only (no NonMaxSuppression op needed).

Graph side (:class:`EmbeddedNMS`): clip boxes to the network input, take the ``topk`` best
(box, class) pairs over all classes (multi-label, like eager), build their pairwise
"suppresses" matrix (same class, IoU > ``iou``, higher rank), and solve the greedy recurrence
``keep[j] = alive[j] and not any(keep[i] and S[i, j])`` by ``iterations`` Jacobi steps (one
matrix-vector product each). It is the same recurrence as :mod:`libreyolo.ops.nms`; after
``t`` steps every candidate whose chain of would-be suppressors is shorter than ``t`` is final.
Kept rows are compacted into ``detections`` (B, max_det, 6: x1, y1, x2, y2, score, class) with
a one-hot matrix product (exact: one 1.0 per row), plus ``num_detections`` (B,).

Exact, i.e. equal to eager greedy NMS, when (1) no more than ``topk`` pairs score above the
confidence the user predicts with (lower-scored pairs cannot suppress higher ones, so the cap
only drops the tail), (2) no suppression chain among the candidates is ``iterations`` long.
Known difference: boxes are clipped to the input square before NMS, eager clips them to the
image inside the letterbox; IoUs differ only for boxes that reach into the padding.

Runtime side (:class:`EmbeddedNmsDecoder`): declared by the family's export contract, it maps
the rows back to source pixels like eager postprocessing and applies ``conf``/``classes``/
``max_det`` (filtering after greedy NMS equals filtering before it).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from libreyolo.errors import ArgumentError
from libreyolo.ops.letterbox import LetterboxMeta

OUTPUT_NAMES = ("detections", "num_detections")
OUTPUT_AXES = {"detections": {0: "batch"}, "num_detections": {0: "batch"}}
DEFAULTS = {"topk": 1000, "iterations": 32, "iou": 0.45, "conf": 0.001, "max_det": 300}


def _pairwise_iou(a: torch.Tensor) -> torch.Tensor:
    """(B, K, 4) xyxy -> (B, K, K) IoU, zero where the union is empty."""
    area = (a[..., 2] - a[..., 0]).clamp(min=0) * (a[..., 3] - a[..., 1]).clamp(min=0)
    lt = torch.maximum(a[:, :, None, :2], a[:, None, :, :2])
    rb = torch.minimum(a[:, :, None, 2:], a[:, None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    union = area[:, :, None] + area[:, None, :] - inter
    return inter / union.clamp(min=1e-9) * (union > 0).to(inter.dtype)


class EmbeddedNMS(nn.Module):
    """(B, 4 + nc, N) predictions + the input image -> (detections, num_detections)."""

    def __init__(self, nc: int, *, topk: int, iterations: int, iou: float, conf: float, max_det: int) -> None:
        super().__init__()
        self.nc, self.topk, self.iterations = nc, topk, iterations
        self.iou, self.conf, self.max_det = iou, conf, max_det
        self.register_buffer("upper", torch.triu(torch.ones(topk, topk), diagonal=1), persistent=False)
        self.register_buffer("slots", torch.arange(max_det, dtype=torch.float32).view(1, max_det, 1),
                             persistent=False)

    def forward(self, predictions: torch.Tensor, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        nc = self.nc
        pred = predictions.float()
        # input width/height as tensors derived from the image, so they follow dynamic shapes
        width = torch.ones_like(images[:1, :1, :1, :], dtype=pred.dtype).sum()
        height = torch.ones_like(images[:1, :1, :, :1], dtype=pred.dtype).sum()
        boxes = pred[:, :4].transpose(1, 2)  # (B, N, 4)
        x1 = torch.minimum(boxes[..., 0].clamp(min=0), width)
        y1 = torch.minimum(boxes[..., 1].clamp(min=0), height)
        x2 = torch.minimum(boxes[..., 2].clamp(min=0), width)
        y2 = torch.minimum(boxes[..., 3].clamp(min=0), height)
        boxes = torch.stack((x1, y1, x2, y2), -1)
        has_area = ((x2 > x1) & (y2 > y1)).to(pred.dtype)
        scores = pred[:, 4:].transpose(1, 2) * has_area.unsqueeze(-1) - (1 - has_area.unsqueeze(-1))
        # pad with dead rows so that at least topk pairs exist at any input size
        pad = (self.topk + nc - 1) // nc
        scores = torch.cat((scores, scores[:, :1].detach().expand(-1, pad, -1) * 0 - 1), 1)
        boxes = torch.cat((boxes, boxes[:, :1].expand(-1, pad, -1) * 0), 1)
        top_scores, top_idx = scores.flatten(1).topk(self.topk, dim=1)
        box_idx = torch.div(top_idx, nc, rounding_mode="floor")
        cls_idx = top_idx - box_idx * nc
        cand = torch.gather(boxes, 1, box_idx.unsqueeze(-1).expand(-1, -1, 4))  # (B, K, 4)
        alive = (top_scores > self.conf).to(pred.dtype)
        same_cls = (cls_idx.unsqueeze(2) == cls_idx.unsqueeze(1)).to(pred.dtype)
        suppress = (_pairwise_iou(cand) > self.iou).to(pred.dtype) * same_cls * self.upper
        keep = alive
        for _ in range(self.iterations):
            hit = torch.matmul(keep.unsqueeze(1), suppress).squeeze(1)
            keep = alive * (hit <= 0).to(pred.dtype)
        rank = torch.cumsum(keep, 1) - 1  # slot of each kept candidate
        place = (rank.unsqueeze(1) == self.slots).to(pred.dtype) * keep.unsqueeze(1)  # (B, max_det, K)
        rows = torch.cat((cand, top_scores.unsqueeze(-1), cls_idx.to(pred.dtype).unsqueeze(-1)), -1)
        detections = torch.matmul(place, rows)
        num = place.sum((1, 2)).to(torch.int64)
        return detections.to(predictions.dtype), num


class EmbeddedNmsDecoder:
    """Turns ``detections``/``num_detections`` into eager-style per-image results."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = dict(params)

    def __call__(self, outputs: dict[str, torch.Tensor], metas: Sequence[LetterboxMeta],
                 opts: Any) -> list[dict[str, torch.Tensor]]:
        """Per-image results at the detect task's options ``opts`` (``conf``, ``iou``, ``max_det``, ``classes``)."""
        conf, iou, max_det, classes = opts.conf, opts.iou, opts.max_det, opts.get("classes")
        baked_iou, floor = float(self.params["iou"]), float(self.params["conf"])
        if abs(iou - baked_iou) > 1e-9:
            raise ArgumentError(
                f"this artifact has NMS built in at iou={baked_iou}; predict with iou={baked_iou} or "
                "re-export with nms=False to choose the IoU threshold at predict time"
            )
        if conf < floor:
            raise ArgumentError(f"this artifact keeps only detections above conf={floor} (its embedded NMS "
                                f"threshold); predict with conf >= {floor}, or re-export with nms=False")
        dets, nums = outputs["detections"].float(), outputs["num_detections"]
        results = []
        for det, n, meta in zip(dets, nums, metas, strict=True):
            det = det[:int(n)]
            boxes = meta.to_original(det[:, :4])
            h, w = meta.orig_shape
            boxes[:, 0::2] = boxes[:, 0::2].clamp(0, w)
            boxes[:, 1::2] = boxes[:, 1::2].clamp(0, h)
            keep = (det[:, 4] > conf) & (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
            if classes is not None:
                keep &= torch.isin(det[:, 5].long(), torch.tensor(list(classes), device=det.device))
            idx = keep.nonzero().flatten()[:max_det]
            results.append({"xyxy": boxes[idx], "conf": det[idx, 4], "cls": det[idx, 5]})
        return results
