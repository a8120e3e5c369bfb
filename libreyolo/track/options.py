"""The options of ``track()``, ``libreyolo track``, tracking validation and ``libreyolo track-synth``,
declared once (no torch: the CLI's help reads them)."""
from __future__ import annotations

from dataclasses import replace

from libreyolo.options import Opt, as_bool, as_output_file

# name -> the ``trackers`` (Roboflow) class that implements it
TRACKERS = {"bytetrack": "ByteTrackTracker", "sort": "SORTTracker", "ocsort": "OCSORTTracker",
            "botsort": "BoTSORTTracker"}

TRACK_OPTIONS: dict[str, Opt] = {
    "tracker": Opt(str, "bytetrack", "the tracking algorithm (Roboflow trackers)", choices=tuple(TRACKERS)),
    "persist": Opt(as_bool, False, "keep the tracks of this source for the next track() call on it", True),
}

# model.val(data=<MOT folder>, tracker=...) and `libreyolo val tracker=...` (libreyolo.track.evaluate)
TRACK_VAL_OPTIONS: dict[str, Opt] = {
    "tracker": replace(TRACK_OPTIONS["tracker"], default=None,
                       help="validate this tracker on data= (a folder of MOTChallenge sequences): HOTA, IDF1, MOTA"),
    "json": Opt(as_output_file, None, "also write the metrics as JSON to this path"),
}

# `libreyolo track-synth` / libreyolo.track.synth.make_mot_sequences
SYNTH_OPTIONS: dict[str, Opt] = {
    "out": Opt(str, None, "the folder to write the sequences to (MOTChallenge layout)"),
    "sequences": Opt(int, 2, "how many sequences", min=1, max=1000),
    "frames": Opt(int, 60, "frames per sequence", min=1, max=100_000),
    "width": Opt(int, 160, "frame width", min=16, max=8192, unit="px"),
    "height": Opt(int, 128, "frame height", min=16, max=8192, unit="px"),
    "objects": Opt(int, 5, "shapes per sequence", min=1, max=1000),
    "size": Opt(int, 28, "shape side", min=8, max=4096, unit="px"),
    "speed": Opt(float, 2.5, "shape speed", min=0.0, min_open=True, max=1000.0, unit="px/frame"),
    "occlusion": Opt(as_bool, True, "two shapes cross in one lane (one hides the other)", True),
    "entry_exit": Opt(as_bool, True, "half the shapes enter after the first frame and leave by a side", True),
    "fps": Opt(float, 25.0, "frame rate written to seqinfo.ini", min=0.0, min_open=True, max=1000.0),
    "seed": Opt(int, 0, "random seed (sequence i uses seed + i)", min=0),
}
