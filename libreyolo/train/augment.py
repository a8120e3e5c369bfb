"""Training augmentations for detection and classification.

Detection follows the Ultralytics recipe: a 4-image mosaic on a 2S x 2S canvas, a random affine
warp (scale, translation, optional rotation and shear) down to the S x S training image, HSV
colour jitter and flips. Boxes are ``(n, 5)`` float32 arrays ``[cls, x1, y1, x2, y2]`` in pixels of
the image they travel with, transformed with the same matrix as the pixels, clipped, and dropped
when the transform leaves too little of them.

Detection images are HWC uint8 RGB numpy arrays, resized, warped and colour-jittered with OpenCV
(``opencv-python-headless``, in the ``train`` extra: about 5x faster per sample than the same steps
in Pillow, which kept the loader behind a CUDA-graph training step). Classification uses Pillow.

Coordinates are continuous, with pixel ``(i, j)`` covering ``[j, j + 1) x [i, i + 1)``; a matrix
in these coordinates is shifted by half a pixel before OpenCV applies it (OpenCV puts pixel
centres on integers), so the box corners mapped by the matrix land exactly where the warped
pixels do.

Every random draw comes from a ``numpy.random.Generator`` passed in, in a fixed order, so a seeded
generator gives identical results on every machine and in every DataLoader worker.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

PAD_VALUE = 114  # the grey of letterbox and mosaic padding (Ultralytics' value)
_FILL = (PAD_VALUE, PAD_VALUE, PAD_VALUE)


@dataclass
class AugmentConfig:
    """Detection augmentation settings (Ultralytics hyperparameter names and defaults).

    ``mosaic`` is the probability of a 4-image mosaic; it is switched off for the last
    ``close_mosaic`` epochs (:meth:`DetectionDataset.set_epoch`) so the model finishes on images
    that look like validation images. ``degrees``/``shear`` are in degrees, ``translate`` a fraction
    of the output size, ``scale`` the +- range of the zoom factor, ``hsv_*`` the +- fractions of
    hue (of the full circle), saturation and value, ``fliplr``/``flipud`` flip probabilities.
    """

    mosaic: float = 1.0
    close_mosaic: int = 10
    degrees: float = 0.0
    translate: float = 0.1
    scale: float = 0.5
    shear: float = 0.0
    fliplr: float = 0.5
    flipud: float = 0.0
    hsv_h: float = 0.015
    hsv_s: float = 0.7
    hsv_v: float = 0.4
    min_box_size: float = 2.0     # boxes narrower or lower than this many pixels after a warp are dropped
    min_area_ratio: float = 0.1   # ... and those that keep less than this share of their warped area

    def __post_init__(self) -> None:
        for name in ("mosaic", "fliplr", "flipud"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"AugmentConfig.{name} is a probability in [0, 1], got {value}")
        for name in ("degrees", "translate", "scale", "shear", "hsv_h", "hsv_s", "hsv_v", "close_mosaic"):
            if getattr(self, name) < 0:
                raise ValueError(f"AugmentConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.scale >= 1.0:
            raise ValueError(f"AugmentConfig.scale must be < 1 (the zoom is 1 +- scale), got {self.scale}")


# --- geometry -------------------------------------------------------------------------------------
def _cv2():
    from libreyolo.errors import require

    return require("cv2", "train", "detection training augmentation")


def resize_long_side(arr: np.ndarray, size: int) -> tuple[np.ndarray, float]:
    """An HWC image resized (bilinear, keeping the aspect ratio) so that its longer side is ``size``."""
    h, w = arr.shape[:2]
    ratio = size / max(w, h)
    if ratio == 1.0:
        return arr, 1.0
    new_w, new_h = max(1, round(w * ratio)), max(1, round(h * ratio))
    cv2 = _cv2()
    return cv2.resize(arr, (new_w, new_h), interpolation=cv2.INTER_LINEAR), ratio


def mosaic4(tiles: list[tuple[np.ndarray, np.ndarray]], size: int,
            rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Four (HWC image, pixel boxes) tiles, each at most ``size`` on its long side, around a random
    centre of a ``2 * size`` grey canvas: top-left, top-right, bottom-left, bottom-right.

    Each tile touches the centre with one corner and is cut at the canvas edge; its boxes are
    shifted with it and clipped to the canvas (the affine warp that follows filters slivers).
    """
    if len(tiles) != 4:
        raise ValueError(f"mosaic4 needs 4 tiles, got {len(tiles)}")
    canvas_side = 2 * size
    xc = int(rng.uniform(size / 2, 3 * size / 2))
    yc = int(rng.uniform(size / 2, 3 * size / 2))
    canvas = np.full((canvas_side, canvas_side, 3), PAD_VALUE, np.uint8)
    out_boxes = []
    for k, (img, boxes) in enumerate(tiles):
        h, w = img.shape[:2]
        # where the tile goes on the canvas (a) and which part of the tile that is (b)
        if k == 0:
            x1a, y1a, x2a, y2a = max(xc - w, 0), max(yc - h, 0), xc, yc
            x1b, y1b = w - (x2a - x1a), h - (y2a - y1a)
        elif k == 1:
            x1a, y1a, x2a, y2a = xc, max(yc - h, 0), min(xc + w, canvas_side), yc
            x1b, y1b = 0, h - (y2a - y1a)
        elif k == 2:
            x1a, y1a, x2a, y2a = max(xc - w, 0), yc, xc, min(yc + h, canvas_side)
            x1b, y1b = w - (x2a - x1a), 0
        else:
            x1a, y1a, x2a, y2a = xc, yc, min(xc + w, canvas_side), min(yc + h, canvas_side)
            x1b, y1b = 0, 0
        if x2a > x1a and y2a > y1a:
            canvas[y1a:y2a, x1a:x2a] = img[y1b:y1b + (y2a - y1a), x1b:x1b + (x2a - x1a)]
        if len(boxes):
            shifted = boxes.copy()
            shifted[:, [1, 3]] += x1a - x1b
            shifted[:, [2, 4]] += y1a - y1b
            out_boxes.append(shifted)
    boxes = np.concatenate(out_boxes) if out_boxes else np.zeros((0, 5), np.float32)
    boxes[:, 1:] = boxes[:, 1:].clip(0, canvas_side)
    return canvas, boxes.astype(np.float32)


def _affine_matrix(in_size: tuple[int, int], out_size: tuple[int, int], cfg: AugmentConfig,
                   rng: np.random.Generator) -> np.ndarray:
    """3x3 matrix: centre the input on the origin, rotate and zoom, shear, move to a random spot
    around the output's centre. Every number is drawn, even for zero ranges, so the stream of
    draws does not depend on the settings."""
    in_w, in_h = in_size
    out_w, out_h = out_size
    centre = np.eye(3)
    centre[0, 2], centre[1, 2] = -in_w / 2, -in_h / 2
    angle = math.radians(rng.uniform(-cfg.degrees, cfg.degrees))
    zoom = rng.uniform(1 - cfg.scale, 1 + cfg.scale)
    rotate = np.eye(3)
    rotate[:2, :2] = zoom * np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    shear = np.eye(3)
    shear[0, 1] = math.tan(math.radians(rng.uniform(-cfg.shear, cfg.shear)))
    shear[1, 0] = math.tan(math.radians(rng.uniform(-cfg.shear, cfg.shear)))
    move = np.eye(3)
    move[0, 2] = rng.uniform(0.5 - cfg.translate, 0.5 + cfg.translate) * out_w
    move[1, 2] = rng.uniform(0.5 - cfg.translate, 0.5 + cfg.translate) * out_h
    return move @ shear @ rotate @ centre


def transform_boxes(boxes: np.ndarray, matrix: np.ndarray, out_size: tuple[int, int], *,
                    min_size: float = 2.0, min_area_ratio: float = 0.1,
                    max_aspect: float = 100.0) -> np.ndarray:
    """Map pixel boxes through a 3x3 affine ``matrix``: the envelope of the four mapped corners,
    clipped to ``out_size``; drops boxes thinner than ``min_size`` pixels, keeping less than
    ``min_area_ratio`` of their mapped area after clipping, or longer than ``max_aspect`` : 1."""
    if not len(boxes):
        return boxes.reshape(0, 5).astype(np.float32)
    x1, y1, x2, y2 = boxes[:, 1], boxes[:, 2], boxes[:, 3], boxes[:, 4]
    corners = np.stack([np.stack([x1, y1], 1), np.stack([x2, y1], 1),
                        np.stack([x1, y2], 1), np.stack([x2, y2], 1)], 1)  # (n, 4, 2)
    mapped = corners @ matrix[:2, :2].T + matrix[:2, 2]
    lo, hi = mapped.min(1), mapped.max(1)
    mapped_area = (hi - lo).prod(1)
    out_w, out_h = out_size
    limit = np.array([out_w, out_h], dtype=np.float64)
    lo, hi = lo.clip(0, limit), hi.clip(0, limit)
    wh = hi - lo
    keep = (wh[:, 0] >= min_size) & (wh[:, 1] >= min_size)
    keep &= wh.prod(1) >= min_area_ratio * mapped_area
    keep &= np.maximum(wh[:, 0] / np.maximum(wh[:, 1], 1e-9), wh[:, 1] / np.maximum(wh[:, 0], 1e-9)) < max_aspect
    out = np.concatenate([boxes[:, :1], lo, hi], 1)[keep]
    return out.astype(np.float32)


def random_affine(img: np.ndarray, boxes: np.ndarray, out_size: tuple[int, int], cfg: AugmentConfig,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Warp an HWC image (centred) into an ``out_size`` ``(w, h)`` image with a random zoom, shift,
    rotation and shear (grey fill), and its boxes with it (see :func:`transform_boxes`).

    An input larger than the output (a 2S mosaic into S) is cropped around a random point near
    its centre; a smaller one (an image resized to S on its long side) is letterboxed by the warp.
    """
    h, w = img.shape[:2]
    matrix = _affine_matrix((w, h), out_size, cfg, rng)
    half = np.eye(3)
    half[:2, 2] = 0.5
    pixel_centres = np.linalg.inv(half) @ matrix @ half  # OpenCV samples at integer pixel centres
    cv2 = _cv2()
    warped = cv2.warpAffine(img, pixel_centres[:2], out_size, flags=cv2.INTER_LINEAR,
                            borderMode=cv2.BORDER_CONSTANT, borderValue=_FILL)
    return warped, transform_boxes(boxes, matrix, out_size, min_size=cfg.min_box_size,
                                   min_area_ratio=cfg.min_area_ratio)


# --- colour and flips -----------------------------------------------------------------------------
def hsv_jitter(img: np.ndarray, hgain: float, sgain: float, vgain: float,
               rng: np.random.Generator) -> np.ndarray:
    """Shift the hue of an HWC RGB image by up to ``hgain`` of the colour circle and scale
    saturation and value by ``1 +- sgain`` / ``1 +- vgain`` (one random draw each for the whole
    image), through lookup tables on OpenCV's 8-bit HSV (hue 0..179 around the circle). Returns
    ``img`` itself when every gain drawn is zero."""
    gains = rng.uniform(-1, 1, 3) * np.array([hgain, sgain, vgain])
    if not gains.any():
        return img
    cv2 = _cv2()
    x = np.arange(256, dtype=np.float64)
    lut_h = (np.rint(x + gains[0] * 180) % 180).astype(np.uint8)
    lut_s = np.rint(x * (1 + gains[1])).clip(0, 255).astype(np.uint8)
    lut_v = np.rint(x * (1 + gains[2])).clip(0, 255).astype(np.uint8)
    hue, sat, val = cv2.split(cv2.cvtColor(img, cv2.COLOR_RGB2HSV))
    hsv = cv2.merge((cv2.LUT(hue, lut_h), cv2.LUT(sat, lut_s), cv2.LUT(val, lut_v)))
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)


def flip_lr(arr: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mirror an HWC array left-right, and its pixel boxes."""
    w = arr.shape[1]
    boxes = boxes.copy()
    boxes[:, [1, 3]] = w - boxes[:, [3, 1]]
    return arr[:, ::-1], boxes


def flip_ud(arr: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mirror an HWC array top-bottom, and its pixel boxes."""
    h = arr.shape[0]
    boxes = boxes.copy()
    boxes[:, [2, 4]] = h - boxes[:, [4, 2]]
    return arr[::-1], boxes


# --- classification -------------------------------------------------------------------------------
def random_resized_crop(img: Image.Image, size: int, rng: np.random.Generator,
                        scale: tuple[float, float] = (0.35, 1.0),
                        ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> Image.Image:
    """A random crop covering ``scale`` of the image area with an aspect ratio in ``ratio``
    (log-uniform), resized to ``size x size`` (bilinear); after 10 failed draws, the largest
    central crop whose aspect ratio is within ``ratio``."""
    w, h = img.size
    area = w * h
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        cw, ch = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < cw <= w and 0 < ch <= h:
            left, top = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
            break
    else:
        aspect = w / h
        if aspect < ratio[0]:
            cw, ch = w, round(w / ratio[0])
        elif aspect > ratio[1]:
            cw, ch = round(h * ratio[1]), h
        else:
            cw, ch = w, h
        left, top = (w - cw) // 2, (h - ch) // 2
    return img.resize((size, size), Image.Resampling.BILINEAR, box=(left, top, left + cw, top + ch))


def resize_center_crop(img: Image.Image, size: int, crop_pct: float = 0.875) -> Image.Image:
    """The ImageNet evaluation recipe: shorter side to ``floor(size / crop_pct)`` (bicubic),
    then the central ``size x size`` square."""
    w, h = img.size
    short = math.floor(size / crop_pct)
    if w <= h:
        new_w, new_h = short, int(short * h / w)
    else:
        new_w, new_h = int(short * w / h), short
    img = img.resize((new_w, new_h), Image.Resampling.BICUBIC)
    left, top = int(round((new_w - size) / 2.0)), int(round((new_h - size) / 2.0))
    return img.crop((left, top, left + size, top + size))
