"""Letterbox preprocessing, done on the model's device.

The image travels to the device as uint8 (a quarter of the bytes of float32) and is resized,
padded and scaled there, into one preallocated batch tensor: no full-image float copies on
the host. Resizing is bilinear with half-pixel centres (OpenCV's INTER_LINEAR convention) and
rounded to whole grey levels like an 8-bit resize, so results match OpenCV-based pipelines to
within one grey level.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
    # "bilinear": half-pixel bilinear in float, rounded to whole grey levels (OpenCV-like); or an
    # 8-bit-exact method of :func:`libreyolo.ops.stretch.resize_u8` (e.g. "pil-bilinear", Pillow's
    # antialiased filter), for which float inputs are first quantised to 8 bit
    resize: str = "bilinear"
    # the resized side: round(side * ratio) ("round") or int(side * ratio) ("floor")
    size_rounding: str = "round"
    # the network input: channel order, and the 0..255 pixel divided by ``divisor``
    # (255: [0, 1]; 1: raw 0..255 values, as YOLOX checkpoints were trained on)
    channels: str = "RGB"
    divisor: float = 255.0

    def __post_init__(self) -> None:
        from libreyolo.ops.stretch import METHODS

        if self.resize not in ("bilinear", *METHODS):
            raise ValueError(f"letterbox resize must be 'bilinear' or one of {METHODS}, got {self.resize!r}")
        if self.size_rounding not in ("round", "floor"):
            raise ValueError(f"letterbox size_rounding must be 'round' or 'floor', got {self.size_rounding!r}")
        if self.channels not in ("RGB", "BGR"):
            raise ValueError(f"letterbox channels must be 'RGB' or 'BGR', got {self.channels!r}")

    @property
    def neutral_input(self) -> float:
        """A network input value that stands for a blank image: the padding grey."""
        return self.pad_value / self.divisor

    def describe(self) -> dict[str, Any]:
        """What an artifact's metadata records about this preprocessing (a runtime checks it)."""
        d = {"placement": self.placement, "pad_value": self.pad_value, "size": self.size,
             "resize": "bilinear, half-pixel centres, rounded to 8 bit"}
        # keys beyond the defaults only when set, so artifacts exported before them still load
        if self.resize != "bilinear":
            d["resize"] = f"{self.resize}, 8-bit exact"
        if self.size_rounding != "round":
            d["size_rounding"] = self.size_rounding
        if (self.channels, self.divisor) != ("RGB", 255.0):
            d.update(channels=self.channels, divisor=self.divisor)
        return d

    def normalization(self) -> dict[str, Any]:
        return {"mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0]}

    def geometry(self, h: int, w: int) -> tuple[float, int, int, int, int]:
        ratio = min(self.size / h, self.size / w)
        if self.size_rounding == "floor":
            new_h, new_w = max(1, int(h * ratio)), max(1, int(w * ratio))
        else:
            new_h, new_w = max(1, int(round(h * ratio))), max(1, int(round(w * ratio)))
        if self.placement == "center":
            top, left = (self.size - new_h) // 2, (self.size - new_w) // 2
        else:
            top, left = 0, 0
        return ratio, new_h, new_w, top, left

    def __call__(self, images: list[torch.Tensor], dtype: torch.dtype = torch.float32,
                 out: torch.Tensor | None = None) -> tuple[torch.Tensor, list[LetterboxMeta]]:
        """``images``: CHW RGB tensors (uint8 0..255 or float 0..1) already on the target device.

        Returns the (B, 3, size, size) batch as the network takes it (``channels`` order, pixels
        divided by ``divisor``: [0, 1] by default) and one meta per image. ``out`` may be
        a preallocated batch tensor of the right shape (e.g. a CUDA graph's static input).

        Consecutive images of the same size and dtype (a video's frames, a batch of one camera)
        are placed together: one resize and one set of fills for the run, the same numbers as
        one image at a time (every output pixel is computed on its own).
        """
        device = images[0].device
        n = len(images)
        if out is None:
            out = torch.empty((n, 3, self.size, self.size), device=device, dtype=dtype)
        metas = []
        start = 0
        while start < n:
            first = images[start]
            stop = start + 1
            while stop < n and images[stop].shape == first.shape and images[stop].dtype == first.dtype:
                stop += 1
            h, w = int(first.shape[-2]), int(first.shape[-1])
            ratio, new_h, new_w, top, left = self.geometry(h, w)
            run = first.unsqueeze(0) if stop == start + 1 else torch.stack(images[start:stop])
            self._place(out[start:stop], run, new_h, new_w, top, left)
            metas += [LetterboxMeta((h, w), ratio, (float(left), float(top)))] * (stop - start)
            start = stop
        return out, metas

    def metas_for(self, h: int, w: int, n: int) -> list[LetterboxMeta]:
        """The metas of ``n`` images of ``h`` x ``w`` (what :meth:`__call__` returns for them)."""
        ratio, _, _, top, left = self.geometry(h, w)
        return [LetterboxMeta((h, w), ratio, (float(left), float(top)))] * n

    def place_batch(self, frames: torch.Tensor, bgr: bool, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The network input of a batch of same-size 8-bit frames as they were uploaded: ``frames``
        (B, H, W, 3), RGB or ``bgr``. Fixed shapes and no host work, so a CUDA graph can hold it.

        The same numbers as :meth:`__call__` on the frames as CHW RGB tensors (each reordered by
        :meth:`~libreyolo.data.sources.SourceImage.orient`): the same operations on a batch laid
        out as that path lays it out (one image keeps its reordered view's strides; several are
        stacked into a contiguous batch)."""
        if frames.shape[0] == 1:  # as one reordered image is passed on: its view, batched by unsqueeze
            x = frames[0].permute(2, 0, 1)
            x = (x.flip(0) if bgr else x).unsqueeze(0)
        else:  # as torch.stack lays out the reordered images: one contiguous batch
            x = frames.permute(0, 3, 1, 2)
            x = (x.flip(1) if bgr else x).contiguous()
        n, h, w = int(x.shape[0]), int(x.shape[-2]), int(x.shape[-1])
        _, new_h, new_w, top, left = self.geometry(h, w)
        out = torch.empty((n, 3, self.size, self.size), device=frames.device, dtype=dtype)
        self._place(out, x, new_h, new_w, top, left)
        return out

    def _place(self, canvas: torch.Tensor, imgs: torch.Tensor, new_h: int, new_w: int, top: int, left: int) -> None:
        """Resize ``imgs`` (k, C, h, w) into ``canvas`` (k, 3, size, size) at (top, left); pad the rest."""
        h, w = int(imgs.shape[-2]), int(imgs.shape[-1])
        pad = self.pad_value / self.divisor
        # grey only where the image does not go: each pixel is written once
        canvas[:, :, :top].fill_(pad)
        canvas[:, :, top + new_h:].fill_(pad)
        canvas[:, :, top:top + new_h, :left].fill_(pad)
        canvas[:, :, top:top + new_h, left + new_w:].fill_(pad)
        region = canvas[:, :, top:top + new_h, left:left + new_w]
        integer = not imgs.is_floating_point()
        if self.resize != "bilinear" and not integer:  # 8-bit methods resize 8-bit images
            imgs = imgs.mul(255.0).round_().clamp_(0, 255).to(torch.uint8)
            integer = True
        if self.channels == "BGR":
            imgs = imgs.flip(1)
        to_input = 255.0 / self.divisor  # a float source in [0, 1] -> network input
        if (new_h, new_w) != (h, w) and self.resize != "bilinear":
            from libreyolo.ops.stretch import resize_u8

            region.copy_(resize_u8(imgs, new_h, new_w, self.resize))  # the run at once, each image's numbers
            if self.divisor != 1.0:
                region.div_(self.divisor)
        elif (new_h, new_w) != (h, w):
            x = F.interpolate(imgs.float(), size=(new_h, new_w), mode="bilinear", align_corners=False)
            # an 8-bit source gives an 8-bit resize (whole grey levels), as OpenCV does
            x = x.round_().clamp_(0, 255).div_(self.divisor) if integer else x.clamp_(0, 1)
            if not integer and to_input != 1.0:
                x.mul_(to_input)
            region.copy_(x)
        else:
            region.copy_(imgs)
            if integer and self.divisor != 1.0:
                region.div_(self.divisor)
            elif not integer and to_input != 1.0:
                region.mul_(to_input)
