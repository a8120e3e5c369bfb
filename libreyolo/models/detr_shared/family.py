"""What the set-prediction detectors (rtdetr, dfine, lwdetr, rfdetr) share as families: the export contract, the
training recipe and hooks, and the postprocessing.

Their outputs are ``pred_logits`` (B, Q, nc) and ``pred_boxes`` (B, Q, 4); predictions are the
best (query, class) pairs, no NMS (:mod:`libreyolo.ops.topk`). The fixed-shape stage a
whole-pipeline CUDA graph captures and the eager postprocessing are one function.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from libreyolo.models.base import Family
from libreyolo.models.contract import OutputGroup, SetContract
from libreyolo.models.detr_shared.training import lw_train_decode, lw_train_encode, train_decode, train_encode
from libreyolo.ops.stretch import Stretch
from libreyolo.ops.topk import SetPostprocess, topk_postprocess_later

_DEVICE_POSTPROCESS = SetPostprocess("pred_logits", "pred_boxes")

# DETR outputs are per-query rows; logits reach tens, so float32 artifacts are held to 1e-4
# plus a relative 1e-5, and float16 ones (TensorRT) to a looser bound: decoders drift in fp16
# (docs/export.md)
DETR_EXPORT = SetContract(
    tensor_rank=4,  # deformable sampling in the flat layout: (B, queries, heads, 2 * points) (NCNN holds 4 axes)
    input_name="images",
    output_names=("pred_logits", "pred_boxes"),
    output_axes={"pred_logits": {0: "batch"}, "pred_boxes": {0: "batch"}},
    dynamic_batch=True,
    dynamic_spatial=False,  # anchors and position embeddings are built for the exported size
    # logits per query and class; boxes normalised (cx, cy, w, h) as sigmoid outputs: their error is
    # the refined logit's times the sigmoid's slope, so they are judged absolutely in [0, 1] (scaled by
    # a small box's extent, a correct ONNX Runtime export of rtdetr-r18 failed at 1.1x)
    groups=(OutputGroup("pred_logits", "logit", axis=-1), OutputGroup("pred_boxes", "sigmoid", axis=-1)),
    min_cosine={"fp32": 0.99999, "fp16": 0.99},
    class_axes={"pred_logits": (2, 0)},
    row_sets=("pred_logits", "pred_boxes"),
    max_moved_rows=300,  # any, as long as every row has its own match (tied selections reorder many)
    selection="decoder.enc_score_head",  # top-k of the best class score per encoder candidate
)
# kept in float for INT8: the score and box heads (encoder and decoder), and the deformable
# attention's score path (attention weights and sampling offsets are Linear layers here)
DETR_QUANT_EXCLUDE = ("decoder.enc_score_head", "decoder.enc_bbox_head.*", "decoder.dec_score_head.*",
                      "decoder.dec_bbox_head.*", "decoder.decoder.layers.*.cross_attn.attention_weights",
                      "decoder.decoder.layers.*.cross_attn.sampling_offsets")


class SetDetectFamily(Family):
    """Base of the DETR-line families (task ``detect``): their export contract, training recipe and
    hooks, and postprocessing. A family adds its network, sizes, letterbox and file names."""

    task = "detect"
    contract_kind = SetContract
    export = DETR_EXPORT
    quant_exclude = DETR_QUANT_EXCLUDE
    nc_key = "decoder.enc_score_head.bias"
    training = "libreyolo.train.loss.detr:DetrLoss"  # Hungarian matching, denoising groups, VFL + L1 + GIoU
    training_items = ("vfl_loss", "l1_loss", "giou_loss")
    train_capture = "encoder"  # the decoder's query count depends on the targets (denoising groups)
    # the DETR recipe: AdamW at 1e-4 with weight decay 1e-4 and tight clipping, no mosaic
    train_defaults = {"optimizer": "AdamW", "lr0": 1e-4, "weight_decay": 1e-4, "clip": 0.1, "mosaic": 0.0}

    def train_encode(self, net: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return train_encode(net, images)  # backbone + hybrid encoder: captured by training graphs

    def train_decode(self, net: nn.Module, features: tuple[torch.Tensor, ...], targets: torch.Tensor) -> dict:
        return train_decode(net, features, targets)  # query selection, denoising, all layers: eager

    def export_outputs(self, outputs: Any) -> tuple[torch.Tensor, ...]:
        return outputs["pred_logits"], outputs["pred_boxes"]

    def device_postprocess(self) -> SetPostprocess:
        return _DEVICE_POSTPROCESS

    def postprocess(self, outputs: dict[str, torch.Tensor], metas: list, opts: Any = None, **kw: Any) -> list[dict]:
        return self.postprocess_later(outputs, metas, opts, **kw)()

    def postprocess_later(self, outputs: dict[str, torch.Tensor], metas: list, opts: Any = None,
                          **kw: Any) -> Callable[[], list[dict]]:
        o = self.task_options(opts, kw)
        return topk_postprocess_later(outputs["pred_logits"], outputs["pred_boxes"], metas, conf=o.conf,
                                      max_det=o.max_det, classes=o.classes)


# the LW-DETR line (lwdetr, rfdetr): the same outputs and postprocessing, other module names; the
# query selection scores the first encoder class head
LW_EXPORT = replace(DETR_EXPORT, image_input=False,  # ImageNet mean/std follow the resize
                    tensor_rank=6,  # LW-DETR's ViT window partition (rfdetr declares its own)
                    selection="transformer.enc_out_class_embed.0",
                    rows_follow_candidates=False)  # learned per-query content; only reference boxes are gathered
LW_QUANT_EXCLUDE = ("class_embed", "bbox_embed.*", "transformer.enc_out_class_embed.*",
                    "transformer.enc_out_bbox_embed.*", "transformer.decoder.layers.*.cross_attn.attention_weights",
                    "transformer.decoder.layers.*.cross_attn.sampling_offsets")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


# the LW-DETR line's fine-tuning recipe (the reference's RF-DETR trainer): AdamW at 1e-4 (betas 0.9,
# 0.999), weight decay 1e-4, gradient clipping at 0.1, a constant rate without warm-up (its step
# decay comes after 100 epochs), an effective batch of 16, no mosaic
LW_TRAIN_DEFAULTS = {"optimizer": "AdamW", "lr0": 1e-4, "momentum": 0.9, "weight_decay": 1e-4, "clip": 0.1,
                     "lrf": 1.0, "cos_lr": False, "warmup_epochs": 0.0, "nbs": 16, "mosaic": 0.0}


class LWDetectFamily(SetDetectFamily):
    """Base of the LW-DETR line's families: a ViT encoder, the shared projector and decoder
    (:mod:`libreyolo.models.detr_shared.lw`), ImageNet-normalised stretched inputs. Training (where a
    family declares its ``training`` loss): Group-DETR queries, the Hungarian matcher per group,
    IA-BCE + L1 + GIoU on every decoder layer and the encoder selection
    (:class:`libreyolo.train.loss.detr.IaBceLoss`), the recipe ``LW_TRAIN_DEFAULTS``, an EMA of
    decay 0.993 ramped over 100 updates."""

    export = LW_EXPORT
    quant_exclude = LW_QUANT_EXCLUDE
    nc_key = "class_embed.bias"
    training = None
    training_items = ("ia_bce_loss", "l1_loss", "giou_loss")
    train_capture = "encoder"  # ViT + projector; the group selection, decoder and matcher stay eager
    train_defaults: dict[str, Any] = LW_TRAIN_DEFAULTS
    train_ema = (0.993, 100.0)
    resize_method = "opencv-linear"

    def letterbox(self, imgsz: int) -> Stretch:
        return Stretch(imgsz, method=self.resize_method, mean=IMAGENET_MEAN, std=IMAGENET_STD)

    def network_input(self, images: torch.Tensor) -> torch.Tensor:
        """A dataset's 8-bit RGB batch as the network takes it: [0, 1], ImageNet mean/std."""
        mean = torch.tensor(IMAGENET_MEAN, device=images.device).view(1, 3, 1, 1)
        std = torch.tensor(IMAGENET_STD, device=images.device).view(1, 3, 1, 1)
        return (images.float() / 255.0 - mean) / std

    def train_encode(self, net: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return lw_train_encode(net, images)

    def train_decode(self, net: nn.Module, features: tuple[torch.Tensor, ...], targets: torch.Tensor) -> dict:
        return lw_train_decode(net, features, targets)

    def device_postprocess(self) -> None:
        return None  # no whole-pipeline graph: the heads are wider than nc (see the families)
