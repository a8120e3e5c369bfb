"""Image-classification loss: cross-entropy with label smoothing."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from libreyolo.errors import ArgumentError

__all__ = ["ClassificationLoss"]


class ClassificationLoss:
    """Mean cross-entropy of (B, C) logits against (B,) class indices, computed in float32.

    ``label_smoothing`` spreads that much of each target's probability mass evenly over all
    classes (Szegedy et al. 2016), which regularises fine-tuning of pretrained classifiers.
    Unlike the detection loss the value is a mean, not scaled by the batch size.
    """

    def __init__(self, label_smoothing: float = 0.1) -> None:
        if not 0.0 <= label_smoothing < 1.0:
            raise ArgumentError(f"label_smoothing must be in [0, 1), got {label_smoothing!r}")
        self.label_smoothing = label_smoothing

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (loss, items): the scalar mean loss and the detached tensor [ce]."""
        if logits.ndim != 2 or labels.shape != logits.shape[:1]:
            raise ArgumentError(f"ClassificationLoss: expected logits (B, C) and labels (B,), got "
                                f"{tuple(logits.shape)} and {tuple(labels.shape)}")
        with torch.autocast(device_type=logits.device.type, enabled=False):
            loss = F.cross_entropy(logits.float(), labels.long(), label_smoothing=self.label_smoothing)
        return loss, loss.detach().unsqueeze(0)
