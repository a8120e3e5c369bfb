"""The options of ``train()`` and ``val()``, declared once (see :mod:`libreyolo.options`).

:class:`libreyolo.train.args.TrainArgs` checks every field with :data:`TRAIN_OPTIONS`, and
``val()`` with :data:`VAL_OPTIONS`; ``libreyolo train`` / ``libreyolo val`` parse the command line
with the same entries. Hyperparameters must be finite: a NaN learning rate would train to NaN.
"""
from __future__ import annotations

from libreyolo.options import (
    MAX_DET,
    MAX_EPOCHS,
    MAX_WORKERS,
    Opt,
    as_bool,
    as_device,
    batch_opt,
    fraction,
    imgsz_opt,
)

OPTIMIZERS = ("SGD", "AdamW", "auto")


def _positive(default: float, help: str, hi: float, unit: str = "") -> Opt:  # noqa: A002
    return Opt(float, default, help, min=0.0, max=hi, min_open=True, unit=unit)


def _nonneg(default: float, help: str, hi: float, unit: str = "") -> Opt:  # noqa: A002
    return Opt(float, default, help, min=0.0, max=hi, unit=unit)


VAL_OPTIONS: dict[str, Opt] = {
    "data": Opt(str, None, "dataset YAML (detect, semantic), image-folder root (classify) or a folder of "
                "high-resolution images (restore)"),
    "imgsz": imgsz_opt("input size (a multiple of the model stride; default from the model)"),
    "batch": batch_opt(16, "images per batch"),
    "workers": Opt(int, 2, "DataLoader worker processes", min=0, max=MAX_WORKERS),
    "device": Opt(as_device, None, "cpu, cuda, cuda:N"),
    "conf": fraction(0.001, "confidence threshold (mAP is computed over all confidences)"),
    "iou": fraction(0.7, "NMS IoU threshold"),
    "max_det": Opt(int, 300, "maximum detections per image", min=1, max=MAX_DET),
}

TRAIN_OPTIONS: dict[str, Opt] = {
    "data": VAL_OPTIONS["data"],
    "epochs": Opt(int, 100, "epochs", min=1, max=MAX_EPOCHS),
    "imgsz": imgsz_opt("training input size (a multiple of the model stride; default from the model)"),
    "batch": batch_opt(16, "images per batch (all ranks together)"),
    "workers": VAL_OPTIONS["workers"],
    "device": VAL_OPTIONS["device"],
    "optimizer": Opt(str, "auto", "SGD, AdamW or auto (SGD)", choices=OPTIMIZERS),
    "lr0": _positive(0.01, "initial learning rate", 10.0),
    "lrf": _positive(0.01, "final learning rate as a fraction of lr0", 1.0),
    "momentum": Opt(float, 0.937, "SGD momentum / Adam beta1", min=0.0, max=1.0),
    "weight_decay": _nonneg(5e-4, "weight decay", 1.0),
    "warmup_epochs": _nonneg(3.0, "warm-up epochs", float(MAX_EPOCHS), "epochs"),
    "cos_lr": Opt(as_bool, True, "cosine decay (false: linear)", True),
    "amp": Opt(as_bool, True, "mixed precision (CUDA)", True),
    "ema": Opt(as_bool, True, "keep an EMA of the weights (validated and saved)", True),
    "clip": _positive(10.0, "gradient-norm clip", 1e6),
    "nbs": Opt(int, 64, "nominal batch: gradients are accumulated up to about this many images", min=1, max=65536),
    "label_smoothing": Opt(float, 0.1, "label smoothing (classify)", min=0.0, max=1.0),
    "mosaic": fraction(1.0, "mosaic probability (detect)"),
    "close_mosaic": Opt(int, 10, "turn mosaic off for the last N epochs", min=0, max=MAX_EPOCHS),
    "degrees": _nonneg(0.0, "random rotation", 180.0, "degrees"),
    "translate": fraction(0.1, "random translation (fraction of the size)"),
    "scale": Opt(float, 0.5, "random zoom 1 +- scale", min=0.0, max=0.99),
    "shear": _nonneg(0.0, "random shear", 45.0, "degrees"),
    "fliplr": fraction(0.5, "left-right flip probability"),
    "flipud": fraction(0.0, "up-down flip probability"),
    "hsv_h": fraction(0.015, "hue jitter (fraction of the circle)"),
    "hsv_s": fraction(0.7, "saturation jitter"),
    "hsv_v": fraction(0.4, "value jitter"),
    "seed": Opt(int, 0, "random seed", min=0, max=2**32 - 1),
    "project": Opt(str, "runs/train", "parent folder of runs"),
    "name": Opt(str, "exp", "run folder name (a number is appended when it exists)"),
    "exist_ok": Opt(as_bool, False, "reuse an existing run folder", True),
    "resume": Opt(as_bool, False, "continue the run of model=<run>/weights/last.pt", True),
    "val": Opt(as_bool, True, "validate every epoch", True),
    "cuda_graph": Opt(as_bool, False, "capture the training step in CUDA graphs (never stops a run)", True),
    "graph_after": Opt(int, 3, "cuda_graph: capture once a batch shape was seen this many times", min=1, max=1000),
    "pin_memory": Opt(as_bool, True, "pinned host memory for the loader (CUDA)", True),
    "conf": VAL_OPTIONS["conf"],
    "iou": VAL_OPTIONS["iou"],
    "max_det": VAL_OPTIONS["max_det"],
    "plots": Opt(as_bool, True, "write results.png", True),
}


def require_train_extra(task: str, *, validating: bool = True) -> None:
    """The ``train`` extra's packages the task needs, checked before any dataset is scanned (and
    not first inside a DataLoader worker, where the error would be a traceback)."""
    from libreyolo.tasks import get_task

    get_task(task).require_extras(validating=validating)
