"""Box maths shared by every family and runtime."""
from __future__ import annotations

import torch


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pairwise IoU of xyxy boxes: (N, 4) x (M, 4) -> (N, M). Empty boxes give IoU 0."""
    area_a = (a[:, 2] - a[:, 0]).clamp(min=0) * (a[:, 3] - a[:, 1]).clamp(min=0)
    area_b = (b[:, 2] - b[:, 0]).clamp(min=0) * (b[:, 3] - b[:, 1]).clamp(min=0)
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    union = area_a[:, None] + area_b[None, :] - inter
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
