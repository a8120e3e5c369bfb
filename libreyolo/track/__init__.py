"""Tracking objects across video frames: ``model.track(...)`` (:mod:`libreyolo.track.tracking`; its
options in :mod:`libreyolo.track.options`). Importing this package loads neither torch nor the trackers."""
from __future__ import annotations

from libreyolo.track.options import TRACK_OPTIONS, TRACKERS

__all__ = ["TRACKERS", "TRACK_OPTIONS"]
