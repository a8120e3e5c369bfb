"""The ``classify`` task: class probabilities (``Results.probs``), top-1/top-5 for training and val.

Families: vit, deit, swin (:class:`libreyolo.models.classify.ClassifyFamily`). Their postprocess
returns ``{"probs": (nc,)}`` per image; decoded outputs are compared as top-5 class lists
(:func:`libreyolo.comparison.matching.match_classes`). No predict options of its own.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from libreyolo.tasks import register_task
from libreyolo.tasks.base import Task, TaskOptions

if TYPE_CHECKING:  # torch loads on first use, so the CLI reads its options without it
    import torch


@register_task
class Classify(Task):
    name = "classify"
    payload = "probs"
    options = {}
    metric = "top1"
    decoded_match = "libreyolo.comparison.matching:match_classes"
    data_help = "an image-folder root (root/train/<class>/*.jpg, root/val/<class>/*)"
    what = "classes"

    def make_payload(self, pred: dict[str, torch.Tensor], orig_shape: tuple[int, int]) -> Any:
        from libreyolo.results import Probs

        return Probs(pred["probs"])

    def decoded(self, payload: Any) -> dict[str, torch.Tensor]:
        return {"probs": payload.data}

    # --- training and val ------------------------------------------------------------------
    def claims_data(self, data: Any) -> str | None:
        from libreyolo.train.data import load_classify_root

        cfg = load_classify_root(data)
        return f"an image-folder root with {cfg.nc} class folders under train/" if cfg.nc else None

    def load_data(self, data: Any) -> Any:
        from libreyolo.train.data import load_classify_root

        self.check_data_arg(data)
        return load_classify_root(data)

    def _dataset(self, model: Any, samples: list, imgsz: int, augment: bool) -> Any:
        from libreyolo.train import data as D

        box = model.family.letterbox(imgsz)
        norm = box.normalization() if hasattr(box, "normalization") else {"mean": [0.0] * 3, "std": [1.0] * 3}
        return D.ClassifyDataset(samples, imgsz, augment=augment, mean=norm["mean"], std=norm["std"])

    def train_dataset(self, model: Any, cfg: Any, imgsz: int, args: Any) -> tuple[Any, Any]:
        from libreyolo.train.data import collate_classify

        return self._dataset(model, cfg.samples("train"), imgsz, True), collate_classify

    def val_dataset(self, model: Any, cfg: Any, imgsz: int) -> tuple[Any, Any]:
        from libreyolo.train.data import collate_classify

        return self._dataset(model, cfg.samples("val"), imgsz, False), collate_classify

    def loss_hyp(self, args: Any) -> dict[str, Any]:
        return {"label_smoothing": args.label_smoothing}

    def metrics(self, model: Any) -> Any:
        from libreyolo.train.metrics import ClassifyMetrics

        return ClassifyMetrics()

    def score_batch(self, model: Any, metrics: Any, named: dict[str, torch.Tensor], batch: Any,
                    opts: TaskOptions) -> None:
        metrics.update(named["logits"].float().cpu(), batch[1])

    def synthetic_batch(self, model: Any, batch: int, imgsz: int, generator: torch.Generator) -> torch.Tensor:
        import torch
        return torch.randint(0, model.nc, (batch,), generator=generator)

    def synthetic_dataset(self, root: str | Path, **kw: Any) -> Path:
        from libreyolo.train.shapes import make_shapes_dataset

        return make_shapes_dataset(root, task="classify", **kw)
