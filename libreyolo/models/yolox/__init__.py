"""YOLOX detectors (sizes n, t, s, m, l, x)."""
from __future__ import annotations

from libreyolo.models.yolox.family import Yolox
from libreyolo.models.yolox.network import YOLOX, decode

__all__ = ["YOLOX", "Yolox", "decode"]
