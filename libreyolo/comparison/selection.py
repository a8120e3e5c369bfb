"""Rows of set predictions (DETR queries) in validation: rows that traded places, and near-ties at the
edge of the query selection.

:func:`align_row_sets` puts back rows that only traded places between two programs (a near-tie
inside the selection decided by one ulp). The rest of this module is about the selection's edge.

RT-DETR and D-FINE keep the ``k`` best of thousands of encoder candidates (top-k of their best class
score) as decoder queries. Another float32 program of the same network (an artifact, a compiled copy)
computes those scores with other rounding, so where the ``k``-th and the ``(k+1)``-th candidates lie
closer than that rounding, it may keep the other one: a correct program whose last query row belongs to
another candidate. Untrained weights make this the rule, not the exception (measured on the CPU at
640: D-FINE-n's float64 boundary gaps 6e-9..5e-8 against a float32 score error of ~1e-6; the eager
float32 model itself keeps 1-2 other candidates than float64 per input).

The validator therefore measures, per image, how many candidates lie within reach of the boundary:
an artifact may be ``FLOAT32_MULTIPLE`` times as far from float64 as eager float32 is, so two
candidates whose float64 scores differ by less than twice that may be ordered either way. Up to
that many query rows, all at the rows such candidates occupy (the last ones: rows are in score
order), may then match no reference row; they are left out of the raw comparison, with a note.
Every other row is still compared element by element, so a wrong program is still refused (it
moves all rows, not a few at the boundary). Families declare where the scores come from in their
export contract (``selection``: the module whose output's maximum over the last axis is each
candidate's score).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from libreyolo.utils.tolerance import FLOAT32_MULTIPLE, FLOOR, FP16_DRIFT_FACTOR


@contextlib.contextmanager
def tap(net: nn.Module, path: str | None) -> Iterator[list[torch.Tensor]]:
    """While active, the selection scores of every forward of ``net`` (``(B, N)``, float64, CPU: the
    maximum over the last axis of the output of submodule ``path``) are appended to the yielded list.
    Nothing is collected where ``path`` is None or ``net`` has no such submodule."""
    scores: list[torch.Tensor] = []
    try:
        module = net.get_submodule(path) if path else None
    except AttributeError:
        module = None
    if module is None:
        yield scores
        return
    handle = module.register_forward_hook(
        lambda _m, _i, out: scores.append(out.detach().max(-1).values.double().cpu()))
    try:
        yield scores
    finally:
        handle.remove()


@dataclass(frozen=True)
class Boundary:
    """One image's selection edge: up to ``swaps`` selected candidates may trade places with unselected
    ones in another program within the allowance, and their rows are at ``first_row`` or after."""

    swaps: int = 0
    first_row: int = 0
    gap: float = 0.0    # the float64 scores' gap between the last kept and the first left-out candidate
    reach: float = 0.0  # how far apart two candidates may be and still be ordered either way
    # kept ranks (query rows) whose candidate lies within reach of the next or previous kept one:
    # where each query's content is its own (QueryRows.whole_rows False), a program that orders the
    # two the other way changes part of both rows; filled only where asked (``interior``)
    ties: tuple[int, ...] = ()


def boundaries(s32: torch.Tensor, s64: torch.Tensor, k: int, s16: torch.Tensor | None = None,
               drift32: float | None = None, drift16: float | None = None,
               interior: bool = False) -> list[Boundary]:
    """Per image of ``(B, N)`` selection scores (eager float32 and float64; ``s16``: eager float16, for
    a float16 program), the near-ties a program may break otherwise at the top-``k`` edge.

    Reach: twice (``FLOAT32_MULTIPLE`` times eager float32's largest score error against float64, plus
    ``FP16_DRIFT_FACTOR`` times float16's against float32, plus ``FLOOR`` of the largest score);
    ``drift32``/``drift16`` override the errors measured on these scores (the largest over all inputs)."""
    if s64.dim() != 2 or s64.shape != s32.shape or s64.shape[1] <= k or k <= 0:
        return [Boundary() for _ in range(s64.shape[0] if s64.dim() else 0)]
    d32 = float((s32 - s64).abs().max()) if drift32 is None else drift32
    d16 = 0.0
    if s16 is not None and s16.shape == s32.shape:
        d16 = float((s16 - s32).abs().max()) if drift16 is None else drift16
    out = []
    for row in s64:
        top = row.sort(descending=True).values
        reach = 2.0 * (FLOAT32_MULTIPLE * d32 + FP16_DRIFT_FACTOR * d16 + FLOOR * float(top.abs().max()))
        kept_near = int((top[:k] - top[k] <= reach).sum())       # kept, within reach of the first left out
        left_near = int((top[k - 1] - top[k:] <= reach).sum())   # left out, within reach of the last kept
        swaps = min(kept_near, left_near)
        ties: tuple[int, ...] = ()
        if interior:
            near = (top[: k - 1] - top[1:k]) <= reach  # rank i and i + 1 within reach
            tied = torch.zeros(k, dtype=torch.bool)
            tied[:-1] |= near
            tied[1:] |= near
            ties = tuple(tied.nonzero().flatten().tolist())
        out.append(Boundary(swaps, k - kept_near if swaps else k, float(top[k - 1] - top[k]), reach, ties))
    return out


def excuse_rows(ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor], names: tuple[str, ...],
                allowed: dict[str, torch.Tensor], edges: list[Boundary],
                raw: dict[str, torch.Tensor] | None = None) -> tuple[dict[str, torch.Tensor], list[list[int]]]:
    """``got`` (rows aligned to ``ref`` from the program's ``raw`` rows) with the rows that match no
    reference row replaced by the reference's, where an image has at most its :class:`Boundary`
    ``swaps`` of them, all at its ``first_row`` or after, and the program's own rows that the alignment
    left unused (the candidates it kept instead) are as few and also at ``first_row`` or after in its
    own order (a candidate kept above the edge would have a higher score than near-tied ones can reach).
    Returns the rows and the excused positions per image; an image that breaks a rule keeps all its
    rows (the comparison then fails them)."""
    excused: list[list[int]] = [[] for _ in edges]
    if not names or any(n not in ref or n not in got or n not in allowed for n in names) or not any(
            e.swaps or e.ties for e in edges):
        return got, excused
    bad = None
    for n in names:
        r, g, a = ref[n].double().cpu(), got[n].detach().double().cpu(), allowed[n].double().cpu()
        if r.shape != g.shape or r.dim() < 2 or r.shape[0] != len(edges):
            return got, excused
        over = ~((g - r).abs() <= a)  # NaN counts as over
        over = over.flatten(2).any(-1)
        bad = over if bad is None else bad | over
    raw = got if raw is None else raw
    mine = torch.cat([got[n].detach().double().cpu().flatten(2) for n in names], -1)
    theirs = torch.cat([raw[n].detach().double().cpu().flatten(2) for n in names], -1)
    fixed = {n: got[n].detach().clone() for n in names}
    for b, edge in enumerate(edges):
        rows = bad[b].nonzero().flatten().tolist()
        at_edge = [r for r in rows if r not in edge.ties]  # rows at an interior near-tie are excused as such
        if not rows or len(at_edge) > edge.swaps or (at_edge and min(at_edge) < edge.first_row):
            continue
        used = (theirs[b][:, None, :] == mine[b][None, :, :]).all(-1).any(1)  # raw rows some aligned row copies
        unused = (~used).nonzero().flatten().tolist()
        if len(unused) > edge.swaps or (unused and min(unused) < edge.first_row):
            continue
        excused[b] = rows
        for n in names:
            fixed[n][b, rows] = ref[n][b, rows].to(fixed[n].device, fixed[n].dtype)
    if not any(excused):
        return got, excused
    return {**got, **fixed}, excused


def describe(excused: list[list[int]], edges: list[Boundary]) -> str:
    """One line for a report: which rows were left out and why."""
    parts = [f"image {b}: rows {rows} (float64 gap {edges[b].gap:.2g} at the edge, reach {edges[b].reach:.2g}, "
             f"{edges[b].swaps} candidate(s) within it"
             + (f"; {len([r for r in rows if r in edges[b].ties])} at near-tied ranks inside the selection"
                if edges[b].ties else "") + ")" for b, rows in enumerate(excused) if rows]
    inside = any(edges[b].ties for b, rows in enumerate(excused) if rows)
    return ("query rows at the edge of the top-k selection" + (" or at near-tied ranks inside it" if inside else "")
            + " hold another near-tied candidate and are not compared: " + "; ".join(parts))


def selection_runs(net: nn.Module, path: str | None, x: torch.Tensor) -> tuple[Any, torch.Tensor | None]:
    """``net(x)`` with its selection scores tapped: (its output, the scores or None)."""
    with tap(net, path) as scores:
        result = net(x)
    return result, (scores[-1] if scores else None)


def align_row_sets(ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor], names: tuple[str, ...],
                   atol: float = 0.0, rtol: float = 0.0,
                   allowed: dict[str, torch.Tensor] | None = None) -> tuple[dict[str, torch.Tensor], int]:
    """The artifact's outputs with the rows (axis 1) of ``names`` put back in ``ref`` order where
    they only traded places, and the largest number of rows moved in one image.

    A row is moved only onto a reference row it matches within the allowance in every output of
    ``names`` (``allowed``: per-element allowances shaped like ``ref``; else ``atol + rtol * |ref|``);
    rows that match nothing stay where they are, so the comparison still fails them.
    """
    if not names or any(n not in ref or n not in got for n in names):
        return got, 0
    r = torch.cat([ref[n].detach().double().cpu().flatten(2) for n in names], -1)
    g = torch.cat([got[n].detach().double().cpu().flatten(2) for n in names], -1)
    if r.shape != g.shape or r.dim() != 3:
        return got, 0
    if allowed is not None and all(n in allowed for n in names):
        allow = torch.cat([allowed[n].double().cpu().flatten(2) for n in names], -1)
    else:
        allow = atol + rtol * r.abs()
    out_of_place = ((r - g).abs() > allow).any(-1)
    order = torch.arange(r.shape[1]).repeat(r.shape[0], 1)
    most = 0
    for b in range(r.shape[0]):
        rows = out_of_place[b].nonzero().flatten().tolist()
        free, moved = list(rows), 0
        for i in rows:
            for j in free:
                if bool(((r[b, i] - g[b, j]).abs() <= allow[b, i]).all()):
                    order[b, i] = j
                    free.remove(j)
                    moved += 1
                    break
        most = max(most, moved)
    if not most:
        return got, 0
    batch = torch.arange(r.shape[0])[:, None]
    aligned = dict(got)
    for n in names:
        aligned[n] = got[n][batch.to(got[n].device), order.to(got[n].device)]
    return aligned, most


def selection_edges(runs: list[dict], row_sets: tuple[str, ...], interior: bool = False) -> None:
    """Each run's :class:`~libreyolo.comparison.selection.Boundary` per image (``run["edges"]``), from the
    selection scores tapped in it, with the eager model's largest score errors over all runs."""
    scored = [r for r in runs if r.get("selection") and r["selection"][0] is not None
              and r["selection"][1] is not None and row_sets and row_sets[0] in r["e64"]]
    d32 = max((float((r["selection"][0] - r["selection"][1]).abs().max()) for r in scored), default=0.0)
    halves = [r for r in scored if r["selection"][2] is not None]
    d16 = max((float((r["selection"][2] - r["selection"][0]).abs().max()) for r in halves), default=0.0)
    ids = {id(r) for r in scored}
    for r in runs:
        r["edges"] = []
        if id(r) in ids:
            s32, s64, s16 = r["selection"]
            r["edges"] = boundaries(s32, s64, r["e64"][row_sets[0]].shape[1], s16, d32,
                                              d16 if s16 is not None else None, interior)
