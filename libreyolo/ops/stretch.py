"""Stretch-resize preprocessing (no letterbox), bit-exact with the resizers reference pipelines use.

DETR-style detectors resize the whole image to ``size x size`` without keeping the aspect
ratio. Their reference pipelines resize 8-bit images with OpenCV (``cv2.INTER_LINEAR``) or
Pillow (``Image.BILINEAR``); the two round differently, and one grey level on a few percent
of the pixels is enough to move scores by more than 1e-4. So both are reproduced here in
integer arithmetic, on the model's device:

- ``"opencv-linear"``: OpenCV's fixed-point bilinear (11-bit coefficients, horizontal pass
  in 32-bit integers, vertical pass as its SIMD kernel computes it). The SIMD kernel covers
  every output row whose byte width (3 x width) is a multiple of 16, which holds for every
  ``imgsz`` that is a multiple of 32. Verified equal to ``cv2.resize`` (OpenCV 5.0) on
  up- and down-scales of random images.
- ``"pil-bilinear"``: Pillow's separable triangle filter (support scaled on downscale, i.e.
  antialiased), 22-bit coefficients, each pass rounded to 8 bit, in Pillow's pass order
  (:func:`pil_vertical_first`).

- ``"float-bilinear"``: the 8-bit image scaled to [0, 1] first, then resized in float32 as
  ``cv2.resize(..., INTER_LINEAR)`` resizes a float32 image (RF-DETR): separable, horizontal pass
  first, two taps with float32 weights from half-pixel centres, edges clamped. Within 1e-7 of it
  (``F.interpolate`` is 3e-5 away on a 640 -> 384 downscale, enough to move scores by 1e-4).

Float inputs (already in [0, 1]) have no 8-bit rounding to reproduce and are resized with
``F.interpolate`` (bilinear, antialiased for Pillow's method).

A ``mean``/``std`` normalisation (on [0, 1] values, per channel) may follow the resize
(``normalization()`` reports it; identity by default).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

METHODS = ("opencv-linear", "pil-bilinear", "float-bilinear")
_INTEGER_METHODS = ("opencv-linear", "pil-bilinear")
_CV_BITS = 11
_PIL_BITS = 22


@dataclass(frozen=True)
class StretchMeta:
    """How one image was stretched into the network input."""

    orig_shape: tuple[int, int]   # (h, w) of the source image
    input_shape: tuple[int, int]  # (h, w) of the network input

    @property
    def ratio(self) -> tuple[float, float]:
        """(x, y) scale from source to input pixels."""
        return self.input_shape[1] / self.orig_shape[1], self.input_shape[0] / self.orig_shape[0]

    def to_original(self, boxes: torch.Tensor) -> torch.Tensor:
        """xyxy boxes in network-input pixels -> source pixels (new tensor)."""
        out = boxes.clone()
        out[..., 0::2] = out[..., 0::2] * (self.orig_shape[1] / self.input_shape[1])
        out[..., 1::2] = out[..., 1::2] * (self.orig_shape[0] / self.input_shape[0])
        return out

    def normalized_to_original(self, boxes: torch.Tensor) -> torch.Tensor:
        """xyxy boxes normalised to the input ([0, 1]) -> source pixels: one multiplication."""
        h, w = self.orig_shape
        return boxes * boxes.new_tensor([w, h, w, h])

    def content_box(self) -> tuple[float, float, float, float]:
        return 0.0, 0.0, float(self.input_shape[1]), float(self.input_shape[0])


@lru_cache(maxsize=64)
def _opencv_axis(src: int, dst: int, clamp_edges: bool) -> tuple[torch.Tensor, ...]:
    """Source indices and 11-bit weights of OpenCV's linear resize along one axis."""
    scale = 1.0 / (np.float64(dst) / np.float64(src))
    f = ((np.arange(dst, dtype=np.float64) + 0.5) * scale - 0.5).astype(np.float32)
    s = np.floor(f).astype(np.int64)
    f = (f - s.astype(np.float32)).astype(np.float32)
    if clamp_edges:  # OpenCV clamps columns (weight 1 on the edge pixel) but not rows
        outside = (s < 0) | (s >= src - 1)
        s = np.where(s < 0, 0, np.where(s >= src - 1, src - 1, s))
        f = np.where(outside, np.float32(0), f).astype(np.float32)
    one = np.float32(1 << _CV_BITS)
    w0 = np.rint((np.float32(1) - f) * one).astype(np.int32)  # rint: round half to even, as cvRound
    w1 = np.rint(f * one).astype(np.int32)
    i0, i1 = np.clip(s, 0, src - 1), np.clip(s + 1, 0, src - 1)
    return tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in (i0, i1, w0, w1))


@lru_cache(maxsize=64)
def _on_device(table: Any, src: int, dst: int, device: torch.device, *flags: bool) -> tuple[torch.Tensor, ...]:
    """``table(src, dst, *flags)`` (an axis's indices and weights) copied to ``device`` once: a
    stream of same-size frames then sends no small tables per image (each copy from pageable
    memory would hold the host)."""
    return tuple(t.to(device) for t in table(src, dst, *flags))


def _resize_opencv(img: torch.Tensor, h_out: int, w_out: int) -> torch.Tensor:
    """(..., C, H, W) uint8 -> (..., C, h_out, w_out) uint8, equal to ``cv2.resize(..., INTER_LINEAR)``
    per image (integer arithmetic: a batch gives each image's own numbers)."""
    h, w = int(img.shape[-2]), int(img.shape[-1])
    dev = img.device
    x0, x1, a0, a1 = _on_device(_opencv_axis, w, w_out, dev, True)
    y0, y1, b0, b1 = _on_device(_opencv_axis, h, h_out, dev, False)
    src = img.to(torch.int32)
    rows = src[..., x0] * a0 + src[..., x1] * a1            # (..., C, h, w_out), scaled by 2^11
    s0, s1 = rows[..., y0, :] >> 4, rows[..., y1, :] >> 4   # as the SIMD kernel packs them to 16 bit
    out = ((s0 * b0[:, None]) >> 16) + ((s1 * b1[:, None]) >> 16)
    return ((out + 2) >> 2).clamp_(0, 255).to(torch.uint8)


@lru_cache(maxsize=64)
def _pil_axis(src: int, dst: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(dst, taps) source indices and 22-bit weights of Pillow's bilinear filter along one axis."""
    scale = src / dst
    filterscale = max(scale, 1.0)
    support = 1.0 * filterscale
    taps = int(math.ceil(support)) * 2 + 1
    index = np.zeros((dst, taps), dtype=np.int64)
    weight = np.zeros((dst, taps), dtype=np.int64)
    for xx in range(dst):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), src) - xmin
        ks = []
        for x in range(xmax):
            t = abs((x + xmin - center + 0.5) / filterscale)
            ks.append(1.0 - t if t < 1.0 else 0.0)
        total = sum(ks)
        for x, k in enumerate(ks):
            k = k / total if total != 0.0 else k
            weight[xx, x] = int(0.5 + k * (1 << _PIL_BITS)) if k >= 0 else int(-0.5 + k * (1 << _PIL_BITS))
            index[xx, x] = x + xmin
        index[xx, xmax:] = xmin
    return torch.from_numpy(index), torch.from_numpy(weight)


def _pil_pass(img: torch.Tensor, src: int, dst: int, dim: int) -> torch.Tensor:
    index, weight = _on_device(_pil_axis, src, dst, img.device)
    acc = None
    for t in range(index.shape[1]):
        if dim == 2:  # columns (the last dimension)
            term = img[..., index[:, t]] * weight[:, t]
        else:         # rows
            term = img[..., index[:, t], :] * weight[:, t][:, None]
        acc = term if acc is None else acc + term
    acc = acc + (1 << (_PIL_BITS - 1))
    return (acc >> _PIL_BITS).clamp_(0, 255)


@lru_cache(maxsize=1)
def _pillow_may_go_vertical_first() -> bool:
    """Whether the installed Pillow (13 or newer; newest behaviour without Pillow) can run the
    vertical pass first; older versions always go horizontal first."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return int(version("pillow").split(".")[0]) >= 13
    except (PackageNotFoundError, ValueError):
        return True


def pil_vertical_first(h: int, w: int, h_out: int, w_out: int) -> bool:
    """Pillow's pass order: from Pillow 13 (its PR 9549), vertical first when the height shrinks by
    more than twice as many pixels as the width does (measured against Pillow 13.0 on ~400 random
    size pairs and at the boundary); the 8-bit rounding between passes makes the order visible."""
    return _pillow_may_go_vertical_first() and h_out < h and h - h_out > 2 * (w - w_out)


def _resize_pil(img: torch.Tensor, h_out: int, w_out: int) -> torch.Tensor:
    """(..., C, H, W) uint8 -> (..., C, h_out, w_out) uint8, equal to Pillow's ``resize(..., BILINEAR)``
    per image."""
    h, w = int(img.shape[-2]), int(img.shape[-1])
    x = img.to(torch.int64)
    if pil_vertical_first(h, w, h_out, w_out):
        x = _pil_pass(x, h, h_out, 1)
        if w != w_out:
            x = _pil_pass(x, w, w_out, 2)
        return x.to(torch.uint8)
    if w != w_out:
        x = _pil_pass(x, w, w_out, 2)
    if h != h_out:
        x = _pil_pass(x, h, h_out, 1)
    return x.to(torch.uint8)


@lru_cache(maxsize=64)
def _linear_axis(src: int, dst: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """OpenCV's two-tap linear coefficients along one axis: (first source index, second, weight of
    the second); positions in double, the weight rounded to float32 as OpenCV stores it."""
    pos = (np.arange(dst, dtype=np.float64) + 0.5) * (1.0 / (dst / src)) - 0.5  # in double, as OpenCV
    first = np.floor(pos).astype(np.int64)
    frac = (pos - first).astype(np.float32)
    low = first < 0
    frac[low], first[low] = 0.0, 0
    high = first >= src - 1
    frac[high], first[high] = 0.0, src - 1
    return first, np.minimum(first + 1, src - 1), frac


def _resize_float_linear(x: torch.Tensor, h_out: int, w_out: int) -> torch.Tensor:
    """(B, C, H, W) float32 -> (B, C, h_out, w_out), OpenCV's float INTER_LINEAR."""
    h, w = int(x.shape[-2]), int(x.shape[-1])
    out = x
    for dim, src, dst in ((3, w, w_out), (2, h, h_out)):
        if src == dst:
            continue
        i0, i1, frac = (torch.from_numpy(a).to(x.device) for a in _linear_axis(src, dst))
        shape = [1, 1, 1, 1]
        shape[dim] = dst
        a1 = frac.view(shape)
        a0 = (1.0 - frac).view(shape)
        out = out.index_select(dim, i0) * a0 + out.index_select(dim, i1) * a1
    return out


def resize_u8(img: torch.Tensor, h_out: int, w_out: int, method: str) -> torch.Tensor:
    """Resize a (C, H, W) uint8 image, or a (B, C, H, W) batch of them, with a reference pipeline's
    8-bit arithmetic (each image of a batch gets the numbers it gets alone)."""
    if method not in _INTEGER_METHODS:
        raise ValueError(f"8-bit resize method must be one of {_INTEGER_METHODS}, got {method!r}")
    if tuple(img.shape[-2:]) == (h_out, w_out):
        return img
    return _resize_opencv(img, h_out, w_out) if method == "opencv-linear" else _resize_pil(img, h_out, w_out)


@dataclass(frozen=True)
class Stretch:
    """Resize every image to ``size x size`` (aspect ratio not kept), scale to [0, 1].

    Has the interface of :class:`~libreyolo.ops.letterbox.Letterbox` (``size``, ``placement``,
    ``pad_value``, ``__call__``) so predict, graphs, export and runtimes use it unchanged.
    Nothing is padded; ``pad_value`` only says what grey a blank input would have.
    """

    size: int
    method: str = "opencv-linear"
    pad_value: float = 0.0
    placement: str = "stretch"
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"resize method must be one of {METHODS}, got {self.method!r}")
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ValueError(f"mean and std need 3 values each, std positive; got {self.mean}, {self.std}")

    @property
    def normalized(self) -> bool:
        return tuple(self.mean) != (0.0, 0.0, 0.0) or tuple(self.std) != (1.0, 1.0, 1.0)

    @property
    def neutral_input(self) -> float:
        """A network input value that stands for a blank image (0: a mean-grey one when normalised)."""
        return 0.0 if self.normalized else self.pad_value / 255.0

    def describe(self) -> dict[str, Any]:
        """What an artifact's metadata records about this preprocessing (a runtime checks it)."""
        exact = "float32" if self.method == "float-bilinear" else "8-bit exact"
        out = {"placement": self.placement, "pad_value": self.pad_value, "size": self.size,
               "resize": f"{self.method}, aspect ratio not kept, {exact}"}
        if self.normalized:
            out.update(mean=list(self.mean), std=list(self.std))
        return out

    def normalization(self) -> dict[str, Any]:
        return {"mean": list(self.mean), "std": list(self.std)}

    def _resized(self, img: torch.Tensor) -> torch.Tensor:
        """(C, H, W) or (B, C, H, W) 8-bit -> float32 in [0, 1] at ``size x size`` (the method's numbers)."""
        s = self.size
        if self.method == "float-bilinear":
            x = img.float() / 255.0
            if tuple(x.shape[-2:]) == (s, s):
                return x
            batch = x if x.dim() == 4 else x.unsqueeze(0)
            out = _resize_float_linear(batch, s, s)
            return out if x.dim() == 4 else out[0]
        return resize_u8(img, s, s, self.method).float() / 255.0

    def _normalize_(self, x: torch.Tensor) -> torch.Tensor:
        if not self.normalized:
            return x
        mean = torch.tensor(self.mean, dtype=torch.float32, device=x.device).view(3, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32, device=x.device).view(3, 1, 1)
        return x.sub_(mean).div_(std)

    def __call__(self, images: list[torch.Tensor], dtype: torch.dtype = torch.float32,
                 out: torch.Tensor | None = None) -> tuple[torch.Tensor, list[StretchMeta]]:
        """``images``: CHW RGB tensors (uint8 or float in [0, 1]) on the target device."""
        n, s = len(images), self.size
        if out is None:
            out = torch.empty((n, 3, s, s), device=images[0].device, dtype=dtype)
        metas = []
        for i, img in enumerate(images):
            h, w = int(img.shape[-2]), int(img.shape[-1])
            if img.is_floating_point():
                x = img.float()
                if (h, w) != (s, s):
                    x = F.interpolate(img.unsqueeze(0).float(), size=(s, s), mode="bilinear", align_corners=False,
                                      antialias=self.method == "pil-bilinear")[0].clamp_(0, 1)
                out[i].copy_(self._normalize_(x.clone()) if self.normalized else x)
            elif self.normalized or self.method == "float-bilinear":
                out[i].copy_(self._normalize_(self._resized(img)))
            else:
                out[i].copy_(resize_u8(img, s, s, self.method))
                out[i].div_(255.0)
            metas.append(StretchMeta((h, w), (s, s)))
        return out, metas

    def place_batch(self, frames: torch.Tensor, bgr: bool, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The network input of a batch of same-size 8-bit frames as they were uploaded: ``frames``
        (B, H, W, 3), RGB or ``bgr``; one batched resize, the numbers of :meth:`__call__` on the
        frames reordered one by one (integer resizing). Fixed shapes and no host work, so the
        whole-pipeline CUDA graph can hold it (:meth:`Letterbox.place_batch`'s counterpart)."""
        x = frames.permute(0, 3, 1, 2)
        x = x.flip(1) if bgr else x
        out = torch.empty((x.shape[0], 3, self.size, self.size), device=frames.device, dtype=dtype)
        if self.normalized or self.method == "float-bilinear":
            return out.copy_(self._normalize_(self._resized(x)))
        out.copy_(resize_u8(x, self.size, self.size, self.method))
        return out.div_(255.0)

    def metas_for(self, h: int, w: int, n: int) -> list[StretchMeta]:
        """The metas of ``n`` images of ``h`` x ``w`` (what :meth:`__call__` returns for them)."""
        return [StretchMeta((h, w), (self.size, self.size))] * n
