"""Letterbox preprocessing, done on the model's device.

The image travels to the device as uint8 (a quarter of the bytes of float32) and is resized,
padded and scaled there, into one preallocated batch tensor: no full-image float copies on
the host. Resizing is bilinear with half-pixel centres (OpenCV's INTER_LINEAR convention) and
rounded to whole grey levels like an 8-bit resize, so results match OpenCV-based pipelines to
within one grey level.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class LetterboxMeta:
    """How one image was placed into the network input, to map boxes back."""

    orig_shape: tuple[int, int]  # (h, w) of the source image
    ratio: float                 # resize factor applied to the source
    pad: tuple[float, float]     # (left, top) offset of the resized image inside the input

    def to_original(self, boxes: torch.Tensor) -> torch.Tensor:
        """Map xyxy boxes from network-input pixels back to source pixels (new tensor)."""
        left, top = self.pad
        out = boxes.clone()
        out[..., 0::2] = (out[..., 0::2] - left) / self.ratio
        out[..., 1::2] = (out[..., 1::2] - top) / self.ratio
        return out

    def content_box(self) -> tuple[float, float, float, float]:
        """The source image's extent in network-input pixels (x1, y1, x2, y2)."""
        h, w = self.orig_shape
        left, top = self.pad
        return left, top, left + w * self.ratio, top + h * self.ratio


@dataclass(frozen=True)
class Letterbox:
    """Resize keeping the aspect ratio, then pad to a square ``size``.

    ``placement`` is "topleft" (pad right and bottom, LibreYOLO's YOLOv9 convention) or
    "center". ``pad_value`` is in 0..255 grey levels.
    """

    size: int
    pad_value: float = 114.0
    placement: str = "topleft"

    def geometry(self, h: int, w: int) -> tuple[float, int, int, int, int]:
        ratio = min(self.size / h, self.size / w)
        new_h, new_w = max(1, int(round(h * ratio))), max(1, int(round(w * ratio)))
        if self.placement == "center":
            top, left = (self.size - new_h) // 2, (self.size - new_w) // 2
        else:
            top, left = 0, 0
        return ratio, new_h, new_w, top, left

    def __call__(self, images: list[torch.Tensor], dtype: torch.dtype = torch.float32,
                 out: torch.Tensor | None = None) -> tuple[torch.Tensor, list[LetterboxMeta]]:
        """``images``: CHW RGB tensors (uint8 0..255 or float 0..1) already on the target device.

        Returns the (B, 3, size, size) batch in [0, 1] and one meta per image. ``out`` may be
        a preallocated batch tensor of the right shape (e.g. a CUDA graph's static input).
        """
        device = images[0].device
        n = len(images)
        if out is None:
            out = torch.empty((n, 3, self.size, self.size), device=device, dtype=dtype)
        pad = self.pad_value / 255.0
        metas = []
        for i, img in enumerate(images):
            h, w = int(img.shape[-2]), int(img.shape[-1])
            ratio, new_h, new_w, top, left = self.geometry(h, w)
            canvas = out[i]
            # grey only where the image does not go: each pixel is written once
            canvas[:, :top].fill_(pad)
            canvas[:, top + new_h:].fill_(pad)
            canvas[:, top:top + new_h, :left].fill_(pad)
            canvas[:, top:top + new_h, left + new_w:].fill_(pad)
            region = canvas[:, top:top + new_h, left:left + new_w]
            integer = not img.is_floating_point()
            if (new_h, new_w) != (h, w):
                x = F.interpolate(img.unsqueeze(0).float(), size=(new_h, new_w), mode="bilinear", align_corners=False)
                # an 8-bit source gives an 8-bit resize (whole grey levels), as OpenCV does
                x = x.round_().clamp_(0, 255).div_(255.0) if integer else x.clamp_(0, 1)
                region.copy_(x[0])
            else:
                region.copy_(img)
                if integer:
                    region.div_(255.0)
            metas.append(LetterboxMeta((h, w), ratio, (float(left), float(top))))
        return out, metas
