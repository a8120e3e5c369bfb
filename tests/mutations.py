"""Models for the validator's power suite: seeded weights at normal and deliberately high gain,
and the wrong artifacts a correct validator must refuse.

High gain reproduces what refused correct artifacts in the field (issue: yolox-s with 726 px
wide near-zero-score boxes whose corners cancel two ~363 px operands; rtdetr-r34 with large
logits): a recipe per family scales the head so boxes are large and logits big, on top of
seeded initial weights. Mutations are applied to a deep copy; the true model is untouched.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import re
from typing import Any

import torch
from torch import nn

# family -> (size, imgsz, high-gain recipe: {parameter-name regex: (scale, bias shift, bias channels)}),
# each touching the last layer of a head branch only, as a trained network's sharp head would be
CASES: dict[str, tuple[str, int, dict[str, tuple[float, float, slice]]]] = {
    # DFL box logits sharpened x3, class logits x8
    "yolo9": ("t", 128, {r"head\.cv2\.\d+\.2\.": (3.0, 0.0, slice(None)),
                         r"head\.cv3\.\d+\.2\.": (8.0, 0.0, slice(None))}),
    # wide boxes (exp(log w, log h) * stride, ~20x stride) and near-zero objectness, as in the refused yolox-s
    "yolox": ("s", 160, {r"head\.reg_preds\.": (0.05, 3.0, slice(2, 4)),
                         r"head\.obj_preds\.": (0.1, -6.0, slice(None))}),
    # class logits of a set predictor x8 (the refused rtdetr-r34 failed on pred_logits)
    "rtdetr": ("r18", 160, {r"decoder\.dec_score_head\.": (8.0, 0.0, slice(None))}),
    # the v2 decoder (per-level points); 128 px (336 candidates for 300 queries) keeps its NCNN export cheap
    "rtdetrv2": ("r18", 128, {r"decoder\.dec_score_head\.": (8.0, 0.0, slice(None))}),
    # D-FINE's network with a SiLU decoder; small inputs keep their exports cheap in CI
    "deim": ("n", 128, {r"decoder\.dec_score_head\.": (8.0, 0.0, slice(None))}),
    "rtdetrv4": ("s", 128, {r"decoder\.dec_score_head\.": (8.0, 0.0, slice(None))}),
    # classifier logits x8
    "vit": ("ti", 224, {r"head\.": (8.0, 0.0, slice(None))}),
    # per-pixel class logits x8 (a trained segmenter's sharp head)
    "segformer": ("b0", 128, {r"decode_head\.classifier\.": (8.0, 0.0, slice(None))}),
}


# applied at both gains: YOLOX keeps only the best class of a box, so class probabilities saturated
# at 1.0 tie exactly and any runtime may break the tie otherwise (an unverifiable decision, see
# docs/export.md); class logits in a trained model's range keep them apart
BASE: dict[str, dict[str, float]] = {"yolox": {r"head\.cls_preds\.": 0.1}}


def seeded(family: str, seed: int, high_gain: bool, nc: int = 5) -> Any:
    """An untrained model of ``family`` with seed-``seed`` initial weights, optionally high-gain."""
    from libreyolo.api import LibreYOLO
    from libreyolo.models.registry import get_family

    size, imgsz, recipe = CASES[family]
    fam = get_family(family)
    torch.manual_seed(seed)
    model = LibreYOLO(f"{fam.filename(size)}.yaml", nc=nc)
    g = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        for name, p in model.net.named_parameters():  # BN-free init gives flat scores: spread them a little
            if name.endswith("bias") and p.dim() == 1:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
        for name, p in model.net.named_parameters():  # the family's own seeding gains (outputs in range)
            for prefix, gain in fam.parity_seed_gains.items():
                if name.startswith(prefix):
                    p.mul_(gain)
            for pattern, factor in BASE.get(family, {}).items():
                if re.match(pattern, name):
                    p.mul_(factor)
        if high_gain:
            for name, p in model.net.named_parameters():
                for pattern, (scale, shift, channels) in recipe.items():
                    if re.match(pattern, name):
                        p.mul_(scale)
                        if name.endswith("bias") and shift:
                            p[channels].add_(shift)
    recalibrate_batchnorm(model, imgsz, seed)
    model.imgsz = imgsz
    return model


def recalibrate_batchnorm(model: Any, imgsz: int, seed: int, images: int = 4) -> None:
    """Set every BatchNorm's running statistics to those of its inputs on random images.

    Freshly initialised BatchNorm layers are identities while each convolution shrinks the signal,
    so an untrained detector's output hardly depends on its input (and a mutation deep inside
    changes nothing measurable). With the statistics of real activations, every layer normalises
    its input, as in a trained network, and the output depends on every layer."""
    g = torch.Generator().manual_seed(seed)
    pictures = [torch.randint(0, 256, (3, imgsz * 3 // 4, imgsz), generator=g, dtype=torch.uint8)
                for _ in range(images)]
    batch, _ = model.family.letterbox(imgsz)(pictures)
    bns = [m for m in model.net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    model.net.eval()
    for m in bns:
        m.reset_running_stats()
        m.momentum = None  # cumulative average over the calibration pass
        m.train()
    with torch.no_grad():
        model.net(batch.to(next(model.net.parameters()).device))
    for m in bns:
        m.momentum = 0.1
        m.eval()


def _mutated(model: Any, change) -> Any:
    m = copy.deepcopy(model)
    with torch.no_grad():
        change(m)
    m.release_graphs() if hasattr(m, "release_graphs") else None
    return m


def scale_one_conv(model: Any, factor: float = 1.01) -> Any:
    """One convolution (the middle one of the network) scaled by ``factor``."""
    def change(m: Any) -> None:
        convs = [mod for mod in m.net.modules() if isinstance(mod, nn.Conv2d)]
        convs[len(convs) // 2].weight.mul_(factor)
    return _mutated(model, change)


def swap_head_channels(model: Any) -> Any:
    """The classes of the last layer whose output size is the class count shifted by one (class i
    reads class i + 1's weights): every class moves, so whichever wins a box changes channel. (Two
    classes swapped is no change at all where neither ever wins, as in YOLOX's best-class output.)"""
    def change(m: Any) -> None:
        last = None
        for name, p in m.net.named_parameters():
            if name.endswith("weight") and p.dim() >= 2 and p.shape[0] == m.nc:
                last = name[: -len("weight")]
        params = dict(m.net.named_parameters())
        for suffix in ("weight", "bias"):
            p = params.get(last + suffix)
            if p is not None:
                p.copy_(p.roll(-1, 0))
    return _mutated(model, change)


def fp16_weights(model: Any) -> Any:
    """Weights rounded to float16 and back: an fp16 network in an artifact labelled fp32."""
    def change(m: Any) -> None:
        for p in m.net.parameters():
            p.copy_(p.half().float())
    return _mutated(model, change)


class _ChannelsSwapped(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.inner = net

    def forward(self, x: torch.Tensor) -> Any:
        return self.inner(x.flip(1))


def swap_rgb_bgr(model: Any) -> Any:
    """An artifact whose graph reads the channels in the other order."""
    m = copy.deepcopy(model)
    m.net = _ChannelsSwapped(m.net)
    return m


class _Preprocessing:
    """A runtime family view whose preprocessing is changed (a runtime bug to catch)."""

    def __init__(self, family: Any, change) -> None:
        self._family, self._change = family, change

    def letterbox(self, imgsz: int) -> Any:
        return self._change(self._family.letterbox(imgsz))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._family, name)


def wrong_preprocessing(runtime: Any) -> Any:
    """The runtime with its letterbox padding value changed (or, for a resize + crop, the mean)."""
    def change(pre: Any) -> Any:
        if hasattr(pre, "pad_value"):
            return dataclasses.replace(pre, pad_value=0.0 if pre.pad_value else 114.0)
        return dataclasses.replace(pre, mean=tuple(v + 0.05 for v in pre.mean))
    runtime.family = _Preprocessing(runtime.family, change)
    return runtime


MODEL_MUTATIONS = {"conv x1.01": scale_one_conv, "head classes shifted": swap_head_channels,
                   "fp16 weights labelled fp32": fp16_weights, "RGB/BGR swapped": swap_rgb_bgr}


def worst_ratio(report: Any) -> float:
    """The largest raw error relative to its allowance (inf where a shape or input check failed)."""
    ratios = [c.get("ratio", 0.0) for c in report.checks]
    return max((r if isinstance(r, float) and not math.isnan(r) else math.inf for r in ratios), default=0.0)
