"""The classify contract: what an image-classification family declares, once.

A classifier subclasses :class:`ClassifyFamily`, sets its sizes, file-name pattern and
preprocessing constants (``crop_pct``, ``mean``, ``std``, ``fixed_imgsz``) and implements
``build``. Its network takes the normalised (B, 3, S, S) batch and returns logits (B, nc),
a tensor or ``{"logits": tensor}``. Everything else is shared:

- preprocessing: :class:`~libreyolo.ops.classify.ResizeCrop` (resize the shorter side to
  ``imgsz / crop_pct`` with Pillow's bicubic, centre crop, normalise), on the device;
- postprocessing: softmax -> ``{"probs": (nc,)}`` per image -> ``Results.probs``;
- export: one output ``logits`` (B, nc); artifacts carry logits, runtimes apply the same
  softmax; the validator compares logits raw and the top-5 classes decoded
  (:func:`libreyolo.comparison.matching.match_classes`).
"""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from libreyolo.errors import ArgumentError
from libreyolo.models.base import Family
from libreyolo.models.contract import ImageContract, OutputGroup
from libreyolo.ops.classify import IMAGENET_MEAN, IMAGENET_STD, ResizeCrop, classify_postprocess
from libreyolo.ops.letterbox import LetterboxMeta

CLASSIFY_EXPORT = ImageContract(
    tensor_rank=4,  # ViT/DeiT split q/k/v on the channel axis: (B, heads, N, dim), nothing above rank 4
    input_name="images",
    image_input=False,  # normalised with a per-channel mean/std: a float tensor, not an 8-bit image
    output_names=("logits",),
    output_axes={"logits": {0: "batch"}},
    dynamic_batch=True,
    dynamic_spatial=False,
    groups=(OutputGroup("logits", "logit", axis=1),),
    class_axes={"logits": (1, 0)},
    decoded_match="libreyolo.comparison.matching:match_classes",
)


class ClassifyFamily(Family):
    """Base of every image-classification family (task ``classify``)."""

    task = "classify"
    contract_kind = ImageContract
    training = "libreyolo.train.loss.classify:ClassificationLoss"  # label-smoothed cross-entropy
    default_imgsz = 224
    stride = 16
    export = CLASSIFY_EXPORT
    nc_key = "head.bias"
    crop_pct: ClassVar[float] = 0.875
    mean: ClassVar[tuple[float, float, float]] = IMAGENET_MEAN
    std: ClassVar[tuple[float, float, float]] = IMAGENET_STD
    # the only input size the network accepts (fixed position embeddings), or None for any
    # multiple of ``stride``
    fixed_imgsz: ClassVar[int | None] = 224
    # why the size is fixed, for the error message
    fixed_imgsz_reason: ClassVar[str] = "its position embedding is fixed"

    train_capture = "network"

    def train_decode(self, net: nn.Module, features: Any, targets: torch.Tensor) -> torch.Tensor:
        logits = features if isinstance(features, torch.Tensor) else self.named_outputs(features)["logits"]
        return logits.float()

    def letterbox(self, imgsz: int) -> ResizeCrop:
        return ResizeCrop(imgsz, crop_pct=self.crop_pct, mean=self.mean, std=self.std)

    def check_imgsz(self, value: Any) -> int:
        if self.fixed_imgsz is None:
            return super().check_imgsz(value)
        if isinstance(value, (list, tuple)) and len(value) == 2 and value[0] == value[1]:
            value = value[0]
        if isinstance(value, bool) or value != self.fixed_imgsz:
            raise ArgumentError(
                f"{self.name} takes {self.fixed_imgsz}x{self.fixed_imgsz} inputs only ({self.fixed_imgsz_reason}, "
                f"as in the reference library), got imgsz={value!r}; use imgsz={self.fixed_imgsz}"
            )
        return self.fixed_imgsz

    def export_outputs(self, outputs: Any) -> tuple[torch.Tensor, ...]:
        return (outputs["logits"] if isinstance(outputs, dict) else outputs,)

    def postprocess(self, outputs: dict[str, torch.Tensor], metas: list[LetterboxMeta], opts: Any = None,
                    **kw: Any) -> list[dict]:
        return classify_postprocess(outputs["logits"], metas)
