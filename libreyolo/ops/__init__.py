"""Operations shared by every family, the eager model, CUDA graphs and every runtime."""
from __future__ import annotations

from libreyolo.ops.boxes import box_iou, clip_boxes, xyxy_to_xywh
from libreyolo.ops.letterbox import Letterbox, LetterboxMeta
from libreyolo.ops.nms import nms

__all__ = ["Letterbox", "LetterboxMeta", "box_iou", "clip_boxes", "nms", "xyxy_to_xywh"]
