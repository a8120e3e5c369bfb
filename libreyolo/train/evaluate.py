"""Validation of a network during and after training: detection mAP or classification top-k.

:func:`validate` runs a loader through the network in eval mode, decodes with the family's own
postprocessing (the one predict uses), maps boxes back to each image's original pixels and
feeds :mod:`libreyolo.train.metrics`. The trainer calls it each epoch on the EMA weights;
``model.val()`` calls it on the model's.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["validate"]


@torch.no_grad()
def validate(model: Any, net: nn.Module, loader, *, conf: float = 0.001, iou: float = 0.7, max_det: int = 300,
             device: torch.device | None = None) -> dict[str, float]:
    """Metrics of ``net`` (``model``'s architecture) over a validation loader: detection mAP or top-k."""
    from libreyolo.ops.letterbox import LetterboxMeta
    from libreyolo.train.metrics import ClassifyMetrics, DetectionMetrics

    device = device or next(net.parameters()).device
    family = model.family
    was_training = net.training
    net.eval()
    detect = model.task == "detect"
    metrics = DetectionMetrics(model.names) if detect else ClassifyMetrics()
    scale = 255.0 * family.export.input_scale
    try:
        for batch in loader:
            images = batch[0].to(device)
            if images.dtype == torch.uint8:
                images = images.float() / 255.0 * scale
            out = net(images)
            if detect:
                targets, infos = batch[1], batch[2]
                metas = [LetterboxMeta(tuple(info["orig_shape"]), float(info["ratio"]), tuple(info["pad"]))
                         for info in infos]
                named = family.named_outputs(out)
                preds = family.postprocess(named, metas, conf=conf, iou=iou, max_det=max_det, classes=None)
                gts = []
                for j, meta in enumerate(metas):
                    rows = targets[targets[:, 0] == j]
                    gts.append({"xyxy": meta.to_original(rows[:, 2:6].float()), "cls": rows[:, 1].long()})
                metrics.update([{k: v.cpu() for k, v in p.items()} for p in preds],
                               [{k: v.cpu() for k, v in g.items()} for g in gts])
            else:
                logits = out if isinstance(out, torch.Tensor) else family.named_outputs(out)["logits"]
                metrics.update(logits.float().cpu(), batch[1])
    finally:
        net.train(was_training)
    return {k: float(v) for k, v in metrics.compute().items() if isinstance(v, (int, float))}
