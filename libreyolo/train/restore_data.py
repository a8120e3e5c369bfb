"""Validation data for image restoration (super-resolution): a folder of high-resolution images.

``model.val(data="hr_images/")`` reads every image under the folder (recursively, in sorted
order) as a ground truth. Each is cropped at the bottom and right to a multiple of the scale (4),
then degraded to the network's input by bicubic downsampling by the scale (PIL's antialiased
bicubic, the kernel of MATLAB's ``imresize``, rounded to 8 bit as a saved low-resolution image
would be). MATLAB's own ``imresize``, which published tables use, rounds and treats the border
slightly differently, so numbers are close to, not equal to, those tables.

A batch of low-resolution images of different sizes is padded to the largest with
:class:`~libreyolo.ops.pad.PadToMultiple`, predict()'s own preprocessing, so each image is scored
exactly as ``predict()`` restores it in the same batch; a smaller image there sees reflected
context at its padded edges (use ``batch=1`` for numbers independent of batching).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from libreyolo.errors import DatasetError

__all__ = ["RestoreCollate", "RestoreDataset", "degrade", "load_restore_folder", "min_side"]


def min_side(scale: int, border: int) -> int:
    """The smallest high-resolution side that leaves an 11-pixel SSIM window after the border crop."""
    need = 11 + 2 * border
    return -(-need // scale) * scale


def load_restore_folder(data: Any, names: dict[int, str]) -> Any:
    """The :class:`~libreyolo.train.data.DataConfig` of a folder of high-resolution images (its ``val``)."""
    from libreyolo.train.data import DataConfig, images_in

    root = Path(data)
    if not root.is_dir():
        raise DatasetError(f"data must be a folder of high-resolution images for restoration, got {str(data)!r} "
                           f"({'a file' if root.exists() else 'not found'})")
    files = images_in(root)
    if not files:
        from libreyolo.data.sources import IMAGE_SUFFIXES

        raise DatasetError(f"no images under {root} (looked for {', '.join(sorted(IMAGE_SUFFIXES))})")
    return DataConfig(yaml_path=root, root=root, train=[], val=files, names=dict(names), nc=len(names),
                      task="restore")


def degrade(hr: np.ndarray, scale: int) -> tuple[np.ndarray, np.ndarray]:
    """(ground truth, input) of one (H, W, 3) uint8 RGB image: the image cropped at the bottom and
    right to a multiple of ``scale``, and that crop bicubic-downsampled by ``scale``, uint8."""
    from PIL import Image

    h, w = (hr.shape[0] // scale) * scale, (hr.shape[1] // scale) * scale
    hr = np.array(hr[:h, :w])  # a writable copy (torch.from_numpy)
    lr = Image.fromarray(hr).resize((w // scale, h // scale), Image.Resampling.BICUBIC)
    return hr, np.array(lr, dtype=np.uint8)  # a writable copy (torch.from_numpy)


class RestoreDataset(torch.utils.data.Dataset):
    """``(input (3, h, w) uint8, ground truth (scale*h, scale*w, 3) uint8, {"orig_shape": (h, w), "path"})``."""

    def __init__(self, files: list[Path], scale: int, border: int) -> None:
        self.files, self.scale, self.border = list(files), int(scale), int(border)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        from libreyolo.data.sources import read_image_file

        path = self.files[i]
        image = read_image_file(path)
        least = min_side(self.scale, self.border)
        if min(image.shape[:2]) < least:
            raise DatasetError(f"{path} is {image.shape[1]}x{image.shape[0]}: restoration val needs images of at "
                               f"least {least} pixels a side (x{self.scale} downsampling, a {self.border}-pixel "
                               "border crop and the 11-pixel SSIM window)")
        hr, lr = degrade(image, self.scale)
        return (torch.from_numpy(lr).permute(2, 0, 1).contiguous(), torch.from_numpy(hr),
                {"orig_shape": (int(lr.shape[0]), int(lr.shape[1])), "path": str(path)})


@dataclass(frozen=True)
class RestoreCollate:
    """A batch: the inputs preprocessed by the family's ``pad`` (as predict() does), the ground
    truths (a list: sizes differ) and the per-image infos."""

    pad: Any

    def __call__(self, items: list) -> tuple[torch.Tensor, list[torch.Tensor], list[dict[str, Any]]]:
        batch, _ = self.pad([lr for lr, _, _ in items])
        return batch, [hr for _, hr, _ in items], [info for _, _, info in items]
