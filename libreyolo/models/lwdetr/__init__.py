"""LW-DETR detectors (sizes t, s, m, l, x)."""
from __future__ import annotations

from libreyolo.models.lwdetr.family import LWDETRFamily
from libreyolo.models.lwdetr.network import LWDETRNet

__all__ = ["LWDETRFamily", "LWDETRNet"]
