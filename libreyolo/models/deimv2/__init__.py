"""DEIMv2 detectors (sizes atto, femto, pico, n, s, m, l, x)."""
from __future__ import annotations

from libreyolo.models.deimv2.family import DEIMv2Family
from libreyolo.models.deimv2.network import DEIMv2

__all__ = ["DEIMv2", "DEIMv2Family"]
