"""SegFormer (semantic): network and family adapter; importing registers the family."""
from __future__ import annotations

from libreyolo.models.segformer.family import SegFormerFamily
from libreyolo.models.segformer.network import SegFormer

__all__ = ["SegFormer", "SegFormerFamily"]
