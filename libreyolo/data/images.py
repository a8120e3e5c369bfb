"""Image files and their decoding: the primitives :mod:`libreyolo.data.sources` (every input kind) and
:mod:`libreyolo.data.device_decode` (JPEGs decoded on the GPU) share. Files are opened without
blocking and checked to be regular files after opening; EXIF orientation is applied; an image over
the pixel limit is refused before it is decoded."""
from __future__ import annotations

import io
import os
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from libreyolo.errors import ImageError

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".gif", ".ppm", ".pgm"}

_VIRTUAL_ROOTS = ("/proc", "/sys")  # kernel files: "regular", size 0 or endless, never images
_EXIF_ORIENTATION = 0x0112


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
    from_file: bool = False  # decoded from ``path``: can be read again instead of kept in memory
    frame: int | None = None  # a video frame's index in its video (libreyolo.data.video)
    timestamp: float | None = None  # a video frame's presentation time, seconds

    def to_device(self, device: torch.device) -> torch.Tensor:
        """CHW RGB on ``device``: upload first (one transfer of the raw bytes), reorder there."""
        return self.orient(self.pixels.to(device, non_blocking=True))

    def orient(self, t: torch.Tensor) -> torch.Tensor:
        """``t``, a copy of :attr:`pixels` anywhere (e.g. a view of a batch's staging upload,
        :mod:`libreyolo.engine.stream`), as CHW RGB: the one reordering every upload path shares."""
        if self.hwc:
            t = t.permute(2, 0, 1)
        return t.flip(0) if self.bgr else t

    @property
    def data(self) -> torch.Tensor:
        """CHW RGB on the CPU (copies only for BGR input)."""
        return self.to_device(self.pixels.device)


# --- decoding ------------------------------------------------------------------------------------
def _upright(img: Any) -> Any:
    """The image turned as its EXIF orientation says (a new image), or ``img`` when upright already."""
    try:
        orientation = img.getexif().get(_EXIF_ORIENTATION, 1)
    except Exception:  # unreadable EXIF: the pixels are still fine
        return img
    if orientation not in range(2, 9):
        return img
    from PIL import ImageOps

    return ImageOps.exif_transpose(img)


def _pil_to_rgb_array(img: Any, where: str) -> np.ndarray:
    from PIL import Image

    if img.width == 0 or img.height == 0:
        raise ImageError(f"{where}: the image has zero size ({img.width}x{img.height})")
    img = _upright(img)
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        arr = np.asarray(img, dtype=np.float64)
        peak = 65535.0 if arr.max(initial=0) > 255 else 255.0
        img = Image.fromarray(np.clip(arr / peak * 255.0 + 0.5, 0, 255).astype(np.uint8))
    if img.mode == "F":  # a float file has no dtype to say its scale: [0, 1] or 0..255, finite, else refused
        arr = np.asarray(img, dtype=np.float64)
        lo, hi = float(arr.min()), float(arr.max())
        scale = 255.0 if hi <= 1 else 1.0
        check_float_range(lo * scale / 255.0, hi * scale / 255.0, where, arr)
        img = Image.fromarray((arr * scale + 0.5).astype(np.uint8))
    if img.mode != "RGB":
        img = img.convert("RGBA").convert("RGB") if img.mode in ("P", "LA", "PA") else img.convert("RGB")
    return np.asarray(img)


def _as_tensor(arr: np.ndarray) -> torch.Tensor:
    """The HWC array as a tensor without a copy (read-only arrays are never written through)."""
    if arr.flags.writeable:  # from_numpy warns only for read-only arrays; catch_warnings costs ~20 us
        return torch.from_numpy(arr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr)


def _not_regular(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file or a directory."""
    for test, what in ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else "not a regular file"


def _stat(path: Path) -> os.stat_result:
    """``os.stat`` with one-line errors (missing, permission, loops)."""
    try:
        return path.stat()
    except (FileNotFoundError, NotADirectoryError):
        raise ImageError(f"image not found: {path}") from None
    except PermissionError:
        raise ImageError(f"cannot read {path}: permission denied") from None
    except OSError as exc:
        raise ImageError(f"cannot read {path}: {exc.strerror or exc}") from None


def _check_file(path: Path, st: os.stat_result) -> None:
    """Refuse what is not an ordinary image file, before it is opened."""
    what = _not_regular(st.st_mode)
    if what is not None:
        raise ImageError(f"cannot read {path}: it is {what}, not a regular file; pass an image file")
    real = os.path.realpath(path)
    root = next((r for r in _VIRTUAL_ROOTS if real == r or real.startswith(r + "/")), None)
    if root is not None:
        raise ImageError(f"cannot read {path}: files under {root} are operating-system files, not images")
    if st.st_size == 0:
        raise ImageError(f"cannot read image {path}: the file is empty (0 bytes)")


def _open_file(path: Path) -> Any:
    """``path`` opened for reading (binary) after the checks of :func:`_check_file`, or :class:`ImageError`."""
    _check_file(path, _stat(path))
    try:  # non-blocking open: a file swapped for a FIFO after the check still cannot hang us
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ImageError(f"cannot read {path}: {exc.strerror or exc}") from None
    f = os.fdopen(fd, "rb")
    what = _not_regular(os.fstat(f.fileno()).st_mode)
    if what is not None:
        f.close()
        raise ImageError(f"cannot read {path}: it is {what}, not a regular file; pass an image file")
    return f


def read_image_file(path: str | Path) -> np.ndarray:
    """Decode one image file to an upright HWC uint8 RGB array, or raise :class:`ImageError`."""
    path = Path(path)
    with _open_file(path) as f:
        return _decode(f, str(path))


def read_image_bytes(data: bytes | bytearray | memoryview, where: str = "image") -> np.ndarray:
    """Decode an encoded image (JPEG, PNG, ... bytes) to an upright HWC uint8 RGB array, exactly as
    :func:`read_image_file` decodes the same bytes from a file, or raise :class:`ImageError`."""

    if len(data) == 0:
        raise ImageError(f"cannot read {where}: it is empty (0 bytes)")
    return _decode(io.BytesIO(data), where)


def _decode(f: Any, where: str) -> np.ndarray:
    from PIL import Image

    try:
        with warnings.catch_warnings():  # PIL's bomb warning: check_pixels refuses such an image itself
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(f)
        with img:
            check_pixels(img.width, img.height, where)  # before decoding: PIL itself refuses only above 2x
            img.load()
            return _pil_to_rgb_array(img, where)
    except ImageError:
        raise
    except Image.DecompressionBombError as exc:
        raise ImageError(
            f"refusing to decode {where}: {exc} If you trust this file, raise the limit first: "
            "PIL.Image.MAX_IMAGE_PIXELS = <pixels> (None disables it)"
        ) from None
    except Exception as exc:  # PIL raises many types for hostile or truncated files
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ImageError(f"cannot read image {where}: the file is corrupt or not an image ({text})") from None


def check_pixels(width: int, height: int, where: str, action: str = "decode") -> None:
    """Refuse an image larger than ``PIL.Image.MAX_IMAGE_PIXELS`` (a decompression bomb), before
    decoding a file; the same limit holds for arrays and tensors (``action="take"``)."""
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    if limit and width * height > limit:
        what = "a small file this large is a decompression bomb" if action == "decode" else "the limit of every input"
        raise ImageError(
            f"refusing to {action} {where}: {width}x{height} is {width * height:,} pixels, over the limit of "
            f"{limit:,} (PIL.Image.MAX_IMAGE_PIXELS; {what}). If you trust this "
            f"{'file' if action == 'decode' else 'image'}, raise the limit first: PIL.Image.MAX_IMAGE_PIXELS = "
            "<pixels> (None disables it)"
        )


def check_float_range(lo: float, hi: float, where: str, values: Any) -> None:
    """Float pixels must be finite and in [0, 1]; anything else is refused, never clipped (a
    0..255 float image clipped to [0, 1] is nearly white, and NaN would become 0 without a word)."""
    if lo >= 0.0 and hi <= 1.0:  # False for NaN
        return
    if not bool(values.isfinite().all() if isinstance(values, torch.Tensor) else np.isfinite(values).all()):
        raise ImageError(f"{where}: the float image holds NaN or Inf; pass finite pixels in [0, 1] (or uint8 0..255)")
    hint = ("it looks like 0..255 values: divide by 255 (or pass uint8)" if lo >= 0.0 and hi <= 255.0
            else "scale it to [0, 1] (or pass uint8 0..255)")
    raise ImageError(f"{where}: float pixels must be in [0, 1], got values from {lo:g} to {hi:g}; {hint}")
