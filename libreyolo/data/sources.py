"""Turn whatever the user passes to ``predict()`` into a list of images.

Accepted: a path (file or directory), a list of paths, a PIL image, a numpy array (HWC uint8,
BGR like OpenCV unless ``color_format="rgb"``; HW grayscale; 16-bit; float in [0, 1]), a torch
tensor (CHW or NCHW, float in [0, 1] or uint8, RGB), or a list of any of these (one batch).
Grayscale, RGBA, palette and 16-bit images are converted to 8-bit RGB, never refused.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from libreyolo.errors import ImageError

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".gif", ".ppm", ".pgm"}


@dataclass
class SourceImage:
    """One input image as the user gave it: ``pixels`` is HWC (arrays, files) or CHW (tensors),
    uint8 or float in [0, 1], RGB or BGR. Nothing is copied on the host: the pixels go to the
    device as they are and are reordered there (:meth:`to_device`)."""

    pixels: torch.Tensor
    path: str | None = None
    original: Any = None  # an RGB HWC array view for plotting, never copied
    hwc: bool = True
    bgr: bool = False

    def to_device(self, device: torch.device) -> torch.Tensor:
        """CHW RGB on ``device``: upload first (one transfer of the raw bytes), reorder there."""
        t = self.pixels.to(device, non_blocking=True)
        if self.hwc:
            t = t.permute(2, 0, 1)
        return t.flip(0) if self.bgr else t

    @property
    def data(self) -> torch.Tensor:
        """CHW RGB on the CPU (copies only for BGR input)."""
        return self.to_device(self.pixels.device)


def _pil_to_rgb_array(img: Any, where: str) -> np.ndarray:
    from PIL import Image

    if img.width == 0 or img.height == 0:
        raise ImageError(f"{where}: the image has zero size ({img.width}x{img.height})")
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        arr = np.asarray(img, dtype=np.float64)
        peak = 65535.0 if arr.max(initial=0) > 255 else 255.0
        img = Image.fromarray(np.clip(arr / peak * 255.0 + 0.5, 0, 255).astype(np.uint8))
    if img.mode == "F":
        arr = np.asarray(img, dtype=np.float64)
        img = Image.fromarray(np.clip(arr * (255.0 if arr.max(initial=0) <= 1 else 1.0), 0, 255).astype(np.uint8))
    if img.mode != "RGB":
        img = img.convert("RGBA").convert("RGB") if img.mode in ("P", "LA", "PA") else img.convert("RGB")
    return np.asarray(img)


def _as_tensor(arr: np.ndarray) -> torch.Tensor:
    """The HWC array as a tensor without a copy (read-only arrays are never written through)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr)


def _read_file(path: Path) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    if not path.exists():
        raise ImageError(f"image not found: {path}")
    try:
        with Image.open(path) as img:
            img.load()
            return _pil_to_rgb_array(img, str(path))
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        if isinstance(exc, ImageError):
            raise
        raise ImageError(f"cannot read image {path}: the file is corrupt or not an image ({exc})") from None


def _array_to_rgb(arr: np.ndarray, color_format: str, where: str) -> tuple[np.ndarray, bool]:
    """(HWC 3-channel uint8 array, whether it is BGR); no copy for ordinary uint8 input."""
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.ndim != 3:
        raise ImageError(f"{where}: expected an HWC image array, got shape {arr.shape}")
    h, w, c = arr.shape
    if h == 0 or w == 0:
        raise ImageError(f"{where}: the image has zero size ({w}x{h})")
    if c not in (1, 3, 4):
        raise ImageError(f"{where}: expected 1, 3 or 4 channels (HWC), got shape {arr.shape}")
    if arr.dtype == np.uint16:
        arr = (arr.astype(np.float32) / 257.0 + 0.5).astype(np.uint8)
    elif arr.dtype.kind == "f":
        arr = (np.clip(arr, 0, 1) * 255.0 + 0.5).astype(np.uint8)
    elif arr.dtype != np.uint8:
        raise ImageError(f"{where}: unsupported array dtype {arr.dtype}; use uint8, uint16 or float in [0, 1]")
    if c == 1:
        return np.repeat(arr, 3, axis=2), False
    if c == 4:
        arr = np.ascontiguousarray(arr[:, :, :3])
    return arr, color_format == "bgr"


def _tensor_images(t: torch.Tensor, where: str) -> list[torch.Tensor]:
    if t.ndim == 3:
        t = t.unsqueeze(0)
    if t.ndim != 4 or t.shape[1] not in (1, 3):
        raise ImageError(f"{where}: expected a CHW or NCHW tensor with 1 or 3 channels, got shape {tuple(t.shape)}")
    if t.shape[-1] == 0 or t.shape[-2] == 0:
        raise ImageError(f"{where}: the image has zero size {tuple(t.shape)}")
    if t.is_floating_point():
        t = t.clamp(0, 1)
    elif t.dtype != torch.uint8:
        raise ImageError(f"{where}: tensor dtype {t.dtype} unsupported; use uint8 or float in [0, 1]")
    if t.shape[1] == 1:
        t = t.expand(-1, 3, -1, -1)
    return list(t.unbind(0))


def _expand_paths(item: str | Path) -> list[Path]:
    p = Path(item)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise ImageError(f"no images found in directory {p} (looked for {sorted(IMAGE_SUFFIXES)})")
        return files
    if not p.exists():
        raise ImageError(f"image not found: {p}")
    return [p]


def load_sources(source: Any, color_format: str = "bgr") -> list[SourceImage]:
    """Normalise ``source`` to a list of :class:`SourceImage` (CHW RGB tensors)."""
    if color_format not in ("bgr", "rgb"):
        raise ImageError(f"color_format must be 'bgr' or 'rgb', got {color_format!r}")
    if source is None:
        raise ImageError("no source given: pass an image path, directory, array, PIL image or tensor")
    items = list(source) if isinstance(source, (list, tuple)) else [source]
    if not items:
        raise ImageError("the source list is empty")
    out: list[SourceImage] = []
    for n, item in enumerate(items):
        where = f"source[{n}]" if len(items) > 1 else "source"
        if isinstance(item, (str, Path)):
            for path in _expand_paths(item):
                arr = _read_file(path)
                out.append(SourceImage(_as_tensor(arr), str(path), arr))
        elif isinstance(item, np.ndarray):
            arr, bgr = _array_to_rgb(item, color_format, where)
            if not arr.flags.c_contiguous:
                arr = np.ascontiguousarray(arr)
            out.append(SourceImage(_as_tensor(arr), None, arr[:, :, ::-1] if bgr else arr, bgr=bgr))
        elif isinstance(item, torch.Tensor):
            out.extend(SourceImage(t, None, None, hwc=False) for t in _tensor_images(item, where))
        elif hasattr(item, "mode") and hasattr(item, "convert"):  # PIL image, imported lazily
            arr = _pil_to_rgb_array(item, where)
            out.append(SourceImage(_as_tensor(arr), getattr(item, "filename", None) or None, arr))
        else:
            raise ImageError(
                f"{where}: unsupported input type {type(item).__name__}; pass a path, directory, "
                "numpy array, PIL image, torch tensor or a list of those"
            )
    return out
