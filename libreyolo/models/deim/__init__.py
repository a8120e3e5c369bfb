"""DEIM detectors (sizes n, s, m, l, x): D-FINE's network with a SiLU decoder."""
from __future__ import annotations

from libreyolo.models.deim.family import DEIMFamily

__all__ = ["DEIMFamily"]
