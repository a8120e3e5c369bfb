"""The yolo9_e2e family adapter: YOLOv9 with the one-to-one head, decoded by a top-k (no NMS).

Preprocessing (top-left letterbox, pad 114), input sizes and the ``predictions`` layout are YOLOv9's;
the decoding is the one-to-one families' (:class:`libreyolo.models.dense.One2OneDetectFamily`).
"""
from __future__ import annotations

from torch import nn

from libreyolo.models.contract import DenseContract
from libreyolo.models.dense import One2OneDetectFamily
from libreyolo.models.registry import register_family
from libreyolo.models.yolo9.network import SIZES
from libreyolo.models.yolo9_e2e.network import YOLOv9E2E
from libreyolo.ops.letterbox import Letterbox


@register_family
class Yolo9E2E(One2OneDetectFamily):
    name = "yolo9_e2e"
    sizes = tuple(SIZES)
    default_size = "t"
    default_imgsz = 640
    stride = 32
    filename_pattern = r"LibreYOLO9E2E(?P<size>[tsmc])"
    extra_meta = {"letterbox_pad": "topleft"}
    export = DenseContract(
        input_name="images",
        output_names=("predictions",),
        output_axes={"predictions": {0: "batch", 2: "anchors"}},
        dynamic_batch=True,
        dynamic_spatial=True,
        nms_input=None,
        nms_free="a one-to-one head: one box per object, decoded by a top-k",
        class_axes={"predictions": (1, 4)},  # (B, 4 box coordinates + nc class scores, anchors)
    )
    # the network is YOLOv9's with other head towers, but no GPU graph parity run has checked it (nor the
    # top-k stage inside a pipeline graph): off until one does
    SUPPORTS_CUDA_GRAPH = True  # H200 parity matrix, every size and check (bench/results/2026-12-07-graph-parity-new-*)
    SUPPORTS_PIPELINE_GRAPH = True  # the pipeline rows of the same matrix passed for every size
    training = None  # the dual one-to-many / one-to-one assignment loss is not implemented here
    nc_key = "head.one2one_cv3.0.2.bias"  # the one-to-one class conv of the first level
    # the last conv of each level's box and class towers, of both heads
    quant_exclude = ("head.cv2.*.2", "head.cv3.*.2", "head.one2one_cv2.*.2", "head.one2one_cv3.*.2")

    def build(self, size: str, nc: int) -> nn.Module:
        return YOLOv9E2E(size, nc)

    def letterbox(self, imgsz: int) -> Letterbox:
        return Letterbox(imgsz, pad_value=114.0, placement="topleft")

    def filename(self, size: str) -> str:
        return f"LibreYOLO9E2E{size}"
