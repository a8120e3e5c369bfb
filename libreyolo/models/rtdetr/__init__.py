"""RT-DETR detectors (sizes r18, r34, r50)."""
from __future__ import annotations

from libreyolo.models.rtdetr.family import RTDETRFamily
from libreyolo.models.rtdetr.network import RTDETR

__all__ = ["RTDETR", "RTDETRFamily"]
