"""RF-DETR detectors (sizes n, s, m, l)."""
from __future__ import annotations

from libreyolo.models.rfdetr.family import RFDETRFamily
from libreyolo.models.rfdetr.network import RFDETR

__all__ = ["RFDETR", "RFDETRFamily"]
