"""Building blocks shared by every family (timm-style ``layers``)."""
from __future__ import annotations

from libreyolo.layers.conv import ConvBNAct, autopad

__all__ = ["ConvBNAct", "autopad"]
