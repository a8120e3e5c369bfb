"""RTMDet detectors (sizes t, s, m, l, x)."""
from __future__ import annotations

from libreyolo.models.rtmdet.family import RTMDetFamily
from libreyolo.models.rtmdet.network import RTMDet, decode, decode_boxes

__all__ = ["RTMDet", "RTMDetFamily", "decode", "decode_boxes"]
