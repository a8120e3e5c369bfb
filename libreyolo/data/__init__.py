"""Input loading."""
from __future__ import annotations

from libreyolo.data.sources import SourceImage, load_sources

__all__ = ["SourceImage", "load_sources"]
