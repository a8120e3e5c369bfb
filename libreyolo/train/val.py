"""``model.val(data=...)`` for every model: the eager network and each exported artifact.

One implementation: the options are checked here, the dataset is read and letterboxed here, the
metrics are computed by :func:`libreyolo.train.evaluate.evaluate`. A model supplies only its
forward, through ``model.evaluation(device, imgsz)`` (a context manager yielding
``(forward, device)``): the eager :class:`~libreyolo.engine.model.Model` runs its network, an
:class:`~libreyolo.runtimes.base.ArtifactPredictor` runs its runtime (static batches are fed in
chunks of the exported size; a static input size must be the one validated at).
"""
from __future__ import annotations

from typing import Any

from libreyolo.errors import ArgumentError

__all__ = ["load_dataset", "val", "val_dataset"]


def load_dataset(task: str, data: Any):
    """The dataset description of ``data`` for ``task`` (the task reads it: a detection YAML, a
    classification root, a semantic YAML, ...)."""
    from libreyolo.tasks import check_data_task, get_task

    check_data_task(task, data)  # another task's dataset is an error naming both, not a metric of 0
    return get_task(task).load_data(data)


def val_dataset(model: Any, cfg: Any, imgsz: int):
    """The evaluation dataset of ``cfg``'s val split at ``imgsz`` and its collate function (the
    trainer's per-epoch validation reads the same one)."""
    from libreyolo.tasks import get_task

    return get_task(model.task).val_dataset(model, cfg, imgsz)


def val(model: Any, *, data: Any = None, imgsz: int | None = None, batch: int = 16, workers: int = 2,
        device: Any = None, conf: float = 0.001, iou: float = 0.7, max_det: int = 300) -> dict[str, float]:
    """Metrics of ``model`` (eager or artifact) on the val split of ``data``, its task's:
    ``mAP50-95``, ``mAP50``, ``precision``, ``recall`` (detect), ``top1``, ``top5`` (classify),
    ``mIoU``, ``pixel_acc``, ``mAcc`` (semantic), ``PSNR_Y``, ``SSIM_Y``, ``PSNR_RGB``,
    ``SSIM_RGB`` (restore: ``data`` is a folder of high-resolution images, see
    :mod:`libreyolo.train.restore_data`).

    Options are checked by :data:`libreyolo.train.options.VAL_OPTIONS` (the table ``predict()``
    and ``libreyolo val`` use too); ``imgsz`` is the model's (an artifact's: the size it was
    exported for) unless given, and must be a multiple of its stride.
    """
    from libreyolo.options import check_all
    from libreyolo.tasks import get_task
    from libreyolo.train.data import build_dataloader
    from libreyolo.train.evaluate import evaluate
    from libreyolo.train.options import VAL_OPTIONS, require_train_extra

    o = check_all(VAL_OPTIONS, {"data": data, "imgsz": imgsz, "batch": batch, "workers": workers, "device": device,
                                "conf": conf, "iou": iou, "max_det": max_det}, command="val")
    task = get_task(model.task)
    if not o["data"]:
        raise ArgumentError(f"val needs data=: {task.data_help}")
    conf, iou, batch, max_det, workers = o["conf"], o["iou"], o["batch"], o["max_det"], o["workers"]
    # the input size and budget as predict() resolves them (the call plan; val runs the float32 network)
    size = model.plan(imgsz=o["imgsz"], batch=batch, half=False).imgsz
    require_train_extra(model.task)  # before the dataset is scanned
    cfg = load_dataset(model.task, data)
    if task.has_classes and cfg.nc != model.nc:
        raise ArgumentError(f"the dataset {data} has {cfg.nc} classes and the model {model.nc}; validate a model "
                            "trained on this dataset")
    if not cfg.val:
        raise ArgumentError(f"{data} has no val split to validate on")
    with model.evaluation(device, size) as (forward, run_device):
        dataset, collate = val_dataset(model, cfg, size)
        loader = build_dataloader(dataset, batch, shuffle=False, workers=workers,
                                  pin_memory=run_device.type == "cuda", seed=0, collate_fn=collate)
        return evaluate(model, forward, loader, device=run_device, conf=conf, iou=iou, max_det=max_det)
