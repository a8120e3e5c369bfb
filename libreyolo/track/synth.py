"""Synthetic tracking sequences of the shapes the demo detector knows, in MOTChallenge folders.

:func:`synth_sequence` draws coloured shapes (square, circle, triangle: the classes of
``LibreYOLO9t-shapes.pt``) moving over a fixed background, with known identities, and optionally
**occlusions** (two shapes share a lane and cross; a later identity is drawn over an earlier one)
and **entry and exit** (some shapes come in from a side after the first frame and leave by the
other; an identity that left never returns). Each frame's truth holds every shape with a part in
the frame: its identity, class, box clipped to the frame and visibility (the share of its whole box
neither outside the frame nor under a shape drawn above it, as MOTChallenge's visibility column).

:func:`write_mot_sequence` / :func:`make_mot_sequences` write the MOTChallenge layout
(``<root>/<seq>/seqinfo.ini``, ``img1/000001.png``, ``gt/gt.txt``); :func:`read_mot_sequences`
reads that layout, the synthetic sets and MOT17-style data alike. gt rows are
``frame, id, left, top, width, height, 1, class, visibility`` with class 1 (MOTChallenge's scored
class) for shapes at least :data:`MIN_VISIBLE` visible and class 8 (a distractor: a tracker box on
it is neither a hit nor a false positive) for slivers entering, leaving or nearly hidden, which no
detector should be asked to find. Shapes are evaluated class-agnostically, as MOT17's pedestrians.
"""
from __future__ import annotations

import configparser
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from libreyolo.errors import ArgumentError
from libreyolo.train.shapes import CLASSES, background, bright_colour, draw_shape
from libreyolo.utils.atomic import atomic_write

MIN_VISIBLE = 0.25  # a box less visible than this is a distractor row: neither to be found nor to be missed
SCORED_CLASS, IGNORED_CLASS = 1, 8  # MOTChallenge class ids: pedestrian (scored), distractor
IMAGE_DIR, IMAGE_EXT = "img1", ".png"  # lossless frames: the truth is exact


@dataclass(frozen=True)
class GtBox:
    """One shape in one frame: identity (from 1), class, box clipped to the frame, visibility 0..1."""

    ident: int
    cls: int
    box: tuple[int, int, int, int]
    visibility: float


@dataclass(frozen=True)
class MotSequence:
    """One sequence of a MOTChallenge folder: its frames in order, frame rate and gt file."""

    name: str
    path: Path
    fps: float
    images: list[Path]
    gt: Path


def synth_sequence(n_frames: int = 60, *, width: int = 160, height: int = 128, n_objects: int = 5, size: int = 28,
                   speed: float = 2.5, occlusion: bool = True, entry_exit: bool = True,
                   seed: int = 0) -> tuple[list[np.ndarray], list[list[GtBox]]]:
    """(RGB uint8 frames, per frame the :class:`GtBox` of each shape with a part in the frame)."""
    if n_frames < 1 or n_objects < 1 or size < 8 or width < 2 * size or height < 2 * size or speed <= 0:
        raise ArgumentError(f"synth_sequence: cannot draw {n_objects} shapes of {size} px in {width}x{height} "
                            f"over {n_frames} frames at speed {speed}; use size >= 8 and a frame at least twice it")
    rng = np.random.default_rng(seed)
    backdrop = background(height, width, rng)
    if not occlusion and height // n_objects < size:
        raise ArgumentError(f"synth_sequence: {n_objects} shapes of {size} px need a frame {n_objects * size} px "
                            f"high to keep a lane each without occlusion, got {height}")
    lanes = max(1, (height - size) // max(1, size // 2))
    objs = []
    for k in range(n_objects):
        # occlusion: shapes 0 and 1 share a lane and head for each other, the rest take any lane (and may
        # cross too); without: a lane each, no vertical motion
        lane = (0 if k < 2 else int(rng.integers(0, lanes))) if occlusion else k
        y = (float(lane * (height - size) / max(1, lanes - 1)) if lanes > 1 else 0.0) if occlusion else \
            float(k * (height // n_objects))
        v = speed * float(rng.uniform(0.7, 1.2))
        leftward = bool(k % 2) if occlusion and k < 2 else bool(rng.random() < 0.5)
        enters = entry_exit and k >= (n_objects + 1) // 2
        start = int(rng.integers(1, max(2, n_frames // 2))) if enters else 0
        if enters:
            x = float(width) if leftward else float(-size)
        elif occlusion and k < 2:
            x = float(width - size) if leftward else 0.0
        else:
            x = float(rng.uniform(0, width - size))
        objs.append({"ident": k + 1, "cls": k % len(CLASSES), "colour": bright_colour(rng), "x": x, "y": y,
                     "dx": -v if leftward else v, "dy": float(rng.uniform(-0.3, 0.3)) * speed * occlusion,
                     "start": start,
                     "bounce": not entry_exit})
    frames: list[np.ndarray] = []
    truth: list[list[GtBox]] = []
    for t in range(n_frames):
        img = Image.fromarray(backdrop)
        draw = ImageDraw.Draw(img)
        live = [o for o in objs if o["start"] <= t and _inside(o, width, size)]
        for o in live:  # in identity order: a later identity covers an earlier one
            x1, y1 = round(o["x"]), round(o["y"])
            draw_shape(draw, o["cls"], (x1, y1, x1 + size, y1 + size), o["colour"])
        truth.append(_visible_boxes(live, width, height, size))
        frames.append(np.asarray(img))
        for o in objs:
            if o["start"] <= t:
                _move(o, width, height, size)
    return frames, truth


def _inside(o: dict, width: int, size: int) -> bool:
    return -size < round(o["x"]) < width


def _move(o: dict, width: int, height: int, size: int) -> None:
    o["x"] += o["dx"]
    o["y"] += o["dy"]
    if not 0 <= o["y"] <= height - size:
        o["dy"], o["y"] = -o["dy"], min(max(o["y"], 0.0), float(height - size))
    if o["bounce"] and not 0 <= o["x"] <= width - size:
        o["dx"], o["x"] = -o["dx"], min(max(o["x"], 0.0), float(width - size))


def _visible_boxes(live: list[dict], width: int, height: int, size: int) -> list[GtBox]:
    covered = np.zeros((height, width), bool)
    out = []
    for o in reversed(live):  # from the top shape down: what lies above is already covered
        x1, y1 = round(o["x"]), round(o["y"])
        cx1, cy1, cx2, cy2 = max(x1, 0), max(y1, 0), min(x1 + size, width), min(y1 + size, height)
        region = covered[cy1:cy2, cx1:cx2]
        visibility = float((~region).sum()) / (size * size)
        region[:] = True
        out.append(GtBox(o["ident"], o["cls"], (cx1, cy1, cx2, cy2), round(visibility, 4)))
    return sorted(out, key=lambda b: b.ident)


def gt_rows(truth: list[list[GtBox]]) -> str:
    """MOTChallenge gt.txt text of ``truth`` (frames from 1)."""
    lines = []
    for t, boxes in enumerate(truth, 1):
        for b in boxes:
            x1, y1, x2, y2 = b.box
            cls = SCORED_CLASS if b.visibility >= MIN_VISIBLE else IGNORED_CLASS
            lines.append(f"{t},{b.ident},{x1},{y1},{x2 - x1},{y2 - y1},1,{cls},{b.visibility:g}")
    return "\n".join(lines) + ("\n" if lines else "")


def write_mot_sequence(root: str | Path, name: str, frames: list[np.ndarray], truth: list[list[GtBox]], *,
                       fps: float = 25.0) -> Path:
    """``<root>/<name>`` in MOTChallenge layout: seqinfo.ini, img1/000001.png..., gt/gt.txt."""
    seq = Path(root) / name
    (seq / IMAGE_DIR).mkdir(parents=True, exist_ok=True)
    (seq / "gt").mkdir(exist_ok=True)
    for t, frame in enumerate(frames, 1):
        Image.fromarray(frame).save(seq / IMAGE_DIR / f"{t:06d}{IMAGE_EXT}")
    h, w = frames[0].shape[:2]
    info = (f"[Sequence]\nname={name}\nimDir={IMAGE_DIR}\nframeRate={fps:g}\nseqLength={len(frames)}\n"
            f"imWidth={w}\nimHeight={h}\nimExt={IMAGE_EXT}\n")
    atomic_write(seq / "seqinfo.ini", lambda tmp: tmp.write_text(info))
    atomic_write(seq / "gt" / "gt.txt", lambda tmp: tmp.write_text(gt_rows(truth)))
    return seq


def make_mot_sequences(root: str | Path, *, sequences: int = 2, frames: int = 60, width: int = 160,
                       height: int = 128, objects: int = 5, size: int = 28, speed: float = 2.5,
                       occlusion: bool = True, entry_exit: bool = True, fps: float = 25.0, seed: int = 0) -> Path:
    """A set of ``sequences`` synthetic sequences ``synth-00``, ``synth-01``... under ``root``
    (MOTChallenge layout; sequence ``i`` uses seed ``seed + i``). Returns ``root``."""
    root = Path(root)
    for i in range(sequences):
        f, t = synth_sequence(frames, width=width, height=height, n_objects=objects, size=size, speed=speed,
                              occlusion=occlusion, entry_exit=entry_exit, seed=seed + i)
        write_mot_sequence(root, f"synth-{i:02d}", f, t, fps=fps)
    return root


def read_mot_sequences(root: str | Path) -> list[MotSequence]:
    """The sequences of a MOTChallenge folder (each ``<root>/<seq>/gt/gt.txt``, frames in
    ``seqinfo.ini``'s imDir with its imExt, default ``img1`` / ``.jpg``), in name order."""
    root = Path(root)
    if not root.is_dir():
        raise ArgumentError(f"tracking data {root} is not a folder; give a folder of MOTChallenge sequences "
                            "(<seq>/seqinfo.ini, <seq>/img1/, <seq>/gt/gt.txt), e.g. from `libreyolo track-synth`")
    out = []
    for gt in sorted(root.glob("*/gt/gt.txt")):
        seq = gt.parent.parent
        info = configparser.ConfigParser()
        info.read(seq / "seqinfo.ini")
        s = info["Sequence"] if info.has_section("Sequence") else {}
        folder, ext = seq / s.get("imDir", IMAGE_DIR), s.get("imExt", ".jpg")
        images = sorted(p for p in folder.glob(f"*{ext}") if p.is_file()) if folder.is_dir() else []
        length = int(s.get("seqLength", len(images)))
        if len(images) < length or not images:
            raise ArgumentError(f"{seq.name}: {folder} holds {len(images)} {ext} frames, seqinfo.ini says {length}")
        out.append(MotSequence(seq.name, seq, float(s.get("frameRate", 30)), images[:length], gt))
    if not out:
        raise ArgumentError(f"{root} holds no MOTChallenge sequence (no {os.path.join('<seq>', 'gt', 'gt.txt')}); "
                            "make one with `libreyolo track-synth out=<folder>`")
    return out
