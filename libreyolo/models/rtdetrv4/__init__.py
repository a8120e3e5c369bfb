"""RT-DETRv4 detectors (sizes s, m, l, x): D-FINE's network with a SiLU decoder."""
from __future__ import annotations

from libreyolo.models.rtdetrv4.family import RTDETRv4Family

__all__ = ["RTDETRv4Family"]
