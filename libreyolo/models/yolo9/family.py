"""The yolo9 family adapter: what predict, graphs, export and runtimes need to know."""
from __future__ import annotations

import torch
from torch import nn

from libreyolo.models.contract import DenseContract
from libreyolo.models.dense import DenseDetectFamily
from libreyolo.models.registry import register_family
from libreyolo.models.yolo9.network import SIZES, YOLOv9
from libreyolo.ops.letterbox import Letterbox


@register_family
class Yolo9(DenseDetectFamily):
    name = "yolo9"
    sizes = tuple(SIZES)
    default_size = "t"
    default_imgsz = 640
    stride = 32
    filename_pattern = r"LibreYOLO9(?P<size>[tsmc])"
    extra_meta = {"letterbox_pad": "topleft"}
    export = DenseContract(
        input_name="images",
        output_names=("predictions",),
        output_axes={"predictions": {0: "batch", 2: "anchors"}},
        dynamic_batch=True,
        dynamic_spatial=True,
        nms_input="predictions",
        class_axes={"predictions": (1, 4)},  # (B, 4 box coordinates + nc class scores, anchors)
    )
    SUPPORTS_CUDA_GRAPH = True  # verified by the graph parity matrix (docs/graph_parity.md)
    training = "libreyolo.train.loss.yolo9:DetectionLoss"  # task-aligned assigner, CIoU, DFL, BCE
    training_items = ("box_loss", "cls_loss", "dfl_loss")
    train_capture = "network"  # the whole forward and backward is one training graph
    SUPPORTS_PIPELINE_GRAPH = True  # verified by the pipeline rows of the same matrix (tests/test_graphs_gpu.py)
    nc_key = "head.cv3.0.2.bias"  # the first level's class conv: one output per class
    # the last conv of each level's box (cv2: DFL logits) and class (cv3) branch; DFL itself (softmax
    # and expectation in decode_dfl) has no Conv/Linear and stays float
    quant_exclude = ("head.cv2.*.2", "head.cv3.*.2")

    def build(self, size: str, nc: int) -> nn.Module:
        return YOLOv9(size, nc)

    def train_encode(self, net: nn.Module, images: torch.Tensor) -> list[torch.Tensor]:
        return net(images)["raw_outputs"]  # the loss reads the per-level head maps

    def letterbox(self, imgsz: int) -> Letterbox:
        return Letterbox(imgsz, pad_value=114.0, placement="topleft")

    def filename(self, size: str) -> str:
        return f"LibreYOLO9{size}"
