"""Classification pre- and postprocessing, done on the model's device.

Preprocessing is the ImageNet evaluation recipe the reference LibreYOLO library applies to its
classifiers: resize the shorter side to ``floor(size / crop_pct)`` with Pillow's antialiased
bicubic filter, cut the central ``size`` x ``size`` square, scale to [0, 1] and normalise with a
per-channel mean and std. The resize reproduces Pillow's 8-bit resampler exactly (same filter
taps, same 22-bit fixed-point coefficients, horizontal pass rounded to 8 bits before the
vertical one), so an image gives bit-identical network input whether it went through Pillow on
the host or through :class:`ResizeCrop` on a GPU. Only the pixels inside the crop are computed.

Postprocessing turns logits into probabilities (softmax in float32).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from libreyolo.ops.letterbox import LetterboxMeta

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_PRECISION_BITS = 22  # Pillow's fixed-point precision for 8-bit resampling (32 - 8 - 2)


def _bicubic(x: torch.Tensor) -> torch.Tensor:
    """Keys' cubic convolution kernel with a = -0.5 (Pillow's BICUBIC), support 2."""
    a = -0.5
    x = x.abs()
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = (((x - 5.0) * x + 8.0) * x - 4.0) * a
    return torch.where(x < 1.0, near, torch.where(x < 2.0, far, torch.zeros_like(x)))


@lru_cache(maxsize=64)
def _taps(in_size: int, out_size: int, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Source indices and weights of output pixels ``first .. first + count`` of a 1-D resize.

    Returns (index (count, K) long, float weights (count, K) float64 summing to 1, fixed-point
    weights (count, K) int32), on the CPU. Taps past the source edge have weight 0 and a
    clamped index.
    """
    scale = in_size / out_size
    filter_scale = max(scale, 1.0)
    support = 2.0 * filter_scale
    k = int(math.ceil(support)) * 2 + 1
    centre = (torch.arange(first, first + count, dtype=torch.float64) + 0.5) * scale
    lo = (centre - support + 0.5).to(torch.int64).clamp(min=0)          # truncation, as C's (int)
    hi = (centre + support + 0.5).to(torch.int64).clamp(max=in_size)
    offs = torch.arange(k, dtype=torch.int64)
    idx = lo[:, None] + offs[None, :]
    valid = idx < hi[:, None]
    w = _bicubic((idx.to(torch.float64) - centre[:, None] + 0.5) / filter_scale) * valid
    total = w.sum(1, keepdim=True)
    w = torch.where(total != 0, w / torch.where(total != 0, total, torch.ones_like(total)), w)
    fixed = w * (1 << _PRECISION_BITS)
    fixed = torch.where(fixed < 0, (fixed - 0.5).trunc(), (fixed + 0.5).trunc()).to(torch.int32)
    return idx.clamp(max=in_size - 1), w, fixed


@lru_cache(maxsize=128)
def _device_taps(in_size: int, out_size: int, first: int, count: int, integer: bool, offset: int,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_taps` on ``device`` (indices shifted by ``offset``; fixed-point or float32 weights),
    made once per geometry and device: a copy from host memory per image and pass would wait for the
    device's queued work each time."""
    idx, w, fixed = _taps(in_size, out_size, first, count)
    return (idx - offset).to(device), (fixed if integer else w.to(torch.float32)).to(device)


@lru_cache(maxsize=16)
def _mean_std(mean: tuple[float, ...], std: tuple[float, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    """The normalisation constants on ``device`` as (3, 1, 1) float32, made once per device."""
    return (torch.tensor(mean, dtype=torch.float32, device=device).view(3, 1, 1),
            torch.tensor(std, dtype=torch.float32, device=device).view(3, 1, 1))


def _runs_batched(device: torch.device) -> bool:
    """Whether :class:`ResizeCrop` resizes a run of same-size images as one batch on ``device``."""
    return device.type == "cuda"


def _resample(x: torch.Tensor, dim: int, in_size: int, out_size: int, first: int, count: int,
              integer: bool, offset: int = 0) -> torch.Tensor:
    """Resize ``x`` along ``dim`` to ``out_size``, computing outputs ``first .. first + count`` only.

    ``x`` holds source positions ``offset ..`` along ``dim`` (a slice of the full source); any
    leading dimensions (a batch of same-size images) are carried along.
    """
    idx, weights = _device_taps(in_size, out_size, first, count, integer, offset, x.device)
    shape = [1] * x.dim()
    shape[dim] = count
    acc = None
    for t in range(idx.shape[1]):
        term = x.index_select(dim, idx[:, t]) * weights[:, t].view(shape)
        acc = term if acc is None else acc + term
    if integer:
        # Pillow starts its accumulator at half a unit (rounding), then clips to 8 bits
        return ((acc + (1 << (_PRECISION_BITS - 1))) >> _PRECISION_BITS).clamp_(0, 255)
    return acc


@dataclass(frozen=True)
class ResizeCrop:
    """Resize the shorter side to ``floor(size / crop_pct)``, centre-crop ``size``, normalise.

    ``mean``/``std`` act on [0, 1] values. Called like :class:`~libreyolo.ops.letterbox.Letterbox`:
    CHW RGB tensors on the device in, the (B, 3, size, size) batch and one
    :class:`LetterboxMeta` per image out (``ratio`` the resize factor, ``pad`` minus the crop
    offset, so ``to_original`` maps input pixels back to source pixels).
    """

    size: int
    crop_pct: float = 0.875
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    interpolation: str = "bicubic"

    def __post_init__(self) -> None:
        if self.interpolation != "bicubic":
            raise ValueError(f"ResizeCrop supports interpolation='bicubic' only, got {self.interpolation!r}")
        if not 0.0 < self.crop_pct <= 1.0:
            raise ValueError(f"crop_pct must be in (0, 1], got {self.crop_pct!r}")

    @property
    def resize_size(self) -> int:
        return int(math.floor(self.size / self.crop_pct))

    @property
    def neutral_input(self) -> float:
        """A network input value that stands for a mid-grey image (used to warm up / capture)."""
        return 0.0

    def describe(self) -> dict[str, Any]:
        """What an artifact's metadata records about this preprocessing (a runtime checks it)."""
        return {"kind": "resize-crop", "size": self.size, "resize_shorter_side": self.resize_size,
                "crop_pct": self.crop_pct, "crop": "center", "interpolation": "bicubic (Pillow, antialiased)",
                "mean": list(self.mean), "std": list(self.std)}

    def normalization(self) -> dict[str, Any]:
        return {"mean": list(self.mean), "std": list(self.std)}

    def geometry(self, h: int, w: int) -> tuple[int, int, int, int]:
        """(resized h, resized w, crop top, crop left) for an h x w source."""
        short, long = (h, w) if h <= w else (w, h)
        new_short, new_long = self.resize_size, int(self.resize_size * long / short)
        new_h, new_w = (new_short, new_long) if h <= w else (new_long, new_short)
        return new_h, new_w, int(round((new_h - self.size) / 2.0)), int(round((new_w - self.size) / 2.0))

    def __call__(self, images: list[torch.Tensor], dtype: torch.dtype = torch.float32,
                 out: torch.Tensor | None = None) -> tuple[torch.Tensor, list[LetterboxMeta]]:
        """``images``: CHW RGB tensors (uint8 0..255 or float 0..1) already on the target device.

        On CUDA a run of consecutive images of one size and dtype is resized as one batch (a
        fortieth of the kernel launches at 32 images); the same operations per element as one image
        at a time, so the same numbers. On the CPU one image at a time is faster (32 frames of
        480x640 at 224 on 2 cores: 140 ms, batched 674 ms: the batch's intermediates leave the caches)."""
        device = images[0].device
        n, size = len(images), self.size
        if out is None:
            out = torch.empty((n, 3, size, size), device=device, dtype=dtype)
        metas: list[LetterboxMeta] = []
        start, runs = 0, _runs_batched(device)
        while start < n:
            first = images[start]
            stop = start + 1
            while runs and stop < n and images[stop].shape == first.shape and images[stop].dtype == first.dtype:
                stop += 1
            h, w = int(first.shape[-2]), int(first.shape[-1])
            run = first.unsqueeze(0) if stop == start + 1 else torch.stack(images[start:stop])
            self._normalised(run, h, w, out[start:stop])
            metas += self.metas_for(h, w, stop - start)
            start = stop
        return out, metas

    def metas_for(self, h: int, w: int, n: int) -> list[LetterboxMeta]:
        """The metas of ``n`` images of ``h`` x ``w`` (what :meth:`__call__` returns for them)."""
        new_h, _, top, left = self.geometry(h, w)
        return [LetterboxMeta((h, w), new_h / h, (float(-left), float(-top)))] * n

    def place_batch(self, frames: torch.Tensor, bgr: bool, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The network input of a batch of same-size 8-bit frames as they were uploaded: ``frames``
        (B, H, W, 3), RGB or ``bgr``; the numbers :meth:`__call__` gives for the frames as CHW RGB
        tensors, without a per-image reorder (integer resampling, then the same float operations)."""
        x = frames.permute(0, 3, 1, 2)
        x = x.flip(1) if bgr else x
        out = torch.empty((int(x.shape[0]), 3, self.size, self.size), device=frames.device, dtype=dtype)
        step = int(x.shape[0]) if _runs_batched(frames.device) else 1  # as __call__ runs them
        for i in range(0, int(x.shape[0]), step):
            self._normalised(x[i:i + step], int(x.shape[-2]), int(x.shape[-1]), out[i:i + step])
        return out

    def _normalised(self, run: torch.Tensor, h: int, w: int, out: torch.Tensor) -> None:
        """Resize-crop ``run`` (k, 3, h, w) and write it, normalised, into ``out`` (k, 3, size, size)."""
        new_h, new_w, top, left = self.geometry(h, w)
        if top < 0 or left < 0:
            raise ValueError(f"image {w}x{h} resizes to {new_w}x{new_h}, smaller than the {self.size} crop")
        mean, std = _mean_std(tuple(self.mean), tuple(self.std), run.device)
        out.copy_((self._resize_crop(run, h, w, new_h, new_w, top, left) - mean) / std)

    def _resize_crop(self, img: torch.Tensor, h: int, w: int, new_h: int, new_w: int, top: int,
                     left: int) -> torch.Tensor:
        """The crop of the resized images (k, C, h, w) as float32 in [0, 1]."""
        size = self.size
        integer = not img.is_floating_point()
        x = img.to(torch.int32) if integer else img.to(torch.float32)
        if (new_h, new_w) != (h, w):
            # rows of the source the vertical pass reads for the crop's rows
            idx_v, _, _ = _taps(h, new_h, top, size)
            r0, r1 = int(idx_v.min()), int(idx_v.max()) + 1
            if new_w != w:
                x = _resample(x[..., r0:r1, :], -1, w, new_w, left, size, integer)
            else:
                x = x[..., r0:r1, left:left + size]
            if new_h != h:
                x = _resample(x, -2, h, new_h, top, size, integer, offset=r0)
            else:
                x = x[..., top - r0:top - r0 + size, :]
        else:
            x = x[..., top:top + size, left:left + size]
        x = x.to(torch.float32)
        return x / 255.0 if integer else x


def classify_postprocess(logits: torch.Tensor, metas: Sequence[LetterboxMeta],
                         **_: Any) -> list[dict[str, torch.Tensor]]:
    """One dict per image: ``probs`` (nc,) float32 class probabilities (softmax of the logits).

    Detection arguments (``conf``, ``iou``, ``max_det``, ``classes``) do not apply and are ignored.
    """
    probs = logits.float().softmax(-1)
    return [{"probs": p} for p, _ in zip(probs, metas, strict=True)]
