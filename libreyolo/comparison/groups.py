"""The raw-output checks of export validation: one output group against a float64 copy of the
eager model, element by element and by cosine (:func:`compare_group`), and the error
distribution of each group over every probe (:func:`distribution_checks`, with the pooled
allowance of :func:`distribution_bars`; INT8 artifacts' element bars: :func:`compare_quantized`).
The allowances come from :mod:`libreyolo.utils.tolerance`; :mod:`libreyolo.export.validate`
runs the probes and decides.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from libreyolo.comparison.selection import align_row_sets
from libreyolo.utils.tolerance import (
    ALIGN_RELATIVE,
    QUANTILES,
    OutputGroup,
    as_float64,
    drift,
    quantile_allowance,
    quantile_ratio,
)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of two tensors in float64 (1 for two empty or two equal zero or non-finite ones)."""
    a, b = a.detach().double().cpu().flatten(), b.detach().double().cpu().flatten()  # eager may be on CUDA
    if not a.numel():
        return 1.0
    na, nb = float(a.norm()), float(b.norm())
    if na == 0 or nb == 0 or not (math.isfinite(na) and math.isfinite(nb)):
        return 1.0 if torch.equal(a, b) else 0.0
    return float(torch.dot(a, b) / (na * nb))


def compare_group(group: OutputGroup, eager: torch.Tensor, ref64: torch.Tensor, got: torch.Tensor,
                  allowed: torch.Tensor, min_cosine: float, cosine_gap: float = 0.0) -> dict[str, Any]:
    """One group of one output: the artifact ``got`` against the float64 reference, element by element
    within ``allowed`` (:func:`libreyolo.utils.tolerance.allowance`), and by cosine.

    The cosine bar is ``min_cosine``, lowered to ``1 - cosine_gap`` where the eager model's own drift
    needs it, and not applied to a group whose values all lie within their allowance of zero (e.g.
    scores of 1e-9, which one runtime's sigmoid flushes to 0). The result names the element nearest
    to (or furthest past) its allowance, with the eager, artifact and float64 values there."""
    if tuple(got.shape) != tuple(ref64.shape):
        return {"group": group.key, "kind": group.kind, "max_abs_error": math.inf, "float64_error": math.inf,
                "eager_float64_error": 0.0, "ratio": math.inf, "eager_ratio": 0.0, "allowed": 0.0,
                "cosine": 0.0, "min_cosine": min_cosine, "passed": False,
                "shape": f"{tuple(got.shape)} vs eager {tuple(ref64.shape)}"}
    r = group.view(ref64).double().cpu()
    g = group.view(got.detach()).double().cpu()
    e = group.view(eager.detach()).double().cpu()
    a = group.view(allowed).double().cpu()
    # where the eager float32 model itself overflows (inf, or nan from inf - inf), the artifact must
    # reproduce that value exactly; those elements carry no rounding to measure
    overflow = ~torch.isfinite(e)
    same = overflow & ((g == e) | (torch.isnan(g) & torch.isnan(e)))
    err = torch.where(overflow, torch.zeros_like(r), (g - r).abs())
    eager_err = torch.where(overflow, torch.zeros_like(r), (e - r).abs())
    finite = bool((torch.isfinite(g) | same).all()) and bool((same | ~overflow).all())
    ratio = torch.where(torch.isfinite(err), err / a, torch.full_like(err, math.inf))
    ratio = torch.where(overflow & ~same, torch.full_like(ratio, math.inf), ratio)
    keep = ~overflow & torch.isfinite(g)
    cos = cosine(r[keep], g[keep])
    bar = min(min_cosine, 1.0 - cosine_gap)
    if float(r[keep].norm()) <= float(a[keep & torch.isfinite(a)].norm()):
        bar = -1.0  # the whole signal lies within its allowance: its direction is noise, not a check
    out: dict[str, Any] = {"group": group.key, "kind": group.kind, "cosine": cos, "min_cosine": bar}
    if not err.numel():
        return {**out, "max_abs_error": 0.0, "float64_error": 0.0, "eager_float64_error": 0.0, "ratio": 0.0,
                "eager_ratio": 0.0, "allowed": 0.0, "passed": True}
    worst = int(torch.argmax(torch.nan_to_num(ratio, nan=math.inf)))
    where = list(torch.unravel_index(torch.tensor(worst), r.shape))
    index = [int(i) for i in where]
    index[group.axis % r.dim()] += group.start
    flat = lambda t: float(t.flatten()[worst])  # noqa: E731
    worst_ratio = float(ratio.flatten()[worst])
    ok = finite and worst_ratio <= 1.0 and cos >= bar
    return {**out, "max_abs_error": float((g - e).abs().max()), "float64_error": float(err.max()),
            "eager_float64_error": float(eager_err.max()), "ratio": worst_ratio,
            "eager_ratio": float((eager_err / a).max()), "allowed": flat(a), "index": index,
            "eager": flat(e), "artifact": flat(g), "float64": flat(r), "passed": ok}


def distribution_bars(groups: list[OutputGroup], runs: list[dict]) -> dict[str, torch.Tensor]:
    """Per group, the pooled error-quantile allowance (:func:`quantile_allowance`) from the eager
    model's own float32-vs-float64 errors over every probe, plus the fp16 drift (or, for a format that
    quantizes with its own toolchain, the quantization floor) where it was measured."""
    bars = {}
    for g in groups:
        pairs = [(r["eager_aligned"][g.output], r["e64"][g.output]) for r in runs if g.output in r["eager_aligned"]]
        floors = [(r["e16_aligned"][g.output], r["eager"][g.output]) for r in runs
                  if r.get("e16_aligned") is not None and g.output in r["e16_aligned"]]
        bars[g.key] = quantile_allowance(g, pairs, floors or None)
    return bars


def compare_quantized(g: OutputGroup, run: dict, compared: dict, allowed: dict, bar: torch.Tensor, min_cos: float,
                       gap: float) -> dict[str, Any]:
    """One group of an INT8 artifact on one probe, element by element: no bar tighter than the
    quantized eager model's own largest error over every probe (flips included) times the multiple;
    its error distribution is judged once, over all probes (:func:`distribution_checks`)."""
    out = g.output
    element_bar = allowed[out].clone()
    g.view(element_bar).copy_(bar[-1] * g.scale(run["e64"][out].double().cpu()))
    return compare_group(g, run["eager_aligned"][out], run["e64"][out], compared[out], element_bar, min_cos, gap)


def distribution_checks(groups: list[OutputGroup], artifact: list[tuple[dict, dict]],
                         bars: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    """Per group, the artifact's error quantiles from float64 over every probe against the pooled
    allowance (:func:`distribution_bars`), ``artifact`` = [(its compared outputs, float64 outputs), ...]."""
    checks = []
    for g in groups:
        pairs = [(got[g.output], ref[g.output]) for got, ref in artifact
                 if g.output in got and tuple(got[g.output].shape) == tuple(ref[g.output].shape)]
        if not pairs:
            continue
        ratio, q, mine, allowed_q, ratios = quantile_ratio(g, pairs, bars[g.key])
        levels = ", ".join(f"{v:g}" for v in QUANTILES)
        checks.append({"probe": "all probes", "output": g.output, "group": g.key, "kind": g.kind, "ratio": ratio,
                       "passed": ratio <= 1.0, "quantile": {"q": q, "artifact": mine, "allowed": allowed_q},
                       "quantile_ratios": dict(zip(QUANTILES, ratios, strict=True)),
                       "line": f"{ratio:.2f}x allowance (error quantiles {levels} from float64; worst at {q:g}: "
                               f"artifact {mine:.3g}, allowed {allowed_q:.3g} of the element's scale)"})
    return checks


def eager_drifts(groups: list, runs: list[dict], row_sets: tuple[str, ...],
            decisions: dict[str, int], quant_floor: bool = False) -> tuple[dict, dict | None]:
    """The eager model's float32 drift from float64 and (fp16 runs) its fp16 drift from float32, per
    group, after pairing set-prediction rows that a near-tie reordered between the two runs."""
    def paired(a: dict, ref: dict) -> dict:
        if not row_sets:
            return a
        allowed = {}
        for g in groups:
            if g.output in ref:
                t = allowed.setdefault(g.output, torch.full(ref[g.output].shape, math.inf, dtype=torch.float64))
                g.view(t).copy_(ALIGN_RELATIVE * g.scale(ref[g.output].double().cpu()))
        return align_row_sets(ref, a, row_sets, allowed=allowed)[0]

    for run in runs:
        run["eager_aligned"] = paired(run["eager"], run["e64"])
    d32 = drift(groups, [(r["eager_aligned"], r["e64"]) for r in runs], decisions)
    d16 = None
    if all(r["e16"] is not None for r in runs):
        for run in runs:
            run["e16_aligned"] = paired(run["e16"], as_float64(run["eager"]))
        d16 = drift(groups, [(r["e16_aligned"], as_float64(r["eager"])) for r in runs], keep_decisions=quant_floor)
    return d32, d16
