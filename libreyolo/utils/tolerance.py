"""The tolerance model of export validation: allowances measured against float64, per output group.

An artifact is another float32 (or float16) program for the same network: it rounds differently
from the eager model, and how much that matters depends on the network and on the input (a
trained or high-gain network amplifies rounding; a box corner that is the difference of two
large numbers loses digits). No fixed threshold fits every model, so the allowance is measured:

1. The eager network runs in float32 (as exported) and, as a float64 copy on the CPU, on the
   same inputs. The float64 result is the reference: as good as exact at float32 precision.
2. Each output is split into the *groups* the family declares in its export contract
   (:class:`OutputGroup`: box coordinates, scores, logits, per-pixel maps, images). Each group has
   a *scale* per element: a box's own extent (its largest coordinate magnitude, so that
   ``x1 = cx - w/2`` is judged by the size of its operands, not by its possibly tiny value),
   1 for bounded values (scores, probabilities, image pixels), the per-sample RMS of the group
   for unbounded ones (logits, maps).
3. The eager model's *float32 drift* of a group is the largest ``|eager32 - float64| / scale``
   over its elements on all validation inputs.
4. Every element of an artifact's output may then be ``(ELEMENT_MULTIPLE * drift + FLOOR) * scale``
   away from float64: the artifact's largest error must be at most ``ELEMENT_MULTIPLE`` times the
   eager model's largest. fp16 artifacts may add ``FP16_DRIFT_FACTOR`` times the eager model's own
   fp16 drift (``|eager16 - eager32| / scale``) of the group.
5. Each group's error *distribution* over all probes: at each of :data:`QUANTILES` below 1 the
   artifact's error may be ``FLOAT32_MULTIPLE`` times eager's at the quantile with
   ``1 + FLOAT32_MULTIPLE`` times fewer elements above it (:func:`quantile_allowance`). A
   systematic error that stays below the largest element's allowance everywhere (every output
   scaled by 1.0001) moves these quantiles far past eager's.

The constants are measured (docs/export.md, "Tolerance model"). The largest error is a heavy-tailed
statistic: over 16 correct ONNX programs of seeded YOLOv9-t (ONNX Runtime 1.32, AMD EPYC with
AVX-512) it ranged from 0.5x to 10.2x the eager model's own largest, so ``ELEMENT_MULTIPLE`` 20
leaves a factor 2 over the worst (the earlier multiple 8, set from 16 programs on another CPU whose
worst was 3.0x, refused that one). The quantiles below 1 are stable: every correct program of the
survey stayed within 0.28x of the allowance ``FLOAT32_MULTIPLE`` 8 gives them, and every wrong
artifact of the mutation suite (a conv scaled by 1.01, the head's classes shifted, fp16-rounded
weights, channel order swapped, outputs scaled by 1.001) was refused. The fp16 factor is not
measured here (no fp16 artifact can be built on a CPU): the H200 AOTInductor fp16 package moved
boxes 1.3x as far as eager fp16 did, and 4 leaves a factor 3 over that.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch

# how many times the eager model's own float32 error (against float64) an artifact may have, at
# the quantiles of the error distribution below the largest (and for the rates of decisions)
FLOAT32_MULTIPLE = 8.0
# ... and at its largest element, a heavy-tailed statistic (see the module docstring)
ELEMENT_MULTIPLE = 20.0
# relative floor (of the element's scale): 8 float32 ulps, for groups the eager model happens to
# compute (almost) exactly on the probes
FLOOR = 8 * 2.0 ** -24
# fp16 artifacts: this times the eager model's own fp16 drift from fp32, on top of the fp32 part
FP16_DRIFT_FACTOR = 4.0
# rows of set predictions (DETR queries) are paired between two runs of one network when they
# match within this relative allowance; pairing only permutes rows, the real bar then judges them
ALIGN_RELATIVE = 1e-3
# an element where eager float32 and float64 disagree on being exactly zero, or differ by more than
# DECISION_RELATIVE of its scale, is a *decision*, not rounding: a tie broken the other way (YOLOX
# keeps the score of a box's best class only and zeroes the others, so a near-tie between two
# classes moves the score to another channel, whatever its size). Rounding noise turns no value into
# an exact zero and stays orders of magnitude below 1% of the scale (1e-7..1e-4 on every model
# measured, high gain included). Decisions are left out of the drift (one would widen the whole
# group) and such an element may instead differ from float64 by DECISION_FACTOR times eager's own
# difference there (an artifact that decides like eager passes)
DECISION_RELATIVE = 1e-2
DECISION_FACTOR = 2.0


def decided(a: torch.Tensor, ref64: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Elements where ``a`` and ``ref64`` (same shape, float64) differ by a decision, not rounding."""
    diff = (a - ref64).abs()
    return ((a == 0) != (ref64 == 0)) | (diff > DECISION_RELATIVE * scale)

_SCALES = {"box": "extent", "score": "unit", "sigmoid": "unit", "image": "unit", "logit": "rms", "map": "rms"}


@dataclass(frozen=True)
class OutputGroup:
    """A slice of one output that shares a unit: ``output[..., start:stop, ...]`` along ``axis``.

    ``kind``: ``box`` (4 coordinates along ``axis``; scale: the box's largest coordinate
    magnitude), ``score`` / ``image`` / ``sigmoid`` (values in [0, 1]; scale 1: ``sigmoid`` for
    outputs of a sigmoid that are not scores, e.g. DETR's normalised boxes, whose error is the
    logit's times the sigmoid's slope whatever the value), ``logit`` / ``map`` (unbounded; scale:
    the per-sample RMS of the group).
    """

    output: str
    kind: str
    axis: int = 1
    start: int = 0
    stop: int | None = None
    # only the best channel along ``axis`` is nonzero per column (YOLOX's best-class scores): which
    # channel holds it is a decision, so near-ties may be broken otherwise (see align_exclusive)
    exclusive: bool = False

    def __post_init__(self) -> None:
        if self.kind not in _SCALES:
            raise ValueError(f"unknown output group kind {self.kind!r}; one of {', '.join(_SCALES)}")

    @property
    def key(self) -> str:
        return f"{self.output}/{self.kind}"

    def view(self, t: torch.Tensor) -> torch.Tensor:
        axis = self.axis % t.dim()
        stop = t.shape[axis] if self.stop is None else min(self.stop, t.shape[axis])
        return t.narrow(axis, self.start, max(0, stop - self.start))

    def scale(self, ref: torch.Tensor) -> torch.Tensor:
        """Per-element scale of this group's view of ``ref`` (float64), the shape of the view."""
        v = self.view(ref).double().abs()
        how = _SCALES[self.kind]
        if how == "unit" or not v.numel():
            return torch.ones_like(v)
        if how == "extent":
            s = v.amax(self.axis % v.dim(), keepdim=True).expand_as(v)
        else:  # per-sample RMS over everything but the batch axis
            dims = tuple(range(1, v.dim()))
            s = v.pow(2).mean(dims, keepdim=True).sqrt().expand_as(v) if dims else v
        top = float(s.max())
        return s.clamp_min(top * 1e-6 if top > 0 else 1.0)


def groups_for(declared: tuple[OutputGroup, ...], outputs: dict[str, torch.Tensor]) -> list[OutputGroup]:
    """The declared groups of these outputs, plus one ``logit`` group for any floating output that
    no group declares (so nothing goes unchecked)."""
    groups = [g for g in declared if g.output in outputs]
    covered = {g.output for g in groups}
    return groups + [OutputGroup(name, "logit", axis=0) for name, t in outputs.items()
                     if name not in covered and t.is_floating_point()]


def normalised_error(group: OutputGroup, a: torch.Tensor, ref64: torch.Tensor) -> torch.Tensor:
    """``|a - ref64| / scale`` over the group's view (float64)."""
    ref64 = ref64.double().cpu()
    return (group.view(a).double().cpu() - group.view(ref64)).abs() / group.scale(ref64)


def drift(groups: list[OutputGroup], runs: list[tuple[dict, dict]], decisions: dict[str, int] | None = None,
          keep_decisions: bool = False) -> dict[str, float]:
    """Largest normalised error of each group over ``runs`` = [(outputs, float64 outputs), ...],
    decisions left out (their count per group goes to ``decisions`` when given) unless
    ``keep_decisions`` (a distance between two quantizations is made of them)."""
    out: dict[str, float] = {}
    for g in groups:
        worst, count = 0.0, 0
        for got, ref in runs:
            if g.output in got and g.output in ref and tuple(got[g.output].shape) == tuple(ref[g.output].shape):
                r = ref[g.output].double().cpu()
                a = g.view(got[g.output]).double().cpu()
                scale = g.scale(r)
                e = (a - g.view(r)).abs() / scale
                flip = decided(a, g.view(r), scale) & (not keep_decisions)
                count += int((flip & torch.isfinite(e)).sum())
                e = e[torch.isfinite(e) & ~flip]
                if e.numel():
                    worst = max(worst, float(e.max()))
        out[g.key] = worst
        if decisions is not None and count:
            decisions[g.key] = decisions.get(g.key, 0) + count
    return out


def allowance(groups: list[OutputGroup], ref64: dict[str, torch.Tensor], drift32: dict[str, float],
              drift16: dict[str, float] | None = None,
              eager: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Per-element allowance of every output (float64, CPU), from the groups' measured drifts; with
    the ``eager`` float32 outputs, decisions get ``DECISION_FACTOR`` times eager's own difference."""
    allowed: dict[str, torch.Tensor] = {}
    for g in groups:
        ref = ref64.get(g.output)
        if ref is None:
            continue
        ref = ref.double().cpu()
        if g.output not in allowed:
            allowed[g.output] = torch.full(ref.shape, math.inf, dtype=torch.float64)
        factor = ELEMENT_MULTIPLE * drift32.get(g.key, 0.0) + FLOOR
        if drift16:
            factor += FP16_DRIFT_FACTOR * drift16.get(g.key, 0.0)
        scale = g.scale(ref)
        bar = factor * scale
        if eager is not None and g.output in eager and tuple(eager[g.output].shape) == tuple(ref.shape):
            mine = g.view(eager[g.output]).double().cpu()
            own = (mine - g.view(ref)).abs()
            own = torch.where(torch.isfinite(own), own, torch.zeros_like(own))
            bar = torch.where(decided(mine, g.view(ref), scale), torch.maximum(bar, DECISION_FACTOR * own), bar)
        g.view(allowed[g.output]).copy_(bar)
    return allowed


# INT8: the quantized network's float32 run flips int8 rounding decisions against its float64 copy
# (the demo at 640: a median box error of 8e-4 of the box's extent), and an artifact flips others,
# so element by element no bar is both tight and correct. Its *distribution* of errors from float64
# is what must match, as for ties (align_exclusive): an artifact may be FLOAT32_MULTIPLE times as
# far from float64 as eager is, and so flip up to (1 + FLOAT32_MULTIPLE) times as many elements
# (seen: ONNX Runtime flips 10% of the demo's box coordinates at imgsz 64 where eager flips 2%).
# At each of these quantiles q, the artifact's error may be FLOAT32_MULTIPLE times eager's error
# at the quantile 1 - (1 - q) / (1 + FLOAT32_MULTIPLE)
QUANTILES = (0.5, 0.9, 0.99, 0.999, 1.0)


def _quantiles(err: torch.Tensor, levels: tuple[float, ...] = QUANTILES) -> torch.Tensor:
    err = err[torch.isfinite(err)].flatten()
    if not err.numel():
        return torch.zeros(len(levels), dtype=torch.float64)
    ranks = (torch.tensor(levels, dtype=torch.float64) * (err.numel() - 1)).round().long()
    return err.sort().values[ranks]


def quantile_allowance(group: OutputGroup, pairs: list[tuple[torch.Tensor, torch.Tensor]],
                       floors: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> torch.Tensor:
    """Per quantile (:data:`QUANTILES`), how far from float64 (relative to the element's scale) an
    artifact's errors may be, pooled over every probe (flips are rare events: one probe may have
    none): ``FLOAT32_MULTIPLE`` times the eager model's own error at the correspondingly higher
    quantile over ``pairs`` = [(eager, float64), ...] (``ELEMENT_MULTIPLE`` times its largest at
    the quantile 1, as element by element), plus ``FP16_DRIFT_FACTOR`` times that of
    ``floors`` = [(a format's own quantization run in eager, eager), ...] (the quantization floor),
    plus ``FLOOR``."""
    shifted = tuple(1.0 - (1.0 - q) / (1.0 + FLOAT32_MULTIPLE) for q in QUANTILES)
    multiple = torch.tensor([ELEMENT_MULTIPLE if q == 1.0 else FLOAT32_MULTIPLE for q in QUANTILES],
                            dtype=torch.float64)
    bar = multiple * _quantiles(pooled_error(group, pairs), shifted) + FLOOR
    if floors:
        bar = bar + FP16_DRIFT_FACTOR * _quantiles(pooled_error(group, floors), shifted)
    return bar


def pooled_error(group: OutputGroup, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """``|a - b| / scale(b)`` of every (a, b) in ``pairs``, flattened into one tensor (float64)."""
    return torch.cat([normalised_error(group, a.detach(), b).flatten() for a, b in pairs])


def quantile_ratio(group: OutputGroup, pairs: list[tuple[torch.Tensor, torch.Tensor]],
                   bar: torch.Tensor) -> tuple[float, float, float, float, list[float]]:
    """(worst ratio, its quantile, the artifact's error there, the allowance there, the ratio at
    every quantile) of the error quantiles of ``pairs`` = [(artifact, float64), ...] against ``bar``
    (:func:`quantile_allowance`)."""
    mine = _quantiles(pooled_error(group, pairs))
    ratios = mine / bar
    k = int(torch.argmax(ratios))
    return float(ratios[k]), QUANTILES[k], float(mine[k]), float(bar[k]), [float(r) for r in ratios]


def score_tolerance(groups: list[OutputGroup], allowed: dict[str, torch.Tensor]) -> float:
    """How far a decoded score may move, from the score-like groups' allowances: scores and
    probabilities directly; logits through a sigmoid or softmax, whose slope is at most 1/2."""
    tol = FLOOR
    for g in groups:
        if g.output not in allowed or g.kind not in ("score", "logit"):
            continue
        a = g.view(allowed[g.output])
        a = a[torch.isfinite(a)]
        if a.numel():
            tol = max(tol, float(a.max()) * (1.0 if g.kind == "score" else 0.5))
    return tol


def float64_copy(net: torch.nn.Module) -> torch.nn.Module:
    """A float64 CPU copy of ``net`` (the float32 master stays untouched)."""
    return copy.deepcopy(net).cpu().double().eval()


def as_float64(outputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v.detach().double().cpu() for k, v in outputs.items() if isinstance(v, torch.Tensor)}


def align_exclusive(group: OutputGroup, eager: torch.Tensor, got: torch.Tensor, allowed: torch.Tensor,
                    every64: torch.Tensor | None) -> tuple[torch.Tensor, int, int]:
    """For an ``exclusive`` group: ``got`` with the columns whose best value sits in another channel
    than eager's at a tie (a tie broken the other way) put in eager's channel; the number of such
    columns, and the number of columns the artifact flipped.

    ``every64`` is the float64 reference's output with every channel's value (the family's
    ``tie_evidence``; without it nothing is realigned). A flipped column is a tie when float64 puts
    eager's channel and the artifact's closer to each other than the artifact's own error can
    bridge, and the artifact's value is within its allowance of float64's for the channel it chose.
    The artifact's own error is measured on the same probe: its largest error (relative to scale)
    on the best channel of every column it did not flip, twice (each channel may move that far, in
    opposite directions), capped by the allowance. A program that rounds differently flips columns
    whose float64 gap is far below that (seen: gaps at most 1e-7 against an error of 1e-5); a head
    whose classes moved flips columns whatever their gap. (A count of eager's own ties cannot tell
    them apart: ONNX Runtime's AVX-512 kernels flip 21 columns of a high-gain YOLOX where eager
    flips 2, and a head shifted on its smallest level flips 24.) The value moved to eager's
    channel is the artifact's shifted by float64's gap between the two channels, so the element
    compared there carries the artifact's own error. Other flips stay, and the comparison fails them."""
    axis = group.axis % got.dim()
    e = group.view(eager).double().cpu().movedim(axis, -1)
    g = group.view(got).detach().double().cpu().movedim(axis, -1)
    if every64 is None or e.shape != g.shape or not e.numel():
        return got, 0, 0
    d = group.view(every64).double().cpu().movedim(axis, -1)
    if d.shape != g.shape:
        return got, 0, 0
    a = group.view(allowed).double().cpu().movedim(axis, -1)
    scale = group.scale(every64.double().cpu()).movedim(axis, -1)
    ve, ce = e.max(-1)
    vg, cg = g.max(-1)
    flipped = (ce != cg) & ((ve > 0) | (vg > 0))
    if not bool(flipped.any()):
        return got, 0, 0
    at = lambda t, c: t.gather(-1, c.unsqueeze(-1)).squeeze(-1)  # noqa: E731 - the value of channel c per column
    own = ((vg - at(d, cg)).abs() / at(scale, cg))[~flipped]
    own = own[torch.isfinite(own)]
    own = float(own.max()) if own.numel() else 0.0  # no column left to measure it on: nothing is bridged
    bridge = torch.minimum(at(a, ce) + at(a, cg), own * (at(scale, ce) + at(scale, cg)))
    differ = flipped & ((at(d, ce) - at(d, cg)).abs() <= bridge) & ((vg - at(d, cg)).abs() <= at(a, cg))
    moved = int(differ.sum())
    if not moved:
        return got, 0, int(flipped.sum())
    rows = torch.zeros_like(g[differ])
    rows[torch.arange(moved), ce[differ]] = vg[differ] + at(d, ce)[differ] - at(d, cg)[differ]
    fixed = g.clone()
    fixed[differ] = rows
    out = got.detach().clone()
    group.view(out).copy_(fixed.movedim(-1, axis).to(out.dtype))
    return out, moved, int(flipped.sum())
