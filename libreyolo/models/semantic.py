"""The semantic contract: what a semantic-segmentation family declares, once.

A semantic family subclasses :class:`SemanticFamily`, sets its sizes and file-name pattern and
implements ``build``. Its network takes the letterboxed (B, 3, S, S) RGB batch in [0, 1] (any
mean/std is applied inside the network) and returns per-pixel logits (B, nc, S, S) at the input
resolution; for training it also has ``forward_logits``, the logits at the head's own (coarser)
resolution. Everything else is shared:

- preprocessing: :class:`~libreyolo.ops.letterbox.Letterbox` with the reference's geometry (sides
  ``int(side * ratio)``, grey 114 padding at the right and bottom), on the device;
- postprocessing: :func:`~libreyolo.ops.semantic.semantic_postprocess` (crop the padding,
  resize to the original image, argmax) -> ``{"mask": (h, w)}`` per image;
- export: one output ``logits`` (B, nc, S, S), judged per sample as a map; decoded masks are
  compared by ``libreyolo.comparison.matching:match_masks``;
- training: :class:`~libreyolo.train.loss.semantic.SemanticLoss` on the native-resolution
  logits, against (B, H, W) masks (255 = ignore).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from libreyolo.models.base import Family
from libreyolo.models.contract import OutputGroup, PixelContract
from libreyolo.ops.letterbox import Letterbox, LetterboxMeta
from libreyolo.ops.semantic import semantic_postprocess

SEMANTIC_EXPORT = PixelContract(
    input_name="images",
    image_input=True,  # the 8-bit image / 255: the network normalises inside
    output_names=("logits",),
    output_axes={"logits": {0: "batch"}},
    dynamic_batch=True,
    dynamic_spatial=False,
    groups=(OutputGroup("logits", "map", axis=1),),
    class_axes={"logits": (1, 0)},
    # decoded masks: the semantic task's matcher (libreyolo.comparison.matching:match_masks)
)


class SemanticFamily(Family):
    """Base of every semantic-segmentation family (task ``semantic``)."""

    task = "semantic"
    contract_kind = PixelContract
    training = "libreyolo.train.loss.semantic:SemanticLoss"  # cross-entropy, 255 ignored
    training_items = ("sem",)
    train_capture = "network"
    export = SEMANTIC_EXPORT
    stride = 32
    default_imgsz = 512
    pad_value = 114.0

    def letterbox(self, imgsz: int) -> Letterbox:
        return Letterbox(imgsz, pad_value=self.pad_value, placement="topleft", size_rounding="floor")

    def train_encode(self, net: nn.Module, images: torch.Tensor) -> torch.Tensor:
        return net.forward_logits(images)  # native resolution: the loss resizes to the masks

    def train_decode(self, net: nn.Module, features: Any, targets: torch.Tensor) -> torch.Tensor:
        return features.float()

    def export_outputs(self, outputs: Any) -> tuple[torch.Tensor, ...]:
        return (outputs["logits"] if isinstance(outputs, dict) else outputs,)

    def postprocess(self, outputs: Any, metas: list[LetterboxMeta], opts: Any = None, **kw: Any) -> list[dict]:
        o = self.task_options(opts, {k: v for k, v in kw.items() if k == "classes"})
        # validation=True (export validation): also each pixel's top-two margin, for tie decisions
        return semantic_postprocess(self.export_outputs(outputs)[0], metas, classes=o.get("classes"),
                                    margins=bool(o.get("validation", False)))
