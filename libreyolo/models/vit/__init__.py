"""ViT (classify): network and family adapter; importing registers the family."""
from __future__ import annotations

from libreyolo.models.vit.family import ViT
from libreyolo.models.vit.network import VisionTransformer

__all__ = ["ViT", "VisionTransformer"]
