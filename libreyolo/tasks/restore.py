"""The ``restore`` task: image restoration / super-resolution (``Results.restored``).

Families: swinir (:class:`libreyolo.models.restore.RestoreFamily`). Their postprocess returns
``{"image": (scale*h, scale*w, 3) uint8}`` per image, RGB. Decoded outputs are compared pixel by
pixel, at most one grey level apart (:func:`libreyolo.comparison.images.match_images`).

The task has no classes (a model carries ``nc`` 1, ``names`` ``{0: "image"}``, as the reference
checkpoints do). Predict options: ``tile`` and ``tile_pad`` (tiled inference for large images,
:meth:`libreyolo.models.restore.RestoreFamily.run_network`); an option of another task, such as
``conf``, is an error, not ignored (a threshold would suggest a control restoration does not have).
Val: PSNR and SSIM against high-resolution images degraded by bicubic downsampling
(:mod:`libreyolo.train.restore_data`, :mod:`libreyolo.train.restore_metrics`). Training is not
offered (:attr:`Restore.training_unavailable`).
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from libreyolo.errors import ArgumentError
from libreyolo.options import Opt, option_converter, show_value
from libreyolo.tasks import register_task
from libreyolo.tasks.base import Task, TaskOptions
from libreyolo.utils.checks import MAX_IMGSZ

if TYPE_CHECKING:  # torch loads on first use, so the CLI reads its options without it
    import torch

TILE_MULTIPLE = 8  # tile sides are multiples of the attention window of the restore families (SwinIR: 8)


@option_converter(f"None or 0 (no tiling), or a positive multiple of {TILE_MULTIPLE} up to {MAX_IMGSZ} (input pixels)")
def as_tile(name: str, value: Any) -> int | None:
    """The tile side: None for no tiling (0 means the same), else a positive multiple of the window."""
    tile = Opt(int, 0, "", min=0, max=MAX_IMGSZ).check(name, value)
    if tile == 0:
        return None
    if tile % TILE_MULTIPLE:
        raise ArgumentError(f"{name} must be a multiple of {TILE_MULTIPLE} (the attention window), so that tiles "
                            f"partition into the same windows as the whole image; got {show_value(value)} "
                            f"(e.g. {max(TILE_MULTIPLE, tile // TILE_MULTIPLE * TILE_MULTIPLE)})")
    return tile


RESTORE_OPTIONS: dict[str, Opt] = {
    "tile": Opt(as_tile, None, "restore large images tile by tile: the tile side in input pixels, a multiple of 8 "
                "(default: no tiling)"),
    # 32, not the reference's 16: measured on swinir-s, a seam pixel then differs from the untiled
    # output by at most ~1.2e-4 (0.03 grey levels) instead of ~0.05 (tests/test_restore_tiling.py)
    "tile_pad": Opt(int, 32, "context around each tile, in input pixels (tiling only; a multiple of 8 keeps the "
                    "windows aligned)", min=0, max=MAX_IMGSZ, unit="pixels"),
}


class Restored:
    """The restored image of one input.

    ``data``: (H, W, 3) uint8 RGB, ``scale`` times the input (``orig_shape``, (h, w)) on each side.
    """

    def __init__(self, data: torch.Tensor, orig_shape: tuple[int, int]):
        import torch
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
        from libreyolo.utils.atomic import atomic_write

        path = Path(filename).with_name(Path(filename).stem + "_restored.png")
        img = self.image()
        atomic_write(path, lambda tmp: img.save(tmp, format="PNG"))
        return str(path)


@register_task
class Restore(Task):
    name = "restore"
    payload = "restored"
    has_classes = False
    fixed_names = {0: "image"}
    options = RESTORE_OPTIONS
    metric = "PSNR_Y"
    decoded_match = "libreyolo.comparison.images:match_images"
    data_help = ("a folder of high-resolution images (each is downsampled by the model's scale, bicubic, for the "
                 "input and compared with the restored image)")
    what = "images"
    training_unavailable = ("training is not offered for image restoration (super-resolution): these models need "
                            "degradation and GAN training pipelines that LibreYOLO does not have; use a released "
                            "checkpoint (e.g. LibreSwinIRs.pt) for predict, val and export")
    int8_unavailable = "their pixel outputs need float"

    def predict_options(self, given: Mapping[str, Any]) -> TaskOptions:
        """``tile`` and ``tile_pad``, checked. Any other option, even one another task declares
        (such as ``conf``), is an error, so that nobody believes it changed the output."""
        foreign = sorted(k for k in given if k not in self.options)
        if foreign:
            raise ArgumentError(f"image restoration takes no predict options other than "
                                f"{', '.join(self.options)}; got {', '.join(map(repr, foreign))}: remove them "
                                "(an image is restored at its own size, with nothing to threshold or select)")
        opts = super().predict_options(given)
        if opts.tile and opts.tile_pad >= opts.tile:
            raise ArgumentError(f"tile_pad={opts.tile_pad} must be smaller than tile={opts.tile}: each tile is run "
                                f"with tile_pad pixels of context on every side, so the context would cost more than "
                                f"the tile itself; pass tile_pad<={opts.tile - TILE_MULTIPLE} or a larger tile")
        return opts

    def check_options(self, opts: TaskOptions, *, nc: int) -> None:
        return None

    def make_payload(self, pred: dict[str, torch.Tensor], orig_shape: tuple[int, int]) -> Restored:
        return Restored(pred["image"], orig_shape)

    def decoded(self, payload: Restored) -> dict[str, torch.Tensor]:
        return {"image": payload.data}

    # --- val ---------------------------------------------------------------------------------
    def claims_data(self, data: Any) -> str | None:
        from libreyolo.data.sources import IMAGE_SUFFIXES

        root = Path(data)
        if not root.is_dir():
            return None
        found = next((p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()), None)
        return "a folder of images (high-resolution ground truth)" if found is not None else None

    def load_data(self, data: Any) -> Any:
        from libreyolo.train.restore_data import load_restore_folder

        self.check_data_arg(data)
        return load_restore_folder(data, self.fixed_names)

    def val_dataset(self, model: Any, cfg: Any, imgsz: int) -> tuple[Any, Any]:
        from libreyolo.train.restore_data import RestoreCollate, RestoreDataset

        scale = model.family.scale
        return RestoreDataset(cfg.val, scale, border=scale), RestoreCollate(model.family.letterbox(imgsz))

    def metrics(self, model: Any) -> Any:
        from libreyolo.train.restore_metrics import RestoreMetrics

        return RestoreMetrics(border=model.family.scale)

    def score_batch(self, model: Any, metrics: Any, named: dict[str, torch.Tensor], batch: Any,
                    opts: TaskOptions) -> None:
        from libreyolo.ops.pad import PadMeta

        metas = [PadMeta(tuple(info["orig_shape"])) for info in batch[2]]
        preds = model.family.postprocess(named, metas, opts)
        metrics.update([p["image"].cpu() for p in preds], batch[1])

    def synthetic_dataset(self, root: str | Path, **kw: Any) -> Path:
        from libreyolo.train.shapes import make_restore_dataset

        return make_restore_dataset(root, **kw)
