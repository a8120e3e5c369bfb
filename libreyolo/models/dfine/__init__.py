"""D-FINE detectors (sizes n, s, m, l, x)."""
from __future__ import annotations

from libreyolo.models.dfine.family import DFINEFamily
from libreyolo.models.dfine.network import DFINE

__all__ = ["DFINE", "DFINEFamily"]
