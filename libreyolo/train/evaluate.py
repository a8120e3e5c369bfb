"""Validation of a network during and after training: detection mAP or classification top-k.

:func:`evaluate` is the one metric loop: it runs a loader through a *forward* (a batch tensor in,
the family's named outputs out), decodes with the family's own postprocessing (the one predict
uses), maps boxes back to each image's original pixels and feeds :mod:`libreyolo.train.metrics`.
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
def evaluate(model: Any, forward: Forward, loader, *, device: torch.device, conf: float = 0.001,
             iou: float = 0.7, max_det: int = 300) -> dict[str, float]:
    """Metrics of ``forward`` (``model``'s family, names and task) over a validation loader."""
    from libreyolo.ops.letterbox import LetterboxMeta
    from libreyolo.train.metrics import ClassifyMetrics, DetectionMetrics

    family = model.family
    detect = model.task == "detect"
    metrics = DetectionMetrics(model.names) if detect else ClassifyMetrics()
    scale = 255.0 * family.export.input_scale
    for batch in loader:
        images = batch[0].to(device)
        if images.dtype == torch.uint8:
            images = images.float() / 255.0 * scale
        named = forward(images)
        if detect:
            targets, infos = batch[1], batch[2]
            metas = [LetterboxMeta(tuple(info["orig_shape"]), float(info["ratio"]), tuple(info["pad"]))
                     for info in infos]
            preds = family.postprocess(named, metas, conf=conf, iou=iou, max_det=max_det, classes=None)
            gts = []
            for j, meta in enumerate(metas):
                rows = targets[targets[:, 0] == j]
                gts.append({"xyxy": meta.to_original(rows[:, 2:6].float()), "cls": rows[:, 1].long()})
            metrics.update([{k: v.cpu() for k, v in p.items()} for p in preds],
                           [{k: v.cpu() for k, v in g.items()} for g in gts])
        else:
            metrics.update(named["logits"].float().cpu(), batch[1])
    return {k: float(v) for k, v in metrics.compute().items() if isinstance(v, (int, float))}


def validate(model: Any, net: nn.Module, loader, *, conf: float = 0.001, iou: float = 0.7, max_det: int = 300,
             device: torch.device | None = None) -> dict[str, float]:
    """Metrics of ``net`` (``model``'s architecture) over a validation loader, in eval mode."""
    device = device or next(net.parameters()).device
    family = model.family
    was_training = net.training
    net.eval()
    try:
        return evaluate(model, lambda x: family.named_outputs(net(x)), loader, device=device, conf=conf, iou=iou,
                        max_det=max_det)
    finally:
        net.train(was_training)
