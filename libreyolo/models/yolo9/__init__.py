"""YOLOv9 detectors (sizes t, s, m, c)."""
from __future__ import annotations

from libreyolo.models.yolo9.family import Yolo9
from libreyolo.models.yolo9.network import YOLOv9

__all__ = ["YOLOv9", "Yolo9"]
