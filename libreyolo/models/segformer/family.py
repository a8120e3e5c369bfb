"""The segformer family adapter (semantic): sizes b0-b5, as the reference library offers them.

Everything but the network comes from the semantic contract (:mod:`libreyolo.models.semantic`).
The reference fine-tuned b0-b4 at 512 px and b5 at 640 px (ADE20K, 150 classes); its checkpoints
are named ``LibreSegformer<size>-sem.pt`` and carry no metadata beyond the common keys.
"""
from __future__ import annotations

from torch import nn

from libreyolo.models.registry import register_family
from libreyolo.models.segformer.network import SIZES, SegFormer
from libreyolo.models.semantic import SemanticFamily


@register_family
class SegFormerFamily(SemanticFamily):
    name = "segformer"
    sizes = tuple(SIZES)
    default_size = "b0"
    stride = 32  # four patch embeddings: 4 x 2 x 2 x 2
    filename_pattern = r"LibreSegformer(?P<size>b[0-5])-sem"
    quant_exclude = ("decode_head.classifier",)  # the per-pixel class logits
    nc_key = "decode_head.classifier.bias"
    # H200 graph parity matrix: every size b0-b5, fp32 and fp16, every check bit for bit
    # (bench/results/2026-12-02-graph-parity-segformer-h200.*). No whole-pipeline graph: the class
    # map is resized to each image's own size, a shape a graph cannot fix
    SUPPORTS_CUDA_GRAPH = True
    # the reference recipe (mmsegmentation's ADE20K schedule): AdamW (torch's betas) at 6e-5 with
    # weight decay 0.01, linear decay to ~0 after a 5-epoch warm-up, no mosaic, no colour jitter
    train_defaults = {"optimizer": "AdamW", "lr0": 6e-5, "momentum": 0.9, "weight_decay": 0.01,
                      "cos_lr": False, "lrf": 1e-6, "warmup_epochs": 5.0, "mosaic": 0.0,
                      "hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0}

    def build(self, size: str, nc: int) -> nn.Module:
        return SegFormer(size, nc)

    def default_imgsz_for(self, size: str) -> int:
        return 640 if size == "b5" else 512

    def filename(self, size: str) -> str:
        return f"LibreSegformer{size}-sem"
