"""Swin Transformer (classify): network and family adapter; importing registers the family."""
from __future__ import annotations

from libreyolo.models.swin.family import Swin
from libreyolo.models.swin.network import SwinTransformer

__all__ = ["Swin", "SwinTransformer"]
