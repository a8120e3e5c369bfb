"""A synthetic dataset of coloured shapes, for smoke tests and tutorials without downloads.

Detection: each image holds 1-6 solid shapes (square, circle, triangle; classes 0, 1, 2) of a
random bright colour, 8%-40% of the image's long side, on a noisy textured background, written in
the YOLO layout (``images/{train,val}``, ``labels/{train,val}``, ``data.yaml``). Boxes are exact:
each shape is drawn inside its box and touches all four sides. Shapes may overlap (at most a
quarter of the smaller one's box), never so much that a box loses its object. Image sizes vary (the long side is
``imgsz``, the other 75%-100% of it), so letterboxing is exercised.

Classification: an image-folder tree ``train/<class>/*.jpg``, ``val/<class>/*.jpg`` with one
large shape per image.

Semantic segmentation (:func:`make_segmentation_dataset`): class 0 is the textured background,
classes 1..nc-1 are filled shapes (rectangle, circle or triangle, whatever the class) each of
its own colour, so colour alone tells the classes apart; masks are one-channel PNGs
(``masks/{train,val}``) with a 1-pixel ignore (255) line along every class boundary, where the
JPEG image blurs one colour into the next.

Restoration (:func:`make_restore_dataset`): a folder of lossless high-resolution PNGs, each a
smooth colour gradient with a few sharp-edged shapes on it (restoration val degrades them itself).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

CLASSES = ("square", "circle", "triangle")
_MAX_OVERLAP = 0.25  # at most this share of a shape's box may lie under another shape's box


def background(h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """Smooth random colour blotches plus per-pixel noise, uint8 HWC."""
    coarse = rng.uniform(40, 200, size=(4, 4, 3)).astype(np.uint8)
    smooth = np.asarray(Image.fromarray(coarse).resize((w, h), Image.Resampling.BICUBIC), dtype=np.float32)
    noise = rng.normal(0.0, 12.0, size=(h, w, 3))
    return np.clip(smooth + noise, 0, 255).astype(np.uint8)


def bright_colour(rng: np.random.Generator) -> tuple[int, int, int]:
    """A saturated, bright colour (stands out from the muted background)."""
    hsv = Image.new("HSV", (1, 1), (int(rng.integers(0, 256)), int(rng.integers(180, 256)),
                                    int(rng.integers(180, 256))))
    return hsv.convert("RGB").getpixel((0, 0))


def draw_shape(draw: ImageDraw.ImageDraw, cls: int, box: tuple[int, int, int, int],
               colour: tuple[int, int, int]) -> None:
    """Fill shape ``cls`` so that it covers pixels x1..x2-1, y1..y2-1 (box edges x1, x2)."""
    x1, y1, x2, y2 = box
    if cls == 0:
        draw.rectangle((x1, y1, x2 - 1, y2 - 1), fill=colour)
    elif cls == 1:
        draw.ellipse((x1, y1, x2 - 1, y2 - 1), fill=colour)
    else:
        draw.polygon([(x1, y2 - 1), (x2 - 1, y2 - 1), ((x1 + x2 - 1) / 2, y1)], fill=colour)


def _overlap(a: tuple[int, ...], b: tuple[int, ...]) -> float:
    """Intersection over the smaller box's area: how much of the smaller shape could be hidden."""
    iw = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    smaller = min((a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1]))
    return iw * ih / smaller if smaller else 0.0


def _shape_box(h: int, w: int, lo: float, hi: float, rng: np.random.Generator) -> tuple[int, int, int, int]:
    side = max(h, w)
    size = max(4, int(rng.uniform(lo, hi) * side))
    size = min(size, h, w)
    x1, y1 = int(rng.integers(0, w - size + 1)), int(rng.integers(0, h - size + 1))
    return x1, y1, x1 + size, y1 + size


def _image_size(imgsz: int, rng: np.random.Generator) -> tuple[int, int]:
    short = int(imgsz * rng.uniform(0.75, 1.0))
    return (imgsz, short) if rng.random() < 0.5 else (short, imgsz)


def _detection_image(imgsz: int, rng: np.random.Generator) -> tuple[Image.Image, list[tuple[int, tuple]]]:
    h, w = _image_size(imgsz, rng)
    img = Image.fromarray(background(h, w, rng))
    draw = ImageDraw.Draw(img)
    objects: list[tuple[int, tuple[int, int, int, int]]] = []
    for _ in range(int(rng.integers(1, 7))):
        for _attempt in range(20):
            box = _shape_box(h, w, 0.08, 0.40, rng)
            if all(_overlap(box, other) <= _MAX_OVERLAP for _, other in objects):
                break
        else:
            continue  # no free spot: fewer shapes in this image
        cls = int(rng.integers(0, len(CLASSES)))
        objects.append((cls, box))
        draw_shape(draw, cls, box, bright_colour(rng))
    return img, objects


def make_shapes_dataset(root: str | Path, *, n_train: int = 64, n_val: int = 16, imgsz: int = 320,
                        seed: int = 0, task: str = "detect") -> Path:
    """Write the shapes dataset under ``root`` and return its ``data.yaml`` (detect) or ``root`` (classify).

    The same arguments always give the same files.
    """
    if task not in ("detect", "classify"):
        raise ValueError(f"task must be 'detect' or 'classify', got {task!r}")
    if n_train < 1 or n_val < 1 or imgsz < 16:
        raise ValueError(f"need n_train >= 1, n_val >= 1 and imgsz >= 16, got {n_train}, {n_val}, {imgsz}")
    root = Path(root)
    rng = np.random.default_rng(seed)
    if task == "classify":
        for split, n in (("train", n_train), ("val", n_val)):
            for name in CLASSES:
                (root / split / name).mkdir(parents=True, exist_ok=True)
            for k in range(n):
                cls = k % len(CLASSES)
                h, w = _image_size(imgsz, rng)
                img = Image.fromarray(background(h, w, rng))
                draw_shape(ImageDraw.Draw(img), cls, _shape_box(h, w, 0.45, 0.8, rng), bright_colour(rng))
                img.save(root / split / CLASSES[cls] / f"{split}_{k:05d}.jpg", quality=95)
        return root
    for split, n in (("train", n_train), ("val", n_val)):
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        for k in range(n):
            img, objects = _detection_image(imgsz, rng)
            stem = f"{split}_{k:05d}"
            img.save(root / "images" / split / f"{stem}.jpg", quality=95)
            w, h = img.size
            lines = [f"{cls} {(b[0] + b[2]) / 2 / w:.6f} {(b[1] + b[3]) / 2 / h:.6f} "
                     f"{(b[2] - b[0]) / w:.6f} {(b[3] - b[1]) / h:.6f}" for cls, b in objects]
            (root / "labels" / split / f"{stem}.txt").write_text("\n".join(lines) + "\n")
    data_yaml = root / "data.yaml"
    names = "\n".join(f"  {i}: {name}" for i, name in enumerate(CLASSES))
    data_yaml.write_text(f"# synthetic shapes dataset (libreyolo.train.shapes, seed {seed})\n"
                         f"path: .\ntrain: images/train\nval: images/val\nnames:\n{names}\n")
    return data_yaml


def sample_image(seed: int = 12345, imgsz: int = 640) -> Image.Image:
    """One detection image of the dataset's kind drawn from its own ``seed`` (a held-out sample)."""
    return sample_with_boxes(seed, imgsz)[0]


def sample_with_boxes(seed: int = 12345, imgsz: int = 640) -> tuple[Image.Image, list[tuple[int, tuple]]]:
    """:func:`sample_image` and its objects: ``(class, (x1, y1, x2, y2))`` in pixels."""
    return _detection_image(imgsz, np.random.default_rng(seed))


# --- semantic segmentation ------------------------------------------------------------------------
SEGMENTATION_COLOURS = (("red", (230, 40, 40)), ("green", (40, 210, 60)), ("blue", (40, 70, 230)),
                        ("yellow", (235, 220, 40)), ("magenta", (220, 50, 220)), ("cyan", (40, 220, 225)),
                        ("orange", (245, 140, 20)))
_IGNORE = 255


def _segmentation_sample(imgsz: int, nc: int, rng: np.random.Generator) -> tuple[Image.Image, Image.Image]:
    """One (RGB image, class-id mask) pair, each side 60%-100% of ``imgsz``."""
    h, w = (max(16, int(imgsz * rng.uniform(0.6, 1.0))) for _ in range(2))
    img = Image.fromarray(background(h, w, rng))
    mask = Image.new("L", (w, h), 0)
    draw_img, draw_mask = ImageDraw.Draw(img), ImageDraw.Draw(mask)
    for _ in range(int(rng.integers(1, 5))):
        cls = int(rng.integers(1, nc))
        kind = int(rng.integers(0, len(CLASSES)))
        box = _shape_box(h, w, 0.15, 0.45, rng)
        jitter = rng.integers(-15, 16, 3)
        colour = tuple(int(v) for v in np.clip(np.array(SEGMENTATION_COLOURS[cls - 1][1]) + jitter, 0, 255))
        draw_shape(draw_img, kind, box, colour)
        draw_shape(draw_mask, kind, box, cls)  # the same pixels: later shapes cover earlier ones in both
    ids = np.asarray(mask).copy()
    edge = np.zeros(ids.shape, bool)
    edge[:, :-1] |= ids[:, :-1] != ids[:, 1:]
    edge[:-1] |= ids[:-1] != ids[1:]
    ids[edge] = _IGNORE
    return img, Image.fromarray(ids)


def make_segmentation_dataset(root: str | Path, *, n_train: int = 16, n_val: int = 4, imgsz: int = 128,
                              nc: int = 3, seed: int = 0) -> Path:
    """Write a semantic-segmentation shapes dataset under ``root``; return its ``data.yaml``.

    Layout: ``images/{train,val}/*.jpg``, ``masks/{train,val}/*.png`` (same stems), ``data.yaml``
    with ``names`` ``background`` then colour names. The same arguments always give the same files.
    """
    if not 2 <= nc <= len(SEGMENTATION_COLOURS) + 1:
        raise ValueError(f"nc must be 2..{len(SEGMENTATION_COLOURS) + 1} (background + shape colours), got {nc}")
    if n_train < 1 or n_val < 1 or imgsz < 16:
        raise ValueError(f"need n_train >= 1, n_val >= 1 and imgsz >= 16, got {n_train}, {n_val}, {imgsz}")
    root = Path(root)
    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("val", n_val)):
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "masks" / split).mkdir(parents=True, exist_ok=True)
        for k in range(n):
            img, mask = _segmentation_sample(imgsz, nc, rng)
            stem = f"{split}_{k:05d}"
            img.save(root / "images" / split / f"{stem}.jpg", quality=95)
            mask.save(root / "masks" / split / f"{stem}.png")
    names = ["background", *(name for name, _ in SEGMENTATION_COLOURS[:nc - 1])]
    data_yaml = root / "data.yaml"
    listed = "\n".join(f"  {i}: {name}" for i, name in enumerate(names))
    data_yaml.write_text(f"# synthetic semantic-segmentation shapes (libreyolo.train.shapes, seed {seed})\n"
                         f"path: .\ntrain: images/train\nval: images/val\nmasks_dir: masks\nnames:\n{listed}\n")
    return data_yaml


def _restore_sample(size: int, rng: np.random.Generator) -> Image.Image:
    """A smooth two-colour gradient at a random angle with 2-4 solid shapes of sharp edges on it."""
    t = np.linspace(0.0, 1.0, size, dtype=np.float64)
    angle = rng.uniform(0.0, np.pi)
    ramp = np.cos(angle) * t[None, :] + np.sin(angle) * t[:, None]
    ramp = (ramp - ramp.min()) / max(1e-9, float(np.ptp(ramp)))
    a, b = rng.uniform(20, 235, size=3), rng.uniform(20, 235, size=3)
    img = Image.fromarray(np.clip(a + (b - a) * ramp[..., None], 0, 255).round().astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(2, 5))):
        side = int(rng.integers(size // 6, size // 2))
        x1, y1 = (int(v) for v in rng.integers(0, size - side, size=2))
        draw_shape(draw, int(rng.integers(0, len(CLASSES))), (x1, y1, x1 + side, y1 + side), bright_colour(rng))
    return img


def make_restore_dataset(root: str | Path, *, n: int = 4, imgsz: int = 64, seed: int = 0) -> Path:
    """Write ``n`` high-resolution ``imgsz`` x ``imgsz`` PNGs (smooth gradients and sharp shapes) under
    ``root``; return the folder, what restoration val takes as ``data=``. Same arguments, same files."""
    from libreyolo.train.restore_data import min_side

    if n < 1 or imgsz < min_side(4, 4):
        raise ValueError(f"need n >= 1 and imgsz >= {min_side(4, 4)}, got {n}, {imgsz}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for k in range(n):
        _restore_sample(imgsz, rng).save(root / f"hr_{k:05d}.png")
    return root


def shapes_sequence(n_frames: int = 30, *, width: int = 160, height: int = 128, n_objects: int = 3, size: int = 36,
                    speed: float = 2.0, seed: int = 0) -> tuple[list[np.ndarray], list[list[tuple[int, int, tuple]]]]:
    """Frames of shapes moving across a fixed background, with known identities (tracking tests).

    ``n_objects`` shapes (classes in turn: square, circle, triangle) of ``size`` pixels, one per
    horizontal lane so they never overlap (no occlusion, no entry or exit), each moving at
    ``speed`` pixels a frame in a random direction and bouncing off the image's sides.
    Returns (RGB uint8 frames, per frame [(identity from 1, class, (x1, y1, x2, y2)), ...])."""
    rng = np.random.default_rng(seed)
    lane = height // n_objects
    if lane < size or width < size + 2:
        raise ValueError(f"{n_objects} shapes of {size} px do not fit a {width}x{height} frame without overlap")
    backdrop = background(height, width, rng)
    objs = []
    for k in range(n_objects):
        x = float(rng.uniform(0, width - size))
        y = float(k * lane + rng.uniform(0, lane - size))
        angle = rng.uniform(-0.5, 0.5) + (0 if rng.random() < 0.5 else np.pi)
        objs.append({"cls": k % len(CLASSES), "x": x, "y": y, "dx": speed * np.cos(angle), "dy": speed * np.sin(angle),
                     "lo": k * lane, "hi": (k + 1) * lane - size, "colour": bright_colour(rng)})
    frames: list[np.ndarray] = []
    truth: list[list[tuple[int, int, tuple]]] = []
    for _ in range(n_frames):
        img = Image.fromarray(backdrop)
        draw = ImageDraw.Draw(img)
        boxes = []
        for ident, o in enumerate(objs, 1):
            x1, y1 = round(o["x"]), round(o["y"])
            box = (x1, y1, x1 + size, y1 + size)
            draw_shape(draw, o["cls"], box, o["colour"])
            boxes.append((ident, o["cls"], box))
            o["x"] += o["dx"]
            o["y"] += o["dy"]
            if not 0 <= o["x"] <= width - size:
                o["dx"], o["x"] = -o["dx"], min(max(o["x"], 0), width - size)
            if not o["lo"] <= o["y"] <= o["hi"]:
                o["dy"], o["y"] = -o["dy"], min(max(o["y"], o["lo"]), o["hi"])
        frames.append(np.asarray(img))
        truth.append(boxes)
    return frames, truth
