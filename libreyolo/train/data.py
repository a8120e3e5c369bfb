"""Datasets for training and validation: data YAML files, datasets, loaders (the label checking
they start with: :mod:`libreyolo.train.labels`).

Detection data uses the Ultralytics layout: a YAML file with ``path`` (the dataset root, relative
to the YAML's folder when relative), ``train`` and ``val`` (each a folder of images, a ``.txt``
list of image paths, or a list of those) and ``names`` (a list or ``{id: name}``). Each image's
boxes are in a text file, one ``<cls> <cx> <cy> <w> <h>`` line per box, normalised to 0..1; the
file is found by replacing the last ``images`` folder of the image's path by ``labels`` and the
suffix by ``.txt``, or else beside the image. A missing or empty label file means a background
image (no objects).

Labels are checked once, when a dataset is built: every problem becomes one warning line naming
the file (the bad line is dropped, a box past the edge is clipped, an unreadable image is
skipped), and one summary line follows. Training never stops halfway through an epoch because
of a bad file.

Classification data is a folder tree ``root/train/<class>/*.jpg`` and ``root/val/<class>/*``
(or ``test``), class ids following the sorted class-folder names.
"""
from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from libreyolo.data.sources import IMAGE_SUFFIXES, read_image_file
from libreyolo.errors import DatasetError, ImageError
from libreyolo.ops.classify import IMAGENET_MEAN, IMAGENET_STD
from libreyolo.ops.letterbox import Letterbox
from libreyolo.train import augment as aug
from libreyolo.train.augment import AugmentConfig
from libreyolo.train.labels import scan_images

LOGGER = logging.getLogger("libreyolo")


# --- data YAML ------------------------------------------------------------------------------------
@dataclass
class DataConfig:
    """A dataset description: ``train``/``val`` are the image files of each split, in a fixed order.

    ``yaml_path`` is the YAML file it was read from (the root folder for a classification tree).
    """

    yaml_path: Path
    root: Path
    train: list[Path]
    val: list[Path]
    names: dict[int, str]
    nc: int
    task: str = "detect"

    def samples(self, split: str = "train") -> list[tuple[Path, int]]:
        """Classification: ``(image, class id)`` pairs of ``split``, the class from the class folder."""
        if self.task != "classify":
            raise DatasetError(f"samples() is for classification data; this dataset's task is {self.task!r}")
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        ids = {name: i for i, name in self.names.items()}
        return [(f, ids[f.relative_to(self.root).parts[1]]) for f in getattr(self, split)]


def _names_from(raw: dict[str, Any], where: str) -> dict[int, str]:
    names, nc = raw.get("names"), raw.get("nc")
    if names is None:
        if not isinstance(nc, int) or nc <= 0:
            raise DatasetError(f"{where}: missing key 'names' (a list of class names, or {{id: name}})")
        names = [f"class{i}" for i in range(nc)]
    if isinstance(names, list):
        result = {i: str(n) for i, n in enumerate(names)}
    elif isinstance(names, dict):
        try:
            result = {int(k): str(v) for k, v in names.items()}
        except (TypeError, ValueError):
            raise DatasetError(f"{where}: 'names' keys must be class ids 0, 1, ..., got {list(names)}") from None
        if sorted(result) != list(range(len(result))):
            raise DatasetError(f"{where}: 'names' ids must be 0..{len(result) - 1} without gaps, got {sorted(result)}")
        result = dict(sorted(result.items()))
    else:
        raise DatasetError(f"{where}: 'names' must be a list or a {{id: name}} mapping, got {type(names).__name__}")
    if not result:
        raise DatasetError(f"{where}: 'names' is empty; list the class names")
    if nc is not None and nc != len(result):
        raise DatasetError(f"{where}: 'nc' is {nc} but 'names' has {len(result)} classes; make them agree")
    return result


def images_in(folder: Path) -> list[Path]:
    """The image files under ``folder`` (recursively), sorted."""
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())


def list_images(spec: Any, root: Path, key: str, where: str) -> list[Path]:
    """The image files named by a ``train``/``val`` entry: folders (searched recursively), ``.txt``
    lists (relative lines are relative to the list's folder) and single images."""
    entries = spec if isinstance(spec, list) else [spec]
    files: list[Path] = []
    for entry in entries:
        path = Path(str(entry)).expanduser()
        path = path if path.is_absolute() else root / path
        if path.is_dir():
            files += images_in(path)
        elif path.is_file() and path.suffix.lower() == ".txt":
            lines = (line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines())
            for line in filter(None, lines):
                item = Path(line).expanduser()
                files.append(item if item.is_absolute() else path.parent / item)
        elif path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES:
            files.append(path)
        else:
            what = "is not a folder, a .txt list or an image" if path.exists() else "does not exist"
            raise DatasetError(f"{where}: '{key}' entry {str(entry)!r} resolves to {path}, which {what}")
    files = list(dict.fromkeys(files))
    if not files:
        raise DatasetError(f"{where}: no images found for '{key}' ({spec!r} under {root}); "
                           f"image suffixes looked for: {', '.join(sorted(IMAGE_SUFFIXES))}")
    return files


def load_data_yaml(path: str | Path) -> DataConfig:
    """Read a detection data YAML (Ultralytics keys ``path``, ``train``, ``val``, ``names``/``nc``)
    and list the images of each split. Raises :class:`DatasetError` saying what is wrong."""
    import yaml

    yaml_path = Path(path).expanduser().absolute()
    if yaml_path.is_dir():
        raise DatasetError(f"{yaml_path} is a folder; pass the dataset's .yaml file (or, for an image-folder "
                           "classification dataset, load it with load_classify_root)")
    if not yaml_path.is_file():
        raise DatasetError(f"data YAML not found: {yaml_path}; pass the path of a dataset .yaml file")
    try:
        raw = yaml.safe_load(yaml_path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        detail = " ".join(str(exc).split())
        raise DatasetError(f"data YAML {yaml_path} cannot be parsed: {detail}") from None
    where = f"data YAML {yaml_path}"
    if not isinstance(raw, dict):
        raise DatasetError(f"{where}: expected a mapping with keys path, train, val, names; got {type(raw).__name__}")
    missing = [k for k in ("train", "val") if raw.get(k) in (None, "", [])]
    if raw.get("names") is None and raw.get("nc") is None:
        missing.append("names")
    if missing:
        raise DatasetError(f"{where}: missing key(s) {', '.join(missing)} (needs train, val and names)")
    root = Path(str(raw["path"])).expanduser() if raw.get("path") not in (None, "") else Path(".")
    root = root if root.is_absolute() else yaml_path.parent / root
    if not root.is_dir():
        raise DatasetError(f"{where}: 'path' {raw.get('path')!r} resolves to {root}, which is not a folder")
    names = _names_from(raw, where)
    train = list_images(raw["train"], root, "train", where)
    val = list_images(raw["val"], root, "val", where)
    return DataConfig(yaml_path, root, train, val, names, len(names), "detect")


def load_classify_root(path: str | Path) -> DataConfig:
    """An image-folder classification dataset: ``root/train/<class>/*`` and ``root/val/<class>/*``
    (``test`` when there is no ``val``); names are the sorted class folders of ``train``."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise DatasetError(f"classification dataset folder not found: {root}")
    train_dir = root / "train"
    val_dir = next((root / d for d in ("val", "test") if (root / d).is_dir()), None)
    if not train_dir.is_dir() or val_dir is None:
        missing = [str(p) for p, ok in ((train_dir, train_dir.is_dir()), (root / "val", val_dir)) if not ok]
        raise DatasetError(f"classification dataset {root}: missing folder(s) {', '.join(missing)} "
                           "(expected train/<class>/ and val/<class>/ (or test/<class>/))")

    def classes(split_dir: Path) -> list[str]:
        return sorted(d.name for d in split_dir.iterdir() if d.is_dir() and not d.name.startswith("."))

    class_names = classes(train_dir)
    if not class_names:
        raise DatasetError(f"classification dataset {root}: {train_dir} has no class folders")
    unknown = sorted(set(classes(val_dir)) - set(class_names))
    if unknown:
        raise DatasetError(f"classification dataset {root}: {val_dir} has class folders not in train: {unknown}")
    train = [f for c in class_names for f in images_in(train_dir / c)]
    val = [f for c in class_names if (val_dir / c).is_dir() for f in images_in(val_dir / c)]
    for split, files, folder in (("train", train, train_dir), ("val", val, val_dir)):
        if not files:
            raise DatasetError(f"classification dataset {root}: no images found for '{split}' in {folder}/<class>/")
    names = dict(enumerate(class_names))
    return DataConfig(root, root, train, val, names, len(names), "classify")


# --- datasets -------------------------------------------------------------------------------------
def _names_dict(names: dict[int, str] | Sequence[str]) -> dict[int, str]:
    return dict(names) if isinstance(names, dict) else dict(enumerate(names))


def _sample_rng() -> np.random.Generator:
    """A generator for one sample, seeded from torch's RNG: in a DataLoader worker that RNG is
    seeded from the loader's generator, in the main process from ``torch.manual_seed``."""
    return np.random.default_rng(int(torch.randint(0, 2**62, (1,)).item()))


def _to_chw(arr: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1)))


class _ReadsImages(torch.utils.data.Dataset):
    """Reads image ``i``; an image that fails now (changed after the scan) is replaced by the next
    readable one, with one warning, instead of stopping the epoch."""

    files: list[Path]

    def _read(self, i: int) -> tuple[int, np.ndarray]:
        n = len(self.files)
        for step in range(n):
            j = (i + step) % n
            try:
                return j, read_image_file(self.files[j])
            except ImageError as exc:
                if j not in self._unreadable:
                    self._unreadable.add(j)
                    LOGGER.warning(f"{exc}; using another image in its place")
        raise DatasetError(f"none of the {n} images can be read any more (e.g. {self.files[i]})")

    def __len__(self) -> int:
        return len(self.files)


class DetectionDataset(_ReadsImages):
    """Images and boxes for a detector.

    ``dataset[i]`` is ``(image, labels, info)``: a uint8 ``(3, S, S)`` RGB tensor, float ``(n, 5)``
    ``[cls, x1, y1, x2, y2]`` in pixels of that image, and a dict with ``path``, ``orig_shape``
    ``(h, w)`` and ``mosaic``. Without ``augment`` the image is letterboxed (ratio kept, centred,
    grey 114 padding, :class:`libreyolo.ops.letterbox.Letterbox`) and ``info`` also has ``ratio`` and
    ``pad`` ``(left, top)``: ``(x - left) / ratio`` maps a box back to the original image. With
    ``augment``: mosaic, random affine, HSV jitter and flips (:class:`AugmentConfig`).

    ``labels`` holds each usable image's boxes, normalised ``[cls, x1, y1, x2, y2]``.
    """

    def __init__(self, files: Sequence[str | Path], names: dict[int, str] | Sequence[str], imgsz: int,
                 augment: bool, hyp: AugmentConfig | None = None, *, prefix: str = "") -> None:
        if int(imgsz) < 8:
            raise ValueError(f"imgsz must be at least 8 pixels, got {imgsz}")
        self.names = _names_dict(names)
        self.nc = len(self.names)
        self.imgsz = int(imgsz)
        self.augment = bool(augment)
        self.hyp = hyp if hyp is not None else AugmentConfig()
        scanned = scan_images(files, self.nc, prefix)
        self.files = [r.path for r in scanned]
        self.shapes = [r.shape for r in scanned]
        self.labels = [r.boxes for r in scanned]
        self._letterbox = Letterbox(self.imgsz, pad_value=float(aug.PAD_VALUE), placement="center", divisor=1.0)
        self._unreadable: set[int] = set()
        # whether mosaic is closed, in shared memory so that persistent DataLoader workers see set_epoch()
        self._mosaic_closed = torch.zeros(1, dtype=torch.int64)
        try:
            self._mosaic_closed.share_memory_()
        except (RuntimeError, OSError):  # no shared memory: set_epoch reaches workers started afterwards
            pass

    def set_epoch(self, epoch: int, epochs: int) -> None:
        """Switch mosaic off for the last ``hyp.close_mosaic`` of ``epochs`` epochs (0-based ``epoch``)."""
        self._mosaic_closed[0] = int(epoch >= epochs - self.hyp.close_mosaic)

    @property
    def mosaic_closed(self) -> bool:
        return bool(self._mosaic_closed[0])

    def _resized(self, i: int) -> tuple[int, np.ndarray, np.ndarray, tuple[int, int]]:
        """Image ``i`` (HWC) with its long side at ``imgsz`` and its boxes in its pixels."""
        j, arr = self._read(i)
        h, w = arr.shape[:2]
        img, _ = aug.resize_long_side(arr, self.imgsz)
        boxes = self.labels[j].copy()
        boxes[:, [1, 3]] *= img.shape[1]
        boxes[:, [2, 4]] *= img.shape[0]
        return j, img, boxes, (h, w)

    def _letterboxed(self, i: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        j, arr = self._read(i)
        h, w = arr.shape[:2]
        batch, metas = self._letterbox([_to_chw(arr)], dtype=torch.uint8)
        meta = metas[0]
        left, top = meta.pad
        boxes = torch.from_numpy(self.labels[j].copy())
        boxes[:, [1, 3]] = boxes[:, [1, 3]] * (w * meta.ratio) + left
        boxes[:, [2, 4]] = boxes[:, [2, 4]] * (h * meta.ratio) + top
        info = {"path": str(self.files[j]), "orig_shape": (h, w), "ratio": meta.ratio, "pad": meta.pad,
                "mosaic": False}
        return batch[0], boxes, info

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        if not self.augment:
            return self._letterboxed(i)
        hyp, size = self.hyp, self.imgsz
        rng = _sample_rng()
        use_mosaic = rng.random() < hyp.mosaic and not self.mosaic_closed
        if use_mosaic:
            others = rng.integers(0, len(self.files), 3)
            tiles = [self._resized(k) for k in (i, *others.tolist())]
            j, orig_shape = tiles[0][0], tiles[0][3]
            img, boxes = aug.mosaic4([(t[1], t[2]) for t in tiles], size, rng)
        else:
            j, img, boxes, orig_shape = self._resized(i)
        img, boxes = aug.random_affine(img, boxes, (size, size), hyp, rng)
        arr = aug.hsv_jitter(img, hyp.hsv_h, hyp.hsv_s, hyp.hsv_v, rng)
        if rng.random() < hyp.fliplr:
            arr, boxes = aug.flip_lr(arr, boxes)
        if rng.random() < hyp.flipud:
            arr, boxes = aug.flip_ud(arr, boxes)
        info = {"path": str(self.files[j]), "orig_shape": orig_shape, "mosaic": bool(use_mosaic)}
        return _to_chw(arr), torch.from_numpy(np.ascontiguousarray(boxes, dtype=np.float32)), info


def collate_detect(batch: Sequence[tuple[torch.Tensor, torch.Tensor, dict]]
                   ) -> tuple[torch.Tensor, torch.Tensor, list[dict]]:
    """``(images uint8 (B, 3, S, S), targets float (M, 6) [img_index, cls, x1, y1, x2, y2], infos)``."""
    images = torch.stack([b[0] for b in batch])
    targets = [torch.cat([torch.full((len(b[1]), 1), float(k)), b[1].float()], 1) for k, b in enumerate(batch)]
    return images, torch.cat(targets) if targets else torch.zeros((0, 6)), [b[2] for b in batch]


class ClassifyDataset(_ReadsImages):
    """``(image, class id)`` pairs: ``dataset[i]`` is a normalised float ``(3, S, S)`` tensor and an int.

    Training (``augment``): random resized crop (area 0.35..1) and a horizontal flip (p 0.5).
    Evaluation: shorter side resized to ``imgsz / crop_pct`` (bicubic), then the central square.
    """

    def __init__(self, files_and_labels: Sequence[tuple[str | Path, int]], imgsz: int, augment: bool,
                 mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD, *,
                 crop_pct: float = 0.875, prefix: str = "") -> None:
        pairs = [(Path(f), int(c)) for f, c in files_and_labels]
        kept = {r.path for r in scan_images([f for f, _ in pairs], None, prefix)}
        self.files = [f for f, _ in pairs if f in kept]
        self.targets = [c for f, c in pairs if f in kept]
        self.imgsz, self.augment, self.crop_pct = int(imgsz), bool(augment), float(crop_pct)
        self.mean = torch.tensor(mean, dtype=torch.float32).view(3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(3, 1, 1)
        self._unreadable: set[int] = set()

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        j, arr = self._read(i)
        img = Image.fromarray(arr)
        if self.augment:
            rng = _sample_rng()
            img = aug.random_resized_crop(img, self.imgsz, rng)
            if rng.random() < 0.5:
                img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        else:
            img = aug.resize_center_crop(img, self.imgsz, self.crop_pct)
        x = _to_chw(np.asarray(img)).float().div_(255.0)
        return (x - self.mean) / self.std, self.targets[j]


def collate_classify(batch: Sequence[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images float (B, 3, S, S), labels long (B,))``."""
    return torch.stack([b[0] for b in batch]), torch.tensor([b[1] for b in batch], dtype=torch.long)


# --- loaders --------------------------------------------------------------------------------------
def _seed_worker(worker_id: int) -> None:
    """Seed numpy and ``random`` in a worker from its torch seed (set by the loader's generator)."""
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)
    try:  # one OpenCV thread per worker: the workers are the parallelism (no oversubscribed cores)
        import cv2

        cv2.setNumThreads(0)
    except ImportError:
        pass


def build_dataloader(dataset: torch.utils.data.Dataset, batch: int, *, shuffle: bool, workers: int,
                     pin_memory: bool, seed: int, collate_fn: Callable,
                     distributed: bool = False) -> torch.utils.data.DataLoader:
    """A DataLoader whose order and augmentations depend only on ``seed`` (and the rank).

    With ``distributed`` each rank reads its share through a ``DistributedSampler``; call
    :func:`set_loader_epoch` before each epoch so that the shuffle changes between epochs.
    """
    sampler = None
    rank = 0
    if distributed:
        from torch.utils.data.distributed import DistributedSampler

        sampler = DistributedSampler(dataset, shuffle=shuffle, seed=seed, drop_last=False)
        rank = sampler.rank
    generator = torch.Generator()
    generator.manual_seed(seed + rank)  # different augmentations on each rank
    return torch.utils.data.DataLoader(
        dataset, batch_size=batch, shuffle=shuffle and sampler is None, sampler=sampler,
        num_workers=workers, pin_memory=pin_memory, collate_fn=collate_fn, drop_last=False,
        worker_init_fn=_seed_worker, generator=generator, persistent_workers=workers > 0,
    )


def set_loader_epoch(loader: torch.utils.data.DataLoader, epoch: int, epochs: int) -> None:
    """Tell the sampler (distributed shuffling) and the dataset (mosaic closing) the epoch."""
    if hasattr(loader.sampler, "set_epoch"):
        loader.sampler.set_epoch(epoch)
    if hasattr(loader.dataset, "set_epoch"):
        loader.dataset.set_epoch(epoch, epochs)
