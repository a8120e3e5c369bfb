"""The restore contract: what an image-restoration (super-resolution) family declares, once.

A restore family subclasses :class:`RestoreFamily`, sets its sizes and file-name pattern and
implements ``build``. Its network takes (B, 3, H, W) RGB in [0, 1] at the image's own size (any
mean is applied inside the network) and returns the restored (B, 3, scale*H, scale*W), not
clamped. Everything else is shared:

- preprocessing: :class:`~libreyolo.ops.pad.PadToMultiple`: no resize; reflect padding at the
  bottom and right to a multiple of :attr:`RestoreFamily.stride` (the window), a mixed-size batch
  to its largest image; ``imgsz`` is not used by predict (an image is restored at its own size),
  only as the fixed input side of an export;
- postprocessing: :meth:`RestoreFamily.postprocess` crops each output to ``scale`` times its
  image's size, clamps to [0, 1] and rounds to 8 bit -> ``{"image": (scale*h, scale*w, 3) uint8}``;
- export: one output ``image`` (B, 3, scale*S, scale*S), judged as pixels in [0, 1]; decoded
  images are compared by ``libreyolo.export.match_images:match_images``.

Training is not offered (the real-world models need degradation and GAN pipelines).
"""
from __future__ import annotations

from typing import Any, ClassVar

import torch

from libreyolo.models.base import ExportContract, Family, OutputGroup
from libreyolo.ops.pad import PadMeta, PadToMultiple

RESTORE_EXPORT = ExportContract(
    input_name="images",
    image_input=True,  # the 8-bit image / 255: the network subtracts its mean inside
    output_names=("image",),
    # ONNX takes any height and width that are multiples of the window (predict pads to them)
    output_axes={"image": {0: "batch", 2: "out_height", 3: "out_width"}},
    dynamic_batch=True,
    dynamic_spatial=True,
    groups=(OutputGroup("image", "image", axis=1),),
    class_axes={},
)


class RestoreFamily(Family):
    """Base of every image-restoration family (task ``restore``)."""

    task = "restore"
    export = RESTORE_EXPORT
    scale: ClassVar[int] = 4
    stride = 8           # the side multiple the network needs (its attention window)
    default_imgsz = 64   # the export input side when none is given (the reference's build size)
    nc_key = None

    def letterbox(self, imgsz: int) -> PadToMultiple:
        return PadToMultiple(self.stride, size=imgsz)

    def check_imgsz(self, value: Any) -> int:
        """``imgsz`` does not change predict() (each image is restored at its own size); it is the
        input side of an export, so it must be a multiple of the window (``stride``)."""
        return super().check_imgsz(value)

    def export_outputs(self, outputs: Any) -> tuple[torch.Tensor, ...]:
        return (outputs["image"] if isinstance(outputs, dict) else outputs,)

    def postprocess(self, outputs: Any, metas: list[PadMeta], opts: Any = None, **kw: Any) -> list[dict]:
        self.task_options(opts, kw)  # restoration takes no options: any given is refused there
        image = self.export_outputs(outputs)[0]
        out = []
        for i, meta in enumerate(metas):
            h, w = meta.orig_shape
            x = image[i, :, :h * self.scale, :w * self.scale].float().clamp(0.0, 1.0)
            out.append({"image": x.mul(255.0).round().to(torch.uint8).permute(1, 2, 0).contiguous()})
        return out
