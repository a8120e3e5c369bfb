"""YOLOv9-E2E detectors (sizes t, s, m, c): YOLOv9 with the one-to-one, NMS-free head."""
from __future__ import annotations

from libreyolo.models.yolo9_e2e.family import Yolo9E2E
from libreyolo.models.yolo9_e2e.network import YOLOv9E2E

__all__ = ["YOLOv9E2E", "Yolo9E2E"]
