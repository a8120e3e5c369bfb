"""Another program of a network (a compiled or graphed copy, a CUDA graph) against the eager network:
the export validator's raw-output comparison applied to outputs that never left PyTorch.

:func:`check_program` builds the float64 reference of the eager module on the same batch, the eager
copy's own drift from it (float32, and for a float16 copy its drift from float32), the allowance of
:mod:`libreyolo.utils.tolerance`, and judges each candidate group by group
(:func:`libreyolo.comparison.groups.compare_group`), realigning row sets and excusing selection edges
(:mod:`libreyolo.comparison.selection`) as export validation does. Used by ``Model.compile()``
(:mod:`libreyolo.engine.compiled`).
"""
from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from libreyolo.comparison import selection
from libreyolo.comparison.groups import compare_group, cosine, eager_drifts
from libreyolo.comparison.selection import align_row_sets, selection_edges
from libreyolo.utils.tolerance import FLOAT32_MULTIPLE, FP16_DRIFT_FACTOR, align_exclusive, allowance, groups_for


def _cpu(outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in outputs.items()}


def _converted(module: nn.Module, dtype: torch.dtype, device: torch.device) -> nn.Module:
    return copy.deepcopy(module).to(device=device, dtype=dtype).eval()


def check_program(module: nn.Module, family: Any, batch: torch.Tensor,
                  candidates: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
    """Whether each of ``candidates`` (named outputs of another program of ``module`` for ``batch``)
    passes the export validator's raw-output comparison against the eager ``module``.

    The reference is ``module`` itself run in float64 (on the batch's CUDA device, else the CPU);
    the allowance is the export one (:func:`libreyolo.utils.tolerance.allowance`): per output group
    of the family's export contract, ``FLOAT32_MULTIPLE`` times the eager float32 error against it
    plus ``FLOOR``, and for a float16 copy ``FP16_DRIFT_FACTOR`` times its own drift from its float32
    run; row sets and exclusive groups are realigned as the validator does; cosine floors are the
    contract's. Returns ``passed``, the worst ``ratio`` to the allowance and a one-line summary.
    """
    contract = family.export
    named = family.named_outputs
    ref_device = batch.device if batch.device.type == "cuda" else torch.device("cpu")
    rows = contract.query_rows()
    picked = rows.selection if rows.outputs else None
    with torch.inference_mode():
        raw, s_eager = selection.selection_runs(module, picked, batch)
        eager = _cpu(named(raw))
        net64 = _converted(module, torch.float64, ref_device)
        raw, s64 = selection.selection_runs(net64, picked, batch.to(ref_device, torch.float64))
        e64 = {k: v.double() for k, v in _cpu(named(raw)).items()}
        every64 = {k: v.double() for k, v in _cpu(family.tie_evidence(raw)).items()}
        if batch.dtype == torch.float32:
            run: dict[str, Any] = {"eager": eager, "e64": e64, "e16": None, "selection": (s_eager, s64, None)}
        else:  # judged like an fp16 artifact: float32 drift, plus the fp16 drift from float32
            net32 = _converted(module, torch.float32, batch.device)
            raw, s32 = selection.selection_runs(net32, picked, batch.float())
            eager32 = _cpu(named(raw))
            run = {"eager": eager32, "e64": e64, "e16": {k: v.float() for k, v in eager.items()},
                   "selection": (s32, s64, s_eager)}
    groups = groups_for(contract.groups, run["eager"])
    d32, d16 = eager_drifts(groups, [run], rows.outputs, {})
    selection_edges([run], rows.outputs, interior=not rows.whole_rows)
    allowed = allowance(groups, e64, d32, d16, eager=run["eager_aligned"])
    precision = "fp32" if batch.dtype == torch.float32 else "fp16"
    min_cos = contract.cosine_floor("compile", precision, batch.device.type)
    worst: dict[str, Any] = {"ratio": 0.0, "group": None}
    notes: list[str] = []
    for n, got in enumerate(candidates, 1):
        got = _cpu(got)
        compared, moved = align_row_sets(e64, got, rows.outputs, allowed=allowed) if rows.whole_rows \
            else (got, 0)
        if moved > rows.max_moved:
            return {"passed": False, "ratio": float("inf"),
                    "line": f"run {n}: {moved} query rows out of order (at most {rows.max_moved} allowed)"}
        compared, excused = selection.excuse_rows(e64, compared, rows.outputs, allowed, run["edges"], raw=got)
        if any(excused):
            notes.append(f"run {n}: " + selection.describe(excused, run["edges"]))
        for g in groups:
            out = g.output
            if out not in got:
                return {"passed": False, "ratio": float("inf"), "line": f"run {n}: output {out!r} is missing"}
            if g.exclusive:
                compared = {**compared, out: align_exclusive(g, run["eager_aligned"][out], compared[out], allowed[out],
                                                             every64.get(out))[0]}
            gap = FLOAT32_MULTIPLE * (1.0 - cosine(g.view(run["eager_aligned"][out]), g.view(e64[out])))
            if run["e16"] is not None:
                gap += FP16_DRIFT_FACTOR * (1.0 - cosine(g.view(run["e16"][out]), g.view(run["eager"][out])))
            check = compare_group(g, run["eager_aligned"][out], e64[out], compared[out], allowed[out], min_cos, gap)
            if not check["passed"]:
                return {"passed": False, "ratio": check["ratio"], "line": f"run {n}: " + _describe(check)}
            if check["ratio"] >= worst["ratio"]:
                worst = {"ratio": check["ratio"], "group": check["group"]}
    return {"passed": True, "ratio": worst["ratio"],
            "line": f"worst {worst['ratio']:.3g}x the allowance ({worst['group']})" + "".join(f"; {t}" for t in notes)}


def _describe(check: dict[str, Any]) -> str:
    if "shape" in check:
        return f"{check['group']}: {check['shape']}"
    if check["ratio"] > 1.0:
        return (f"{check['group']} at {check.get('index')}: {check['ratio']:.3g}x its allowance (compiled "
                f"{check.get('artifact', float('nan')):.7g}, eager {check.get('eager', float('nan')):.7g}, float64 "
                f"{check.get('float64', float('nan')):.7g})")
    if check["cosine"] < check["min_cosine"]:
        return f"{check['group']}: cosine {check['cosine']:.7f} below {check['min_cosine']:.7f}"
    return f"{check['group']}: non-finite values where the eager copy's are finite"
