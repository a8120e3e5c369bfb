"""The ``semantic`` task: a class per pixel (``Results.semantic_mask``), mIoU for training and val.

Families: segformer (:class:`libreyolo.models.semantic.SemanticFamily`). Their postprocess returns
``{"mask": (h, w) int64}`` per image, the class map on the original image's canvas; decoded
outputs are compared as pixel agreement, ties within the tolerance not counted against it
(:func:`libreyolo.comparison.matching.match_masks`). Predict option: ``classes`` (only these ids may win
a pixel). Data: a YAML with ``path``, ``train``, ``val``, ``names``; images and same-named PNG
class-index masks (255 = ignore), see :mod:`libreyolo.train.semantic_data`.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from libreyolo.options import Opt, as_ids
from libreyolo.tasks import register_task
from libreyolo.tasks.base import PROBE_IMAGES, Task, TaskOptions

if TYPE_CHECKING:  # torch loads on first use, so the CLI reads its options without it
    import torch

IGNORE = 255  # the class id of pixels that belong to no class (masks), never predicted

SEMANTIC_OPTIONS: dict[str, Opt] = {
    "classes": Opt(as_ids, None, "only these class ids may be predicted for a pixel, e.g. 0,2"),
}


class SemanticMask:
    """The class map of one image, on the original image's canvas.

    ``data``: (H, W) int64 class ids (``255`` = ignore, which predictions never hold); ``classes``:
    the ids present, ascending; ``class_mask(i)``: a boolean (H, W) mask of class ``i``;
    ``areas()``: {class id: pixel count}.
    """

    def __init__(self, data: torch.Tensor, orig_shape: tuple[int, int]):
        if data.ndim != 2:
            raise ValueError(f"SemanticMask expects one (H, W) class map, got shape {tuple(data.shape)}")
        self.data = data
        self.orig_shape = orig_shape

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.data.shape)

    def areas(self) -> dict[int, int]:
        import torch
        ids, counts = torch.unique(self.data.cpu(), return_counts=True)
        return {int(i): int(c) for i, c in zip(ids.tolist(), counts.tolist(), strict=True) if int(i) != IGNORE}

    @property
    def classes(self) -> list[int]:
        return sorted(self.areas())

    def class_mask(self, i: int) -> torch.Tensor:
        return self.data == int(i)

    def cpu(self) -> SemanticMask:
        return SemanticMask(self.data.cpu(), self.orig_shape)

    def numpy(self) -> np.ndarray:
        return self.data.detach().cpu().numpy()

    def __repr__(self) -> str:
        return f"SemanticMask(shape={self.shape}, classes={self.classes})"

    # --- the payload protocol (libreyolo.results.Results) ----------------------------------
    def n_predictions(self) -> int:
        return len(self.areas())

    def verbose(self, names: dict[int, str]) -> str:
        total = max(1, self.data.numel())
        top = sorted(self.areas().items(), key=lambda kv: -kv[1])[:5]
        return f"{len(self.areas())} classes: " + ", ".join(f"{names.get(k, str(k))} {100 * n / total:.1f}%"
                                                            for k, n in top)

    def summary(self, names: dict[int, str]) -> list[dict[str, Any]]:
        total = max(1, self.data.numel())
        return [{"name": names.get(k, str(k)), "class": k, "pixels": n, "area": round(n / total, 6)}
                for k, n in sorted(self.areas().items())]

    def palette(self) -> np.ndarray:
        """(256, 3) uint8: the colour of every class id (``255`` black), as plot() and the PNG use."""
        from libreyolo.utils.plotting import class_color

        pal = np.array([class_color(k) for k in range(256)], np.uint8)
        pal[IGNORE] = 0
        return pal

    def draw(self, image: Any, names: dict[int, str], *, labels: bool = True, alpha: float = 0.5, **_: Any) -> Any:
        from PIL import Image

        from libreyolo.utils.plotting import class_color, draw_legend

        ids = self.numpy()
        colours = np.array([class_color(int(k)) for k in range(int(ids.max(initial=0)) + 1)], np.float32)
        base = np.asarray(image.convert("RGB"), np.float32)
        valid = ids != IGNORE
        over = base.copy()
        over[valid] = (1 - alpha) * base[valid] + alpha * colours[ids[valid]]
        out = Image.fromarray(over.round().clip(0, 255).astype(np.uint8))
        if labels:
            top = sorted(self.areas().items(), key=lambda kv: -kv[1])[:12]
            draw_legend(out, [(names.get(k, str(k)), class_color(k)) for k, _ in top])
        return out

    def save_extra(self, filename: str | Path) -> str:
        """Write the class map as a palette PNG beside an annotated image (``<stem>_mask.png``;
        pixel values are class ids, ``255`` ignore); returns its path. Class ids above 254 do not
        fit a palette PNG and are written as 16-bit greyscale."""
        from PIL import Image

        from libreyolo.utils.atomic import atomic_write

        path = Path(filename).with_name(Path(filename).stem + "_mask.png")
        ids = self.numpy()
        if int(ids.max(initial=0)) <= 255:
            img = Image.fromarray(ids.astype(np.uint8), mode="P")
            img.putpalette(self.palette().flatten().tolist())
        else:
            img = Image.fromarray(ids.astype(np.uint16))
        atomic_write(path, lambda tmp: img.save(tmp, format="PNG"))
        return str(path)


@register_task
class Semantic(Task):
    name = "semantic"
    payload = "semantic_mask"
    options = SEMANTIC_OPTIONS
    metric = "mIoU"
    decoded_match = "libreyolo.comparison.matching:match_masks"
    data_help = "a dataset YAML (path, train, val, names; PNG class-index masks under masks/)"
    what = "segmentation"

    def make_payload(self, pred: dict[str, torch.Tensor], orig_shape: tuple[int, int]) -> SemanticMask:
        return SemanticMask(pred["mask"], orig_shape)

    def decoded(self, payload: SemanticMask) -> dict[str, torch.Tensor]:
        return {"mask": payload.data}

    # --- training and val ------------------------------------------------------------------
    def claims_data(self, data: Any) -> str | None:
        from libreyolo.train.semantic_data import load_semantic_yaml, mask_path

        cfg = load_semantic_yaml(data)
        probe = cfg.val[:PROBE_IMAGES]
        n = sum(m is not None and m.is_file() for m in (mask_path(p, cfg.masks_dir) for p in probe))
        return f"{n} of its first {len(probe)} val images have masks under {cfg.masks_dir}/" if n else None

    def load_data(self, data: Any) -> Any:
        from libreyolo.train.semantic_data import load_semantic_yaml

        self.check_data_arg(data)
        return load_semantic_yaml(data)

    def train_dataset(self, model: Any, cfg: Any, imgsz: int, args: Any) -> tuple[Any, Any]:
        from libreyolo.train import semantic_data as S

        hyp = S.SemanticAugment(fliplr=args.fliplr, hsv_h=args.hsv_h, hsv_s=args.hsv_s, hsv_v=args.hsv_v)
        return (S.SemanticDataset(cfg.train, cfg.names, imgsz, augment=True, hyp=hyp,
                                  letterbox=model.family.letterbox(imgsz)), S.collate_semantic)

    def val_dataset(self, model: Any, cfg: Any, imgsz: int) -> tuple[Any, Any]:
        from libreyolo.train import semantic_data as S

        return (S.SemanticDataset(cfg.val, cfg.names, imgsz, augment=False, letterbox=model.family.letterbox(imgsz)),
                S.collate_semantic)

    def metrics(self, model: Any) -> Any:
        from libreyolo.train.semantic_metrics import SemanticMetrics

        return SemanticMetrics(model.nc, ignore_index=IGNORE)

    def score_batch(self, model: Any, metrics: Any, named: dict[str, torch.Tensor], batch: Any,
                    opts: TaskOptions) -> None:
        import torch

        from libreyolo.ops.letterbox import LetterboxMeta

        infos = batch[2]
        metas = [LetterboxMeta(tuple(info["orig_shape"]), float(info["ratio"]), tuple(info["pad"])) for info in infos]
        preds = model.family.postprocess(named, metas, opts.replace(classes=None))
        metrics.update([p["mask"].cpu() for p in preds], [torch.as_tensor(info["mask_orig"]) for info in infos])

    def synthetic_batch(self, model: Any, batch: int, imgsz: int, generator: torch.Generator) -> torch.Tensor:
        import torch
        masks = torch.randint(0, model.nc, (batch, imgsz, imgsz), generator=generator)
        masks[:, :, :2] = IGNORE
        return masks

    def synthetic_dataset(self, root: str | Path, **kw: Any) -> Path:
        from libreyolo.train.shapes import make_segmentation_dataset

        return make_segmentation_dataset(root, **kw)
