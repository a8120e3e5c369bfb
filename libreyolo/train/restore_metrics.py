"""PSNR and SSIM of restored images, as super-resolution papers report them.

Conventions (those of the SwinIR paper's and BasicSR's evaluation):

- both images are 8-bit RGB (the restored image as predict() returns it: clamped and rounded);
- ``border`` pixels (the scale, 4) are cropped from each side before measuring;
- the Y channel is ITU-R BT.601 luma in the studio range, from RGB in [0, 1]:
  ``Y = 16 + (65.481 R + 128.553 G + 24.966 B)``, in 0..255 units, not rounded;
- PSNR = ``10 log10(255^2 / MSE)`` over all measured values (for RGB: the three channels
  together), in float64. Identical images have MSE 0: their PSNR is capped at
  :data:`MAX_PSNR` (100 dB), so that a mean over images stays finite and comparable;
- SSIM is Wang et al.'s (2004): an 11 x 11 Gaussian window of sigma 1.5, ``K1 = 0.01``,
  ``K2 = 0.03`` on values in 0..255 (``C1 = (0.01 * 255)^2``, ``C2 = (0.03 * 255)^2``), the
  window only where it fits inside the image ("valid"), averaged over the map; for RGB the mean
  of the three channels' SSIM.

:class:`RestoreMetrics` averages each metric over images (each image counts once, whatever its
size): ``PSNR_Y`` (the headline), ``SSIM_Y``, ``PSNR_RGB``, ``SSIM_RGB``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["MAX_PSNR", "RestoreMetrics", "psnr", "rgb_to_y", "ssim"]

MAX_PSNR = 100.0  # dB: the PSNR of identical images (MSE 0), and the most any pair scores
_Y_WEIGHTS = (65.481, 128.553, 24.966)


def _hwc_to_chw64(image: torch.Tensor) -> torch.Tensor:
    """(H, W, 3) uint8 RGB -> (3, H, W) float64 in 0..255."""
    if image.ndim != 3 or image.shape[-1] != 3:
        raise ValueError(f"expected one (H, W, 3) RGB image, got shape {tuple(image.shape)}")
    return image.detach().cpu().to(torch.float64).permute(2, 0, 1)


def rgb_to_y(image: torch.Tensor) -> torch.Tensor:
    """BT.601 studio-range luma (1, H, W), in 0..255 units, of a (3, H, W) RGB image in 0..255."""
    if image.ndim != 3 or image.shape[0] != 3:
        raise ValueError(f"expected one (3, H, W) RGB image, got shape {tuple(image.shape)}")
    w = torch.tensor(_Y_WEIGHTS, dtype=torch.float64).view(3, 1, 1)
    return 16.0 + (image.to(torch.float64) / 255.0 * w).sum(0, keepdim=True)


def psnr(a: torch.Tensor, b: torch.Tensor, peak: float = 255.0) -> float:
    """PSNR in dB of two same-shaped images (any layout) with values in 0..``peak``; at most :data:`MAX_PSNR`."""
    if a.shape != b.shape:
        raise ValueError(f"PSNR needs images of one shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    mse = float((a.to(torch.float64) - b.to(torch.float64)).pow(2).mean())
    if mse == 0.0:
        return MAX_PSNR
    return min(MAX_PSNR, 10.0 * math.log10(peak * peak / mse))


def _gaussian_window(size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    t = torch.arange(size, dtype=torch.float64) - (size - 1) / 2.0
    g = torch.exp(-(t * t) / (2.0 * sigma * sigma))
    g = g / g.sum()
    return (g[:, None] * g[None, :]).view(1, 1, size, size)


def ssim(a: torch.Tensor, b: torch.Tensor, peak: float = 255.0) -> float:
    """Mean SSIM of two same-shaped (C, H, W) images with values in 0..``peak`` (the mean over channels).
    Each side must be at least 11 pixels (the window)."""
    if a.shape != b.shape or a.ndim != 3:
        raise ValueError(f"SSIM needs two (C, H, W) images of one shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    if min(a.shape[-2:]) < 11:
        raise ValueError(f"SSIM needs images of at least 11 x 11 pixels (its window), got {tuple(a.shape[-2:])}")
    c1, c2 = (0.01 * peak) ** 2, (0.03 * peak) ** 2
    x = a.to(torch.float64).unsqueeze(1)  # channels as a batch: each measured on its own
    y = b.to(torch.float64).unsqueeze(1)
    win = _gaussian_window()
    mx, my = F.conv2d(x, win), F.conv2d(y, win)
    sxx = F.conv2d(x * x, win) - mx * mx
    syy = F.conv2d(y * y, win) - my * my
    sxy = F.conv2d(x * y, win) - mx * my
    smap = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx * mx + my * my + c1) * (sxx + syy + c2))
    return float(smap.mean(dim=(1, 2, 3)).mean())


def crop_border(image: torch.Tensor, border: int) -> torch.Tensor:
    """(C, H, W) without ``border`` pixels on each side."""
    if border <= 0:
        return image
    return image[:, border:-border, border:-border]


class RestoreMetrics:
    """Per-image PSNR and SSIM on Y and RGB, averaged over images by :meth:`compute`."""

    names = ("PSNR_Y", "SSIM_Y", "PSNR_RGB", "SSIM_RGB")

    def __init__(self, border: int = 4) -> None:
        self.border = int(border)
        self.values: dict[str, list[float]] = {k: [] for k in self.names}

    def update(self, preds: list[torch.Tensor], targets: list[torch.Tensor]) -> None:
        """``preds``, ``targets``: matching (H, W, 3) uint8 RGB images (restored, ground truth)."""
        for pred, target in zip(preds, targets, strict=True):
            p, t = _hwc_to_chw64(pred), _hwc_to_chw64(target)
            if p.shape != t.shape:
                raise ValueError(f"a restored image is {tuple(p.shape[1:])} and its ground truth "
                                 f"{tuple(t.shape[1:])}: they must be the same size")
            p_rgb, t_rgb = crop_border(p, self.border), crop_border(t, self.border)
            p_y, t_y = crop_border(rgb_to_y(p), self.border), crop_border(rgb_to_y(t), self.border)
            self.values["PSNR_Y"].append(psnr(p_y, t_y))
            self.values["SSIM_Y"].append(ssim(p_y, t_y))
            self.values["PSNR_RGB"].append(psnr(p_rgb, t_rgb))
            self.values["SSIM_RGB"].append(ssim(p_rgb, t_rgb))

    def compute(self) -> dict[str, float]:
        if not self.values["PSNR_Y"]:
            return {k: 0.0 for k in self.names}
        return {k: sum(v) / len(v) for k, v in self.values.items()}
