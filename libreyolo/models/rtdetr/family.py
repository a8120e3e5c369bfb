"""The rtdetr family adapter: what predict, graphs, export and runtimes need to know."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from libreyolo.models._detr.family import SetDetectFamily
from libreyolo.models._detr.training import train_decode as detr_train_decode
from libreyolo.models._detr.training import train_encode as detr_train_encode
from libreyolo.models.base import ExportContract, OutputGroup
from libreyolo.models.registry import register_family
from libreyolo.models.rtdetr.network import RTDETR, SIZES
from libreyolo.ops.stretch import Stretch

# DETR outputs are per-query rows; logits reach tens, so float32 artifacts are held to 1e-4
# plus a relative 1e-5, and float16 ones (TensorRT) to a looser bound: decoders drift in fp16
# (docs/export.md)
DETR_EXPORT = ExportContract(
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
    nms_input=None,
    class_axes={"pred_logits": (2, 0)},
    row_sets=("pred_logits", "pred_boxes"),
    max_moved_rows=300,  # any, as long as every row has its own match (tied selections reorder many)
    selection="decoder.enc_score_head",  # top-k of the best class score per encoder candidate
)


@register_family
class RTDETRFamily(SetDetectFamily):
    name = "rtdetr"
    sizes = tuple(SIZES)
    default_size = "r18"
    default_imgsz = 640
    stride = 32
    filename_pattern = r"LibreRTDETR-?(?P<size>r18|r34|r50)"
    # the score and box heads (encoder and decoder), and the deformable attention's score path
    # (attention weights and sampling offsets are Linear layers here)
    quant_exclude = ("decoder.enc_score_head", "decoder.enc_bbox_head.*", "decoder.dec_score_head.*",
                     "decoder.dec_bbox_head.*", "decoder.decoder.layers.*.cross_attn.attention_weights",
                     "decoder.decoder.layers.*.cross_attn.sampling_offsets")
    export = DETR_EXPORT
    nc_key = "decoder.enc_score_head.bias"
    training = "libreyolo.train.loss.detr:DetrLoss"  # Hungarian matching, denoising groups, VFL + L1 + GIoU
    training_items = ("vfl_loss", "l1_loss", "giou_loss")
    train_capture = "encoder"  # the decoder's query count depends on the targets (denoising groups)
    # the DETR recipe: AdamW at 1e-4 with weight decay 1e-4 and tight clipping, no mosaic
    train_defaults = {"optimizer": "AdamW", "lr0": 1e-4, "weight_decay": 1e-4, "clip": 0.1, "mosaic": 0.0}
    SUPPORTS_CUDA_GRAPH = True  # H200 graph parity matrix passed every check (bench/results/2026-12-01-*parity*)
    SUPPORTS_PIPELINE_GRAPH = True  # top-k postprocessing in the graph: H200 pipeline parity rows (2026-12-04)

    def build(self, size: str, nc: int) -> nn.Module:
        return RTDETR(size, nc)

    def train_encode(self, net: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return detr_train_encode(net, images)  # backbone + hybrid encoder: captured by training graphs

    def train_decode(self, net: nn.Module, features: tuple[torch.Tensor, ...], targets: torch.Tensor) -> dict:
        return detr_train_decode(net, features, targets)  # query selection, denoising, all layers: eager

    def export_outputs(self, outputs: Any) -> tuple[torch.Tensor, ...]:
        return outputs["pred_logits"], outputs["pred_boxes"]

    def letterbox(self, imgsz: int) -> Stretch:
        # the reference resizes with cv2.INTER_LINEAR to imgsz x imgsz, no letterbox, no mean/std
        return Stretch(imgsz, method="opencv-linear")

    def filename(self, size: str) -> str:
        return f"LibreRTDETR{size}"
