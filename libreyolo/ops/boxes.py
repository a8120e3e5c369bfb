"""Box maths shared by every family and runtime."""
from __future__ import annotations

import math

import torch


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pairwise IoU of xyxy boxes: (..., N, 4) x (..., M, 4) -> (..., N, M), batch dimensions
    broadcast. Empty boxes give IoU 0."""
    area_a = (a[..., 2] - a[..., 0]).clamp(min=0) * (a[..., 3] - a[..., 1]).clamp(min=0)
    area_b = (b[..., 2] - b[..., 0]).clamp(min=0) * (b[..., 3] - b[..., 1]).clamp(min=0)
    lt = torch.maximum(a[..., :, None, :2], b[..., None, :, :2])
    rb = torch.minimum(a[..., :, None, 2:], b[..., None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    union = area_a[..., :, None] + area_b[..., None, :] - inter
    return torch.where(union > 0, inter / union.clamp(min=torch.finfo(union.dtype).tiny), torch.zeros_like(inter))


def xyxy_to_xywh(boxes: torch.Tensor) -> torch.Tensor:
    """xyxy -> (center x, center y, width, height)."""
    x1, y1, x2, y2 = boxes.unbind(-1)
    return torch.stack(((x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1), -1)


def clip_boxes(boxes: torch.Tensor, height: float, width: float) -> torch.Tensor:
    """Clip xyxy boxes in place to an image of the given size and return them."""
    boxes[..., 0::2] = boxes[..., 0::2].clamp(0, width)
    boxes[..., 1::2] = boxes[..., 1::2].clamp(0, height)
    return boxes


def bbox_ciou(box1: torch.Tensor, box2: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Complete IoU of xyxy boxes, elementwise with broadcasting: (..., 4) x (..., 4) -> (...).

    CIoU = IoU - rho^2 / c^2 - alpha * v (Zheng et al., 2020): rho is the distance between the
    centres, c the diagonal of the smallest enclosing box, v the squared difference of the aspect
    angles scaled by 4/pi^2, and alpha = v / (1 - IoU + v) its trade-off weight, held constant
    for the gradient as the paper prescribes. 1 for identical boxes, negative for disjoint ones
    (down to -1); used as a regression loss ``1 - CIoU``, it still pulls disjoint boxes together.
    """
    b1x1, b1y1, b1x2, b1y2 = box1.unbind(-1)
    b2x1, b2y1, b2x2, b2y2 = box2.unbind(-1)
    w1, h1 = b1x2 - b1x1, b1y2 - b1y1 + eps
    w2, h2 = b2x2 - b2x1, b2y2 - b2y1 + eps
    inter = ((torch.minimum(b1x2, b2x2) - torch.maximum(b1x1, b2x1)).clamp(min=0)
             * (torch.minimum(b1y2, b2y2) - torch.maximum(b1y1, b2y1)).clamp(min=0))
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union
    cw = torch.maximum(b1x2, b2x2) - torch.minimum(b1x1, b2x1)
    ch = torch.maximum(b1y2, b2y2) - torch.minimum(b1y1, b2y1)
    c2 = cw.square() + ch.square() + eps
    rho2 = ((b2x1 + b2x2 - b1x1 - b1x2).square() + (b2y1 + b2y2 - b1y1 - b1y2).square()) / 4
    v = (4 / math.pi**2) * (torch.atan(w2 / h2) - torch.atan(w1 / h1)).square()
    with torch.no_grad():
        alpha = v / (v - iou + (1 + eps))
    return iou - (rho2 / c2 + v * alpha)


def bbox_giou(box1: torch.Tensor, box2: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Generalised IoU of xyxy boxes, elementwise with broadcasting: (..., 4) x (..., 4) -> (...).

    GIoU = IoU - (C - U) / C (Rezatofighi et al., 2019), C the area of the smallest enclosing box
    and U the union: 1 for identical boxes, towards -1 for far-apart ones, so ``1 - GIoU`` still
    pulls disjoint boxes together. An inverted side counts as zero width (area 0, not negative).
    """
    lt1, rb1, lt2, rb2 = box1[..., :2], box1[..., 2:], box2[..., :2], box2[..., 2:]
    wh1, wh2 = (rb1 - lt1).clamp(min=0), (rb2 - lt2).clamp(min=0)
    inter_wh = (torch.minimum(rb1, rb2) - torch.maximum(lt1, lt2)).clamp(min=0)
    inter = inter_wh[..., 0] * inter_wh[..., 1]
    union = wh1[..., 0] * wh1[..., 1] + wh2[..., 0] * wh2[..., 1] - inter
    enclose_wh = (torch.maximum(rb1, rb2) - torch.minimum(lt1, lt2)).clamp(min=0)
    enclose = enclose_wh[..., 0] * enclose_wh[..., 1]
    iou = inter / union.clamp(min=eps)
    return iou - (enclose - union) / enclose.clamp(min=eps)
