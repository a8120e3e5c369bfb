"""End-to-end artifacts (export option ``e2e=True``): the family's input normalisation inside the graph.

An end-to-end artifact takes the letterboxed image as 8-bit pixels, ``uint8`` (B, 3, H, W) in
**RGB** order, NCHW (an HWC image from a decoder: ``img.transpose(2, 0, 1)[None]``), and does
the rest of the family's preprocessing itself: the colour order the network was trained on, the
pixel scale and the per-channel mean/std. Dense detectors also get NMS inside (the embedded-NMS
path of :mod:`libreyolo.export.nms`), so an edge user cannot feed YOLOX the usual RGB/255 and get
wrong boxes without an error. Resizing/letterboxing stays outside the graph (it depends on the
source image's size).

Everything comes from one declaration, the normalisation every artifact's metadata records
(:func:`input_normalization`): network input = ``(pixel in colour order * scale - mean) / std``,
per channel. The graph (:class:`E2EInput`) applies it; the runtime
(:func:`to_pixels`) turns a batch made by the family's own preprocessing back into the 8-bit
RGB pixels the graph takes; export validation checks the declaration against the family's
preprocessing on a coloured image (:func:`check_declaration`) and compares the artifact with
eager on the same probes as every artifact, rounded to 8-bit pixels.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

LAYOUT = "NCHW"
COLOR = "RGB"  # the channel order of an end-to-end artifact's input, whatever the family's
PIXEL_DTYPE = "uint8"


def input_normalization(family: Any, imgsz: int) -> dict[str, Any]:
    """The family's declared input normalisation: ``(pixel[color] * scale - mean) / std`` per channel."""
    contract = family.export
    return {"layout": contract.input_layout, "color": contract.input_color, "scale": contract.input_scale,
            **family.letterbox(imgsz).normalization()}


def _divisor(scale: float) -> float | None:
    """``1 / scale`` where it is a whole number (255 for 1/255): the preprocessors divide by it."""
    inverse = 1.0 / scale
    return float(round(inverse)) if abs(inverse - round(inverse)) < 1e-9 * inverse else None


class E2EInput(nn.Module):
    """(B, 3, H, W) uint8 RGB pixels -> the network's float input, as the family preprocesses."""

    def __init__(self, norm: dict[str, Any]) -> None:
        super().__init__()
        self.bgr = norm["color"] == "BGR"
        self.scale = float(norm["scale"])
        self.divisor = _divisor(self.scale)
        mean, std = [float(v) for v in norm["mean"]], [float(v) for v in norm["std"]]
        self.normalized = mean != [0.0] * 3 or std != [1.0] * 3
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1), persistent=False)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = pixels.float()
        if self.bgr:
            x = x.flip(1)  # torch.flip exports as a Slice with step -1
        if self.divisor is not None and self.divisor != 1.0:
            x = x / self.divisor
        elif self.divisor is None:
            x = x * self.scale
        if self.normalized:
            x = (x - self.mean) / self.std
        return x


def to_pixels(batch: torch.Tensor, norm: dict[str, Any]) -> torch.Tensor:
    """A batch made by the family's preprocessing -> the uint8 RGB pixels an end-to-end graph takes
    (the inverse of :class:`E2EInput`, rounded to whole grey levels)."""
    x = batch.float()
    mean = torch.tensor(norm["mean"], dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(norm["std"], dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
    x = (x * std + mean) / float(norm["scale"])
    if norm["color"] == "BGR":
        x = x.flip(1)
    return x.round().clamp(0, 255).to(torch.uint8)


def quantize_input(batch: torch.Tensor, norm: dict[str, Any]) -> torch.Tensor:
    """``batch`` (network input) rounded to what 8-bit pixels give: the probes of an end-to-end
    artifact's validation, which eager runs as float and the artifact as uint8."""
    return E2EInput(norm).to(batch.device)(to_pixels(batch, norm)).to(batch.dtype)


# a coloured test image: three different channel values, so a swapped colour order shows
CHECK_COLOR = (200, 120, 30)


def check_declaration(family: Any, imgsz: int, norm: dict[str, Any]) -> dict[str, Any]:
    """The declared normalisation against the family's own preprocessing: a uniform RGB image of
    :data:`CHECK_COLOR` at the input size (unchanged by any resize) through the preprocessing and
    back through :func:`to_pixels` must give that colour again."""
    image = torch.tensor(CHECK_COLOR, dtype=torch.uint8).view(3, 1, 1).expand(3, imgsz, imgsz).contiguous()
    batch, _ = family.letterbox(imgsz)([image])
    back = to_pixels(batch, norm)[0]
    want = image.to(back.device)
    diff = int((back.int() - want.int()).abs().max())
    return {"probe": "uniform colour " + "/".join(map(str, CHECK_COLOR)), "output": "e2e input",
            "group": "input", "kind": "input", "max_abs_error": float(diff), "ratio": 0.0 if diff == 0 else
            float("inf"), "allowed": 0.0, "cosine": 1.0 if diff == 0 else 0.0, "passed": diff == 0,
            **({} if diff == 0 else {"shape": "the declared colour order/normalisation does not invert the "
                                              "family's preprocessing (the artifact would expect other pixels)"})}


def describe(norm: dict[str, Any], nms: bool) -> dict[str, Any]:
    """The ``e2e`` metadata entry: what the artifact takes and what it does inside."""
    return {"input": {"dtype": PIXEL_DTYPE, "layout": LAYOUT, "color": COLOR, "range": [0, 255]},
            "inside": {"color": norm["color"], "scale": norm["scale"], "mean": list(norm["mean"]),
                       "std": list(norm["std"]), "nms": nms},
            "outside": "letterbox/resize to the input size (the 'letterbox' entry)"}
