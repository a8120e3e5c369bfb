"""The yolox family adapter: what predict, graphs, export and runtimes need to know.

Preprocessing, as the reference library does it for YOLOX (measured on its ``predict()``,
byte for byte): Pillow's bilinear resize (antialiased when shrinking) of the 8-bit image to
``int(side * ratio)``, placed top-left on a grey-114 square, handed to the network as **BGR
values in 0..255** (not scaled to [0, 1]). Postprocessing: one label per box (its best class,
score = objectness x class probability), then the shared detection postprocessing.
"""
from __future__ import annotations

import torch
from torch import nn

from libreyolo.models.contract import DenseContract, OutputGroup
from libreyolo.models.dense import DenseDetectFamily
from libreyolo.models.registry import register_family
from libreyolo.models.yolox.network import SIZES, YOLOX, decode
from libreyolo.ops.letterbox import Letterbox

# the input size the reference trains and predicts at when a checkpoint does not say
_DEFAULT_IMGSZ = {"n": 416, "t": 416, "s": 640, "m": 640, "l": 640, "x": 640}


@register_family
class Yolox(DenseDetectFamily):
    name = "yolox"
    sizes = tuple(SIZES)
    default_size = "s"
    default_imgsz = 640
    stride = 32
    filename_pattern = r"LibreYOLOX(?P<size>[ntsmlx])"
    export = DenseContract(
        input_name="images",
        input_color="BGR",
        input_scale=1.0,  # 0..255 pixel values
        # not an 8-bit RGB image in [0, 1]: formats with image-typed inputs (CoreML) get a float tensor
        image_input=False,
        output_names=("predictions",),
        output_axes={"predictions": {0: "batch", 2: "anchors"}},
        dynamic_batch=True,
        dynamic_spatial=True,
        nms_input="predictions",
        class_axes={"predictions": (1, 4)},  # (B, 4 box coordinates + nc class scores, anchors)
        # only each box's best class has a score: which class holds it is a tie decision near a tie
        groups=(OutputGroup("predictions", "box", axis=1, start=0, stop=4),
                OutputGroup("predictions", "score", axis=1, start=4, exclusive=True)),
    )
    # the forward does no host work (decode builds its grids from shapes, on the device); every
    # check of the parity matrix passes on the H200 for every size, the fp16 row included
    # (docs/graph_parity.md), and so do the whole-pipeline checks
    SUPPORTS_CUDA_GRAPH = True
    SUPPORTS_PIPELINE_GRAPH = True
    # decode exponentiates the box-size logits: seeded at unit scale, noise probes at 0-255 push
    # some past 11 and the boxes past fp16's 65504
    parity_seed_gains = {"head.reg_preds.": 0.02}
    nc_key = "head.cls_preds.0.bias"  # the first level's class conv: one output per class
    quant_exclude = ("head.cls_preds.*", "head.reg_preds.*", "head.obj_preds.*")  # the final 1x1 predictions
    training = "libreyolo.train.loss.yolox:YoloxLoss"  # SimOTA assignment, IoU, objectness and class BCE
    training_items = ("iou_loss", "obj_loss", "cls_loss")
    train_capture = "network"  # the whole forward and backward is one training graph

    def build(self, size: str, nc: int) -> nn.Module:
        return YOLOX(size, nc)

    def train_encode(self, net: nn.Module, images: torch.Tensor) -> list[torch.Tensor]:
        return net.forward_logits(images)  # per-level maps with objectness and class logits, for the loss

    def default_imgsz_for(self, size: str) -> int:
        return _DEFAULT_IMGSZ.get(size, self.default_imgsz)

    def export_outputs(self, outputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """The per-level maps decoded into ``predictions`` (B, 4 + nc, N): in every artifact and graph."""
        return (decode(outputs),)

    def tie_evidence(self, outputs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """``predictions`` with every class's score, not only the best one's (see the base class)."""
        return {"predictions": decode(outputs, best_only=False)}

    def letterbox(self, imgsz: int) -> Letterbox:
        return Letterbox(imgsz, pad_value=114.0, placement="topleft", resize="pil-bilinear", size_rounding="floor",
                         channels="BGR", divisor=1.0)

    def filename(self, size: str) -> str:
        return f"LibreYOLOX{size}"
