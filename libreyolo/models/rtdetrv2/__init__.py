"""RT-DETRv2 detectors (sizes r18, r34, r50, r50m, r101)."""
from __future__ import annotations

from libreyolo.models.rtdetrv2.family import RTDETRv2Family
from libreyolo.models.rtdetrv2.network import RTDETRv2

__all__ = ["RTDETRv2", "RTDETRv2Family"]
