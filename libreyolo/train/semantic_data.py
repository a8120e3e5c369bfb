"""Semantic-segmentation data: data YAML, mask checking, dataset, augmentation, collate.

Layout (the reference LibreYOLO's dense-mask layout)::

    dataset/
        data.yaml
        images/train/*.jpg      masks/train/*.png   # a mask per image, same stem
        images/val/*.jpg        masks/val/*.png

The YAML has detection's keys, resolved exactly as :func:`libreyolo.train.data.load_data_yaml`
does: ``path`` (the root, relative to the YAML's folder when relative), ``train`` and ``val`` (a
folder of images, a ``.txt`` list of image paths, or a list of those) and ``names`` (a list or
``{id: name}``). ``masks_dir`` (optional, default ``masks``) names the mask folder.

An image's mask is found by replacing the last ``images`` folder of the image's path by
``masks_dir`` and the suffix by ``.png`` (or another lossless suffix, :data:`MASK_SUFFIXES`). It
is a single-channel image of class ids: PNG mode ``L`` or ``P`` (palette indices, the usual
encoding of class maps), ``I;16``/``I`` for more than 255 classes, or ``1``. Values ``0..nc-1``
are classes and ``255`` (:data:`IGNORE_INDEX`) marks pixels left out of the loss and the metrics.
The mask has the size of the upright image.

Masks are checked once, when a dataset is built, in threads like :func:`~libreyolo.train.labels.scan_images`: an image
without a mask, with an unreadable or multi-channel mask, or with one of another size is skipped
with one warning line naming the file; class ids outside ``0..nc-1`` (other than 255) are
reported once per file and read as ignore. At most ``_MAX_WARNINGS`` lines, then one summary.
"""
from __future__ import annotations

import dataclasses
import logging
import stat
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from libreyolo.data.sources import check_pixels, read_image_file
from libreyolo.errors import DatasetError, ImageError
from libreyolo.ops.letterbox import Letterbox
from libreyolo.train import augment as aug
from libreyolo.train.data import (
    DataConfig,
    _names_dict,
    _ReadsImages,
    _sample_rng,
    _to_chw,
    load_data_yaml,
)
from libreyolo.train.labels import _MAX_WARNINGS, _SCAN_THREADS, _check_image

LOGGER = logging.getLogger("libreyolo")
IGNORE_INDEX = 255
MASK_SUFFIXES = (".png", ".tif", ".tiff", ".bmp")  # lossless; the first one found is used
_INDEX_MODES = ("L", "P", "I", "I;16", "I;16L", "I;16B", "1")  # one channel of integers
_SHOWN_IDS = 8  # out-of-range ids listed per warning


# --- data YAML ------------------------------------------------------------------------------------
@dataclass
class SemanticDataConfig(DataConfig):
    """A :class:`DataConfig` with ``task="semantic"`` and the mask folder name."""

    masks_dir: str = "masks"


def load_semantic_yaml(path: str | Path) -> SemanticDataConfig:
    """Read a semantic data YAML (the keys of a detection YAML, plus optional ``masks_dir``).

    The masks are not checked here; :class:`SemanticDataset` does that."""
    import yaml

    cfg = load_data_yaml(path)
    raw = yaml.safe_load(cfg.yaml_path.read_text(encoding="utf-8"))
    masks_dir = raw.get("masks_dir", "masks")
    if not isinstance(masks_dir, str) or not masks_dir or "/" in masks_dir or "\\" in masks_dir:
        raise DatasetError(f"data YAML {cfg.yaml_path}: 'masks_dir' must be a folder name such as 'masks' "
                           f"(it replaces the 'images' folder in each image's path), got {masks_dir!r}")
    base = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(DataConfig)}
    return SemanticDataConfig(**{**base, "task": "semantic"}, masks_dir=masks_dir)


# --- masks ----------------------------------------------------------------------------------------
def mask_path(image: str | Path, masks_dir: str = "masks") -> Path | None:
    """The mask file of ``image``: ``.../masks/<stem>.png`` for ``.../images/<stem>.jpg`` (the
    first of :data:`MASK_SUFFIXES` that exists, else ``.png``); None when no folder is named ``images``."""
    parts = Path(image).parts
    if "images" not in parts[:-1]:
        return None
    k = len(parts) - 2 - parts[-2::-1].index("images")
    base = Path(*parts[:k], masks_dir, *parts[k + 1:])
    for suffix in MASK_SUFFIXES:
        if base.with_suffix(suffix).is_file():
            return base.with_suffix(suffix)
    return base.with_suffix(".png")


def read_mask_file(path: str | Path) -> np.ndarray:
    """Decode a mask to an ``(h, w)`` int64 array of its stored values, or raise :class:`ImageError`
    saying why it is not a usable mask (missing, empty, corrupt, several channels, floating point)."""
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ImageError(f"{path}: mask file not found") from None
    except OSError as exc:
        raise ImageError(f"{path}: mask cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ImageError(f"{path}: the mask path is a folder or not a regular file, not a mask")
    if st.st_size == 0:
        raise ImageError(f"{path}: mask file is empty (0 bytes)")
    try:
        with Image.open(path) as img:
            check_pixels(img.width, img.height, str(path))
            mode, bands = img.mode, img.getbands()
            if mode in _INDEX_MODES:
                img.load()
                return np.asarray(img).astype(np.int64)
            if mode == "F":
                raise ImageError(f"{path}: mask holds floating-point values (mode F); a mask must hold integer "
                                 f"class ids (a mode L or P PNG, {IGNORE_INDEX} = ignore)")
            hint = ""
            if len(bands) > 1:
                arr = np.asarray(img.convert("RGB"))
                hint = ("; its channels are all equal: save it as a one-channel (mode L) PNG" if
                        (arr == arr[..., :1]).all() else
                        "; a colour-coded mask must first be converted to class ids (one channel)")
            raise ImageError(f"{path}: mask has {len(bands)} channels (mode {mode}); a mask must be one channel of "
                             f"class ids (a mode L or P PNG, {IGNORE_INDEX} = ignore){hint}")
    except ImageError:
        raise
    except Exception as exc:  # Pillow raises many types for broken files
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ImageError(f"{path}: mask cannot be read: the file is corrupt or not an image ({text})") from None


def _out_of_range(mask: np.ndarray, nc: int) -> np.ndarray:
    """Where ``mask`` holds neither a class id ``0..nc-1`` nor the ignore value."""
    return ((mask < 0) | (mask >= nc)) & (mask != IGNORE_INDEX)


def _ids_text(ids: Sequence[int]) -> str:
    shown = ", ".join(str(i) for i in ids[:_SHOWN_IDS])
    return shown + (f", ... ({len(ids)} ids)" if len(ids) > _SHOWN_IDS else "")


@dataclass
class _MaskScanned:
    path: Path
    mask: Path | None = None
    shape: tuple[int, int] | None = None  # (h, w) upright; None: image skipped
    bad_ids: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _scan_pair(image: Path, nc: int, masks_dir: str) -> _MaskScanned:
    result = _MaskScanned(image)
    try:
        shape = _check_image(image)
    except ImageError as exc:
        result.warnings.append(f"{exc}: image skipped")
        return result
    mask_file = mask_path(image, masks_dir)
    if mask_file is None:
        result.warnings.append(f"{image}: no folder named 'images' in the image's path, so its mask cannot be found "
                               f"(masks live in a '{masks_dir}' folder that mirrors 'images'): image skipped")
        return result
    result.mask = mask_file
    try:
        mask = read_mask_file(mask_file)
    except ImageError as exc:
        result.warnings.append(f"{exc}: image {image.name} skipped")
        return result
    if mask.shape != shape:
        (mh, mw), (h, w) = mask.shape, shape
        result.warnings.append(f"{mask_file}: mask is {mw}x{mh} (w x h) but its image {image.name} is {w}x{h}: "
                               "image skipped")
        return result
    bad = _out_of_range(mask, nc)
    if bad.any():
        result.bad_ids = np.unique(mask[bad]).tolist()
        result.warnings.append(f"{mask_file}: class ids {_ids_text(result.bad_ids)} outside 0..{nc - 1} "
                               f"({int(bad.sum())} pixels): treated as ignore ({IGNORE_INDEX})")
    result.shape = shape
    return result


def scan_masks(files: Sequence[str | Path], nc: int, masks_dir: str = "masks",
               prefix: str = "") -> list[_MaskScanned]:
    """Check every image and its mask; log the problems, one warning line each (at most
    ``_MAX_WARNINGS``), then one summary line. Returns the usable images, in the order given."""
    files = [Path(f) for f in files]
    if not files:
        raise DatasetError(f"{prefix}no image files given")
    with ThreadPoolExecutor(_SCAN_THREADS) as pool:
        results = list(pool.map(lambda f: _scan_pair(f, nc, masks_dir), files))
    lines = [w for r in results for w in r.warnings]
    for line in lines[:_MAX_WARNINGS]:
        LOGGER.warning(f"{prefix}{line}")
    if len(lines) > _MAX_WARNINGS:
        LOGGER.warning(f"{prefix}{len(lines) - _MAX_WARNINGS} more dataset warnings not shown")
    kept = [r for r in results if r.shape is not None]
    LOGGER.info(f"{prefix}{len(results)} images: {len(kept)} usable, {len(results) - len(kept)} skipped (unreadable "
                f"image, missing, unreadable, multi-channel or wrongly sized mask), "
                f"{sum(bool(r.bad_ids) for r in kept)} masks with out-of-range class ids read as ignore")
    if not kept:
        example = next((r.mask for r in results if r.mask is not None), files[0])
        raise DatasetError(f"{prefix}none of the {len(results)} images has a usable mask (e.g. {example}); "
                           f"see the warnings above. Masks are one-channel PNGs of class ids in a '{masks_dir}' "
                           "folder that mirrors 'images'")
    return kept


# --- augmentation ---------------------------------------------------------------------------------
@dataclass
class SemanticAugment:
    """Training sampling of the SegFormer (mmsegmentation ADE20K) recipe.

    The image is resized (bilinear; the mask nearest) so that its short side is ``imgsz * s``,
    ``s`` drawn uniformly from ``scale``; an ``imgsz`` square is cropped at random, drawn again
    (up to 10 times) while one class covers more than ``cat_max_ratio`` of its labelled pixels
    (1.0: never); flipped left-right with probability ``fliplr``; colour-jittered by
    :func:`libreyolo.train.augment.hsv_jitter` with ``hsv_*`` (off by default, as in the recipe);
    padded bottom/right to the square (grey image, ignored mask).
    """

    scale: tuple[float, float] = (0.5, 2.0)
    cat_max_ratio: float = 0.75
    fliplr: float = 0.5
    hsv_h: float = 0.0
    hsv_s: float = 0.0
    hsv_v: float = 0.0

    def __post_init__(self) -> None:
        lo, hi = self.scale
        if not 0 < lo <= hi:
            raise ValueError(f"SemanticAugment.scale must be (low, high) with 0 < low <= high, got {self.scale}")
        if not 0 < self.cat_max_ratio <= 1:
            raise ValueError(f"SemanticAugment.cat_max_ratio must be in (0, 1], got {self.cat_max_ratio}")
        if not 0 <= self.fliplr <= 1:
            raise ValueError(f"SemanticAugment.fliplr is a probability in [0, 1], got {self.fliplr}")
        for name in ("hsv_h", "hsv_s", "hsv_v"):
            if getattr(self, name) < 0:
                raise ValueError(f"SemanticAugment.{name} must be >= 0, got {getattr(self, name)}")


def resize_nearest(mask: np.ndarray, new_h: int, new_w: int) -> np.ndarray:
    """Nearest-neighbour resize with half-pixel centres, the geometry of the bilinear image resize
    (torch's ``nearest-exact``): output pixel ``i`` takes source pixel ``floor((i + 0.5) * h / new_h)``."""
    h, w = mask.shape[:2]
    if (new_h, new_w) == (h, w):
        return mask
    rows = np.minimum(((np.arange(new_h) + 0.5) * (h / new_h)).astype(np.int64), h - 1)
    cols = np.minimum(((np.arange(new_w) + 0.5) * (w / new_w)).astype(np.int64), w - 1)
    return mask[rows[:, None], cols[None, :]]


def _crop_origin(mask: np.ndarray, size: int, cat_max_ratio: float, rng: np.random.Generator) -> tuple[int, int]:
    """(top, left) of a random ``size`` crop; redrawn while one class dominates (the last draw stands)."""
    h, w = mask.shape
    top = left = 0
    for _ in range(10):
        top, left = int(rng.integers(0, max(h - size, 0) + 1)), int(rng.integers(0, max(w - size, 0) + 1))
        if cat_max_ratio >= 1.0:
            break
        labels = mask[top:top + size, left:left + size]
        labels = labels[labels != IGNORE_INDEX]
        if labels.size == 0 or np.bincount(labels.ravel()).max() <= cat_max_ratio * labels.size:
            break
    return top, left


# --- dataset --------------------------------------------------------------------------------------
class SemanticDataset(_ReadsImages):
    """Images and class-id masks for a semantic-segmentation model.

    ``dataset[i]`` is ``(image, mask, info)``: a uint8 ``(3, S, S)`` RGB tensor, an int64 ``(S, S)``
    mask (``255`` = ignore) and a dict with ``path`` and ``orig_shape`` ``(h, w)``.

    Without ``augment`` the image is letterboxed as prediction does (``letterbox``; by default
    SegFormer's top-left, floor-rounded :class:`Letterbox` with grey 114 padding) and the mask is
    resized nearest to the same size and padded with 255; ``info`` also has ``ratio``, ``pad``
    ``(left, top)`` and ``mask_orig``, the mask at the original resolution (int64 ``(h, w)``) for
    scoring on the original canvas. Only the letterbox's geometry, resize and padding are used:
    the image stays RGB uint8 0..255 whatever its ``channels`` and ``divisor``.

    With ``augment``: :class:`SemanticAugment`; ``info`` has ``ratio``, ``crop`` ``(left, top)``
    in the resized image, and ``flipped``. Random draws come from torch's RNG (seeded per
    DataLoader worker by :func:`libreyolo.train.data.build_dataloader`).
    """

    def __init__(self, files: Sequence[str | Path], names: dict[int, str] | Sequence[str], imgsz: int,
                 augment: bool, hyp: SemanticAugment | None = None, letterbox: Letterbox | None = None, *,
                 masks_dir: str = "masks", prefix: str = "") -> None:
        if int(imgsz) < 8:
            raise ValueError(f"imgsz must be at least 8 pixels, got {imgsz}")
        self.names = _names_dict(names)
        self.nc = len(self.names)
        if self.nc < 1:
            raise ValueError("names is empty; a semantic dataset needs at least one class")
        self.imgsz = int(imgsz)
        self.augment = bool(augment)
        self.hyp = hyp if hyp is not None else SemanticAugment()
        if letterbox is None:
            letterbox = Letterbox(self.imgsz, pad_value=float(aug.PAD_VALUE), placement="topleft",
                                  size_rounding="floor")
        if letterbox.size != self.imgsz:
            raise ValueError(f"the letterbox is for {letterbox.size}-pixel inputs but imgsz is {self.imgsz}")
        self._letterbox = dataclasses.replace(letterbox, channels="RGB", divisor=1.0)  # uint8 RGB out
        self.masks_dir = masks_dir
        scanned = scan_masks(files, self.nc, masks_dir, prefix)
        self.files = [r.path for r in scanned]
        self.mask_files = [r.mask for r in scanned]
        self.shapes = [r.shape for r in scanned]
        self._unreadable: set[int] = set()

    def _load_mask(self, j: int, shape: tuple[int, int]) -> np.ndarray:
        mask = read_mask_file(self.mask_files[j])
        if mask.shape != shape:
            raise ImageError(f"{self.mask_files[j]}: mask is {mask.shape[1]}x{mask.shape[0]} (w x h) but its "
                             f"image is {shape[1]}x{shape[0]}")
        mask[_out_of_range(mask, self.nc)] = IGNORE_INDEX
        return mask

    def _read_pair(self, i: int) -> tuple[int, np.ndarray, np.ndarray]:
        """Image ``i`` and its mask; a pair that fails now (changed since the scan) is replaced by
        the next readable one, with one warning."""
        n = len(self.files)
        for step in range(n):
            j = (i + step) % n
            try:
                arr = read_image_file(self.files[j])
                return j, arr, self._load_mask(j, arr.shape[:2])
            except ImageError as exc:
                if j not in self._unreadable:
                    self._unreadable.add(j)
                    LOGGER.warning(f"{exc}; using another image in its place")
        raise DatasetError(f"none of the {n} images and masks can be read any more (e.g. {self.files[i]})")

    def _letterboxed(self, j: int, arr: np.ndarray, mask: np.ndarray
                     ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        h, w = arr.shape[:2]
        batch, metas = self._letterbox([_to_chw(arr)], dtype=torch.uint8)
        _, new_h, new_w, top, left = self._letterbox.geometry(h, w)
        canvas = torch.full((self.imgsz, self.imgsz), IGNORE_INDEX, dtype=torch.int64)
        canvas[top:top + new_h, left:left + new_w] = torch.from_numpy(resize_nearest(mask, new_h, new_w))
        info = {"path": str(self.files[j]), "orig_shape": (h, w), "ratio": metas[0].ratio, "pad": metas[0].pad,
                "mask_orig": torch.from_numpy(mask)}
        return batch[0], canvas, info

    def _augmented(self, j: int, arr: np.ndarray, mask: np.ndarray
                   ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        hyp, size = self.hyp, self.imgsz
        rng = _sample_rng()
        h, w = arr.shape[:2]
        ratio = size / min(h, w) * float(rng.uniform(*hyp.scale))
        new_h, new_w = max(1, round(h * ratio)), max(1, round(w * ratio))
        if (new_h, new_w) != (h, w):
            cv2 = aug._cv2()
            arr = cv2.resize(arr, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
            mask = resize_nearest(mask, new_h, new_w)
        top, left = _crop_origin(mask, size, hyp.cat_max_ratio, rng)
        arr, mask = arr[top:top + size, left:left + size], mask[top:top + size, left:left + size]
        flipped = bool(rng.random() < hyp.fliplr)
        if flipped:
            arr, mask = arr[:, ::-1], mask[:, ::-1]
        arr = aug.hsv_jitter(np.ascontiguousarray(arr), hyp.hsv_h, hyp.hsv_s, hyp.hsv_v, rng)
        ch, cw = mask.shape
        image = np.full((size, size, 3), int(self._letterbox.pad_value), np.uint8)
        image[:ch, :cw] = arr
        target = np.full((size, size), IGNORE_INDEX, np.int64)
        target[:ch, :cw] = mask
        info = {"path": str(self.files[j]), "orig_shape": (h, w), "ratio": ratio, "crop": (left, top),
                "flipped": flipped}
        return _to_chw(image), torch.from_numpy(target), info

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        j, arr, mask = self._read_pair(i)
        return self._augmented(j, arr, mask) if self.augment else self._letterboxed(j, arr, mask)


def collate_semantic(batch: Sequence[tuple[torch.Tensor, torch.Tensor, dict]]
                     ) -> tuple[torch.Tensor, torch.Tensor, list[dict]]:
    """``(images uint8 (B, 3, S, S), masks int64 (B, S, S), infos)``."""
    return torch.stack([b[0] for b in batch]), torch.stack([b[1] for b in batch]), [b[2] for b in batch]


def build_semantic_dataset(cfg: DataConfig, split: str, imgsz: int, augment: bool,
                           hyp: SemanticAugment | None = None, letterbox: Letterbox | None = None
                           ) -> SemanticDataset:
    """The :class:`SemanticDataset` of ``split`` (``"train"`` or ``"val"``) of a loaded config."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    return SemanticDataset(getattr(cfg, split), cfg.names, imgsz, augment, hyp, letterbox,
                           masks_dir=getattr(cfg, "masks_dir", "masks"), prefix=f"{split}: ")


__all__ = ["IGNORE_INDEX", "MASK_SUFFIXES", "SemanticAugment", "SemanticDataConfig", "SemanticDataset",
           "build_semantic_dataset", "collate_semantic", "load_semantic_yaml", "mask_path", "read_mask_file",
           "resize_nearest", "scan_masks"]
