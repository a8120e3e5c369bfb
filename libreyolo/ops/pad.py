"""Padding preprocessing for models that keep an image at its own size (image restoration).

Nothing is resized: each image becomes float RGB in [0, 1] and is padded at the bottom and right,
by reflection (replicated where reflection cannot: a side of 1 pixel, or a pad not smaller than the
side), to a multiple of the network's window. A batch of images of different sizes is padded to
the largest (rounded up to the multiple), so a smaller image there sees more reflected context
than it would alone: its restored pixels near the padded edges can differ from a run on its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["PadMeta", "PadToMultiple", "reflect_pad_to", "round_up"]


@dataclass(frozen=True)
class PadMeta:
    """Where one image sits in the padded batch: at the top left, ``orig_shape`` (h, w) pixels."""

    orig_shape: tuple[int, int]


def reflect_pad_to(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """(..., C, H, W) padded at the bottom and right to (h, w): reflected, else replicated."""
    ih, iw = int(x.shape[-2]), int(x.shape[-1])
    ph, pw = h - ih, w - iw
    if ph < 0 or pw < 0:
        raise ValueError(f"cannot pad a {ih}x{iw} image to the smaller {h}x{w}")
    if not ph and not pw:
        return x
    mode = "reflect" if ih > 1 and iw > 1 and ph < ih and pw < iw else "replicate"
    squeeze = x.ndim == 3
    y = F.pad(x.unsqueeze(0) if squeeze else x, (0, pw, 0, ph), mode=mode)
    return y.squeeze(0) if squeeze else y


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclass(frozen=True)
class PadToMultiple:
    """``pre(images, dtype=...) -> (batch, metas)`` keeping every image at its own size.

    ``multiple``: the side multiple the network needs (its window). ``size``: not used to
    preprocess; it is the fixed input side of an exported artifact (recorded by :meth:`describe`).
    """

    multiple: int
    size: int = 64
    # set by :meth:`fixed`: pad every image to exactly size x size (an artifact of static shape);
    # the text says why when an image is larger
    fixed_reason: str | None = None

    def fixed(self, reason: str) -> PadToMultiple:
        """This preprocessing for an input of exactly ``size`` x ``size`` (a static-shape artifact):
        images are padded to it; a larger image is an :class:`ArgumentError` starting with ``reason``."""
        return PadToMultiple(self.multiple, self.size, fixed_reason=reason)

    @property
    def neutral_input(self) -> float:
        return 0.0  # a black image

    def describe(self) -> dict[str, Any]:
        return {"resize": "none", "pad": f"reflect, bottom/right, to a multiple of {self.multiple}",
                "size": self.size}

    def normalization(self) -> dict[str, Any]:
        return {"mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0]}

    def export_sample(self, image: torch.Tensor) -> torch.Tensor:
        """The part of a CHW image an export is validated on: its central ``size`` x ``size`` crop
        (the artifact's example input side; a smaller image is used whole)."""
        h, w = int(image.shape[-2]), int(image.shape[-1])
        top, left = max(0, (h - self.size) // 2), max(0, (w - self.size) // 2)
        return image[..., top:top + self.size, left:left + self.size]

    def __call__(self, images: list[torch.Tensor], dtype: torch.dtype = torch.float32,
                 out: torch.Tensor | None = None) -> tuple[torch.Tensor, list[PadMeta]]:
        """``images``: CHW RGB tensors (uint8 0..255 or float 0..1) on the target device."""
        h = round_up(max(int(im.shape[-2]) for im in images), self.multiple)
        w = round_up(max(int(im.shape[-1]) for im in images), self.multiple)
        if self.fixed_reason is not None:
            if h > self.size or w > self.size:
                from libreyolo.errors import ArgumentError

                big = max(images, key=lambda im: int(im.shape[-2]) * int(im.shape[-1]))
                raise ArgumentError(f"{self.fixed_reason}; got a {int(big.shape[-2])}x{int(big.shape[-1])} image: "
                                    f"export with imgsz of at least {max(h, w)} or as ONNX with dynamic=True "
                                    "(any size)")
            h = w = self.size
        if out is None:
            out = torch.empty((len(images), 3, h, w), device=images[0].device, dtype=dtype)
        elif tuple(out.shape[-2:]) != (h, w):
            raise ValueError(f"the batch needs a {h}x{w} input, the given tensor is {tuple(out.shape)}")
        for i, im in enumerate(images):
            x = im.float().div(255.0) if not im.is_floating_point() else im.float()
            out[i].copy_(reflect_pad_to(x, h, w))
        return out, [PadMeta((int(im.shape[-2]), int(im.shape[-1]))) for im in images]
