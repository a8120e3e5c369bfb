"""Validation of a network during and after training: the task's metrics (mAP, top-k, mIoU).

:func:`evaluate` is the one metric loop: it runs a loader through a *forward* (a batch tensor in,
the family's named outputs out), lets the model's task score each batch (decoding with the family's
own postprocessing, the one predict uses, on each image's original canvas).
The forward is what differs: the trainer's network (:func:`validate`, each epoch on the EMA
weights), the eager model's or an exported artifact's runtime (``model.val()``,
:mod:`libreyolo.train.val`).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["evaluate", "validate"]

Forward = Callable[[torch.Tensor], dict[str, torch.Tensor]]


@torch.no_grad()
def evaluate(model: Any, forward: Forward, loader, *, device: torch.device, **options: Any) -> dict[str, float]:
    """Metrics of ``forward`` (``model``'s family, names and task) over a validation loader.

    ``options``: the task's postprocessing options at which predictions are scored (detect:
    ``conf``, ``iou``, ``max_det``); the task (:mod:`libreyolo.tasks`) owns the metrics and how a
    batch is scored.
    """
    from libreyolo.tasks import get_task

    task = get_task(model.task)
    # val's options (conf, iou, max_det) are checked by val(); the task takes those it declares
    opts = task.predict_options({k: v for k, v in options.items() if v is not None and k in task.options})
    metrics = task.metrics(model)
    for batch in loader:
        images = batch[0].to(device)
        if images.dtype == torch.uint8:
            images = model.family.network_input(images)
        task.score_batch(model, metrics, forward(images), batch, opts)
    return {k: float(v) for k, v in metrics.compute().items() if isinstance(v, (int, float))}


def validate(model: Any, net: nn.Module, loader, *, device: torch.device | None = None,
             **options: Any) -> dict[str, float]:
    """Metrics of ``net`` (``model``'s architecture) over a validation loader, in eval mode."""
    device = device or next(net.parameters()).device
    family = model.family
    was_training = net.training
    net.eval()
    try:
        return evaluate(model, lambda x: family.named_outputs(net(x)), loader, device=device, **options)
    finally:
        net.train(was_training)
