"""The ``restore`` task: image restoration / super-resolution (``Results.restored``).

Families: swinir (:class:`libreyolo.models.restore.RestoreFamily`). Their postprocess returns
``{"image": (scale*h, scale*w, 3) uint8}`` per image, RGB. Decoded outputs are compared pixel by
pixel, at most one grey level apart (:func:`libreyolo.export.match_images.match_images`). The task
has no classes and no predict options: an option given to predict() is an error, not ignored (a
threshold such as ``conf`` would suggest a control that restoration does not have). Training and
val (PSNR/SSIM) are not available yet.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from libreyolo.errors import ArgumentError
from libreyolo.tasks import register_task
from libreyolo.tasks.base import Task, TaskOptions


class Restored:
    """The restored image of one input.

    ``data``: (H, W, 3) uint8 RGB, ``scale`` times the input (``orig_shape``, (h, w)) on each side.
    """

    def __init__(self, data: torch.Tensor, orig_shape: tuple[int, int]):
        if data.ndim != 3 or data.shape[-1] != 3 or data.dtype != torch.uint8:
            raise ValueError(f"Restored expects one (H, W, 3) uint8 image, got {tuple(data.shape)} {data.dtype}")
        self.data = data
        self.orig_shape = (int(orig_shape[0]), int(orig_shape[1]))

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.data.shape)

    @property
    def scale(self) -> int:
        return int(self.data.shape[0]) // max(1, self.orig_shape[0])

    def cpu(self) -> Restored:
        return Restored(self.data.cpu(), self.orig_shape)

    def numpy(self) -> np.ndarray:
        return self.data.detach().cpu().numpy()

    def image(self) -> Any:
        """The restored image as a PIL image (RGB)."""
        from PIL import Image

        return Image.fromarray(self.numpy(), mode="RGB")

    def __repr__(self) -> str:
        return f"Restored(shape={self.shape}, orig_shape={self.orig_shape}, scale={self.scale})"

    # --- the payload protocol (libreyolo.results.Results) ----------------------------------
    def n_predictions(self) -> int:
        return 1

    def verbose(self, names: dict[int, str]) -> str:
        return f"restored {self.scale}x: {self.data.shape[0]}x{self.data.shape[1]}"

    def summary(self, names: dict[int, str]) -> list[dict[str, Any]]:
        (h, w), (oh, ow) = self.orig_shape, self.data.shape[:2]
        return [{"scale": self.scale, "input": {"height": h, "width": w},
                 "output": {"height": int(oh), "width": int(ow)}}]

    def draw(self, image: Any, names: dict[int, str], **_: Any) -> Any:
        """Side by side: the input enlarged by pixel repetition (nearest) on the left, the restored
        image on the right, each ``scale`` times the input."""
        from PIL import Image

        out = self.image()
        left = image.convert("RGB").resize(out.size, Image.Resampling.NEAREST)
        canvas = Image.new("RGB", (2 * out.width, out.height))
        canvas.paste(left, (0, 0))
        canvas.paste(out, (out.width, 0))
        return canvas

    def save_extra(self, filename: str | Path) -> str:
        """Write the restored image itself beside the side-by-side picture (``<stem>_restored.png``,
        lossless); returns its path."""
        from libreyolo.checkpoint import atomic_write

        path = Path(filename).with_name(Path(filename).stem + "_restored.png")
        img = self.image()
        atomic_write(path, lambda tmp: img.save(tmp, format="PNG"))
        return str(path)


@register_task
class Restore(Task):
    name = "restore"
    payload = "restored"
    has_classes = False
    options = {}
    metric = ""
    decoded_match = "libreyolo.export.match_images:match_images"
    data_help = "(restoration has no training or val data yet)"
    what = "images"

    def predict_options(self, given: Mapping[str, Any]) -> TaskOptions:
        """Restoration takes no predict options; any given (even one another task declares, such as
        ``conf``) is an error, so that nobody believes it changed the output."""
        if given:
            raise ArgumentError(f"image restoration takes no predict options, got "
                                f"{', '.join(sorted(map(repr, given)))}; remove them (an image is restored "
                                "at its own size, with nothing to threshold or select)")
        return TaskOptions({})

    def check_options(self, opts: TaskOptions, *, nc: int) -> None:
        return None

    def make_payload(self, pred: dict[str, torch.Tensor], orig_shape: tuple[int, int]) -> Restored:
        return Restored(pred["image"], orig_shape)

    def decoded(self, payload: Restored) -> dict[str, torch.Tensor]:
        return {"image": payload.data}
