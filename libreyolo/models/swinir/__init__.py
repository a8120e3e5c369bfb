"""SwinIR (restore, 4x super-resolution): network and family adapter; importing registers the family."""
from __future__ import annotations

from libreyolo.models.swinir.family import SwinIRFamily
from libreyolo.models.swinir.network import SwinIR

__all__ = ["SwinIR", "SwinIRFamily"]
