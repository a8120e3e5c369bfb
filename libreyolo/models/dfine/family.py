"""The dfine family adapter: what predict, graphs, export and runtimes need to know."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from libreyolo.models._detr.family import SetDetectFamily
from libreyolo.models._detr.training import train_decode as detr_train_decode
from libreyolo.models._detr.training import train_encode as detr_train_encode
from libreyolo.models.dfine.network import DFINE, SIZES
from libreyolo.models.registry import register_family
from libreyolo.models.rtdetr.family import DETR_EXPORT
from libreyolo.ops.stretch import Stretch


@register_family
class DFINEFamily(SetDetectFamily):
    name = "dfine"
    sizes = tuple(SIZES)
    default_size = "n"
    default_imgsz = 640
    stride = 32
    filename_pattern = r"LibreDFINE(?P<size>[nsmlx])"
    # the score and box heads (encoder and decoder), and the deformable attention's score path
    # (attention weights and sampling offsets are Linear layers here)
    quant_exclude = ("decoder.enc_score_head", "decoder.enc_bbox_head.*", "decoder.dec_score_head.*",
                     "decoder.dec_bbox_head.*", "decoder.decoder.layers.*.cross_attn.attention_weights",
                     "decoder.decoder.layers.*.cross_attn.sampling_offsets",
                     "decoder.pre_bbox_head.*", "decoder.decoder.lqe_layers.*")
    export = DETR_EXPORT
    nc_key = "decoder.enc_score_head.bias"
    infinite_ok_keys = ("decoder.anchors",)  # invalid anchors are +inf in reference checkpoints
    training = "libreyolo.train.loss.detr:DetrLoss"  # Hungarian matching, denoising groups, VFL + L1 + GIoU
    training_items = ("vfl_loss", "l1_loss", "giou_loss", "fgl_loss")
    train_capture = "encoder"  # the decoder's query count depends on the targets (denoising groups)
    # the DETR recipe: AdamW at 1e-4 with weight decay 1e-4 and tight clipping, no mosaic
    train_defaults = {"optimizer": "AdamW", "lr0": 1e-4, "weight_decay": 1e-4, "clip": 0.1, "mosaic": 0.0}
    SUPPORTS_CUDA_GRAPH = True  # H200 graph parity matrix passed every check (bench/results/2026-12-01-*parity*)
    SUPPORTS_PIPELINE_GRAPH = True  # top-k postprocessing in the graph: H200 pipeline parity rows (2026-12-04)

    def build(self, size: str, nc: int) -> nn.Module:
        return DFINE(size, nc)

    def train_encode(self, net: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return detr_train_encode(net, images)  # backbone + hybrid encoder: captured by training graphs

    def train_decode(self, net: nn.Module, features: tuple[torch.Tensor, ...], targets: torch.Tensor) -> dict:
        return detr_train_decode(net, features, targets)  # query selection, denoising, all layers: eager

    def export_outputs(self, outputs: Any) -> tuple[torch.Tensor, ...]:
        return outputs["pred_logits"], outputs["pred_boxes"]

    def letterbox(self, imgsz: int) -> Stretch:
        # the reference resizes with Pillow's bilinear filter to imgsz x imgsz, no letterbox, no mean/std
        return Stretch(imgsz, method="pil-bilinear")

    def filename(self, size: str) -> str:
        return f"LibreDFINE{size}"
