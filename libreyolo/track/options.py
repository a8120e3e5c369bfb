"""The options of ``track()`` and ``libreyolo track``, declared once (no torch: the CLI's help reads them)."""
from __future__ import annotations

from libreyolo.options import Opt, as_bool

# name -> the ``trackers`` (Roboflow) class that implements it
TRACKERS = {"bytetrack": "ByteTrackTracker", "sort": "SORTTracker", "ocsort": "OCSORTTracker",
            "botsort": "BoTSORTTracker"}

TRACK_OPTIONS: dict[str, Opt] = {
    "tracker": Opt(str, "bytetrack", "the tracking algorithm (Roboflow trackers)", choices=tuple(TRACKERS)),
    "persist": Opt(as_bool, False, "keep the tracks of this source for the next track() call on it", True),
}
