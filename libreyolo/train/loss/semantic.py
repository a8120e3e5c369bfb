"""Semantic-segmentation loss: per-pixel cross-entropy at the label resolution, 255 ignored."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from libreyolo.errors import ArgumentError

__all__ = ["IGNORE_INDEX", "SemanticLoss"]

IGNORE_INDEX = 255  # label value of pixels that count for nothing (void, borders, padding)


class SemanticLoss:
    """Mean cross-entropy of (B, C, h, w) logits against (B, H, W) class-id masks, in float32.

    The logits (typically the head's 1/4-resolution output) are first resized bilinearly
    (half-pixel centres) to the masks' (H, W), as the reference does. Pixels labelled
    ``ignore_index`` take no part; when a batch has no other pixel the loss is a zero still
    connected to the graph (cross-entropy alone would give NaN and poison the optimizer step).
    """

    def __init__(self, nc: int | None = None, ignore_index: int = IGNORE_INDEX) -> None:
        if nc is not None and nc < 1:
            raise ArgumentError(f"SemanticLoss needs nc >= 1, got {nc!r}")
        self.nc = nc
        self.ignore_index = int(ignore_index)

    def __call__(self, logits: torch.Tensor, masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (loss, items): the scalar mean loss and the detached tensor [sem]."""
        if logits.ndim != 4 or masks.ndim != 3 or masks.shape[0] != logits.shape[0]:
            raise ArgumentError(f"SemanticLoss: expected logits (B, C, h, w) and masks (B, H, W), got "
                                f"{tuple(logits.shape)} and {tuple(masks.shape)}")
        if self.nc is not None and logits.shape[1] != self.nc:
            raise ArgumentError(f"SemanticLoss: logits have {logits.shape[1]} classes, the loss was built for "
                                f"{self.nc}")
        masks = masks.long()
        with torch.autocast(device_type=logits.device.type, enabled=False):
            logits = logits.float()
            if logits.shape[-2:] != masks.shape[-2:]:
                logits = F.interpolate(logits, size=masks.shape[-2:], mode="bilinear", align_corners=False)
            valid = masks != self.ignore_index
            # no host sync: the per-pixel losses are summed and divided by max(valid, 1), which is
            # cross_entropy's mean when some pixel counts and a graph-connected 0 when none does
            per_pixel = F.cross_entropy(logits, masks, ignore_index=self.ignore_index, reduction="none")
            loss = per_pixel.sum() / valid.sum().clamp_min(1)
        return loss, loss.detach().unsqueeze(0)
