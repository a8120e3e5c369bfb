"""The decoded matcher of the restore task: two 8-bit images, pixel by pixel.

The raw outputs are judged by the validator at their own allowance (group kind ``image``); a
value within it can still round to the neighbouring grey level, so decoded images pass when every
channel value differs by at most one grey level. The PSNR of the artifact against eager is
reported (infinite when identical).
"""
from __future__ import annotations

import math
from typing import Any

import torch

MAX_GREY_DIFF = 1


def match_images(ref: dict, got: dict, **_: Any) -> dict:
    """Compare ``ref["image"]`` and ``got["image"]`` ((H, W, 3) uint8 each)."""
    a, b = ref["image"].cpu(), got["image"].cpu()
    base = {"kind": "pixels", "what": "pixels", "min_iou": 1.0}
    n = int(a.numel())
    if tuple(a.shape) != tuple(b.shape):
        return {**base, "eager": n, "artifact": int(b.numel()), "matched": 0, "max_conf_diff": float("inf"),
                "psnr": 0.0, "passed": False,
                "line": f"restored image shapes differ: eager {tuple(a.shape)}, artifact {tuple(b.shape)}"}
    diff = (a.to(torch.int16) - b.to(torch.int16)).abs()
    worst = int(diff.max()) if n else 0
    within = int((diff <= MAX_GREY_DIFF).sum())
    mse = float(diff.float().pow(2).mean()) if n else 0.0
    psnr = math.inf if mse == 0 else 10.0 * math.log10(255.0 ** 2 / mse)
    exact = int((diff == 0).sum())
    return {**base, "eager": n, "artifact": n, "matched": within, "identical": worst == 0, "exact": exact,
            "max_grey_diff": worst, "max_conf_diff": worst / 255.0, "psnr": psnr, "passed": worst <= MAX_GREY_DIFF,
            "line": f"pixels within {MAX_GREY_DIFF} grey level {100 * within / max(1, n):.4f}% ({within}/{n}), "
                    f"max diff {worst}, PSNR {'inf' if math.isinf(psnr) else f'{psnr:.2f}'} dB"}
