"""DeiT (classify): the ViT network with DeiT sizes; importing registers the family."""
from __future__ import annotations

from libreyolo.models.deit.family import DeiT

__all__ = ["DeiT"]
