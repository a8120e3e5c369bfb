"""Bit-for-bit equality of two programs' outputs (the graph parity harness: a CUDA graph replays
the eager kernels, so its outputs must equal eager's bits, never within a tolerance)."""
from __future__ import annotations

import torch

_INT_OF = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16,
           torch.float64: torch.int64}


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns: unlike ``torch.equal`` on floats, the same NaN equals itself and
    -0.0 differs from 0.0."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    bits = _INT_OF.get(a.dtype)
    return torch.equal(a.view(bits), b.view(bits)) if bits is not None else torch.equal(a, b)


def equal_outputs(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[bool, str]:
    """Named outputs ``a`` (another program) bit for bit equal to ``b`` (eager), and a line saying where not;
    a non-finite eager output fails too (such a probe proves nothing)."""
    if a.keys() != b.keys():
        return False, f"output names differ: {sorted(a)} vs {sorted(b)}"
    diffs = []
    for k in a:
        if a[k].shape != b[k].shape or a[k].dtype != b[k].dtype:
            diffs.append(f"{k}: {tuple(a[k].shape)} {a[k].dtype} vs {tuple(b[k].shape)} {b[k].dtype}")
        elif b[k].is_floating_point() and not bool(torch.isfinite(b[k]).all()):
            # not a graph fault, but a NaN/inf probe proves nothing: fix the weights or the probe
            diffs.append(f"{k}: eager output has {int((~torch.isfinite(b[k])).sum())} non-finite values")
        elif not bit_equal(a[k], b[k]):
            diffs.append(f"{k}: max abs diff {(a[k].double() - b[k].double()).abs().max().item():.3g}")
    return not diffs, "; ".join(diffs)
