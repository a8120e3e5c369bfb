"""Decoded-prediction matchers of export validation: each task names one (``Task.decoded_match``,
a family contract may override it with ``ExportContract.decoded_match``) to compare what eager
and artifact postprocessing return. A matcher returns at least ``passed``, ``eager``,
``artifact`` and ``matched`` counts; ``what`` (what was matched, for the report's headline) and
``line`` (its line in the report) when it is not a detection set."""
from __future__ import annotations

from typing import Any

import torch

from libreyolo.ops.boxes import box_iou


def match_detections(ref: dict, got: dict, *, conf: float, max_det: int, iou_min: float, score_tol: float,
                     nms_iou: float = 0.45, **_: Any) -> dict:
    """Match detections by class and IoU (greedy, best score first).

    Left-overs are tolerated only when they are explained by a tie: a *tie swap* is an
    unmatched pair, one from each side, of the same class, with scores within ``score_tol``
    and IoU above ``nms_iou``: two boxes that suppress each other, whose order a one-ulp
    difference decided (eager itself breaks exact ties by index). A single left-over is
    tolerated when its score is within ``score_tol`` of ``conf`` (a threshold flip) or at or
    below the last score of the other list when ``max_det`` cut that list (it fell off the end
    there because a tie earlier shifted the ranks). Anything else fails.
    """
    rb, rs, rc = ref["xyxy"].float().cpu(), ref["conf"].float().cpu(), ref["cls"].cpu()
    gb, gs, gc = got["xyxy"].float().cpu(), got["conf"].float().cpu(), got["cls"].cpu()
    iou = box_iou(rb, gb) if len(rb) and len(gb) else torch.zeros(len(rb), len(gb))
    iou = iou * (rc[:, None] == gc[None, :])
    # IoU says nothing about a box with a (nearly) zero side, e.g. one clipped to the image edge: 0.2 px
    # against 0.01 px of height is IoU 0.06. Such a pair matches when every coordinate is within the
    # error that IoU iou_min allows a square of the box's longer side, (1 - iou_min) / 4 of it
    if len(rb) and len(gb):
        side = (rb[:, 2:] - rb[:, :2]).amax(1, keepdim=True)
        close = (rb[:, None, :] - gb[None, :, :]).abs().amax(-1) <= (1.0 - iou_min) / 4 * side
        degenerate = close & (iou < iou_min) & (rc[:, None] == gc[None, :])
        iou = torch.where(degenerate, torch.full_like(iou, iou_min), iou)
    used = torch.zeros(len(gb), dtype=torch.bool)
    matched, ious, dconf, dbox = [], [], [], []
    ref_hit = torch.zeros(len(rb), dtype=torch.bool)
    for i in torch.argsort(rs, descending=True, stable=True).tolist():
        row = iou[i].masked_fill(used, -1.0) if len(gb) else iou[i]
        if not len(gb):
            break
        j = int(row.argmax())
        if float(row[j]) >= iou_min:
            used[j], ref_hit[i] = True, True
            matched.append((i, j))
            ious.append(float(row[j]))
            dconf.append(abs(float(rs[i]) - float(gs[j])))
            dbox.append(float((rb[i] - gb[j]).abs().max()))

    swaps = 0
    for i in torch.nonzero(~ref_hit).flatten().tolist():
        for j in torch.nonzero(~used).flatten().tolist():
            if (rc[i] == gc[j] and abs(float(rs[i]) - float(gs[j])) <= score_tol
                    and float(box_iou(rb[i:i + 1], gb[j:j + 1])[0, 0]) > nms_iou):
                ref_hit[i], used[j] = True, True
                swaps += 1
                break

    # fates decided by a swap: left-overs overlapping (same class, IoU > nms_iou) a swapped box,
    # transitively; a genuine error (wrong box, wrong score) has no swap to hang on
    cascade = 0
    if swaps:
        pool_b = [rb[i] for i in range(len(rb)) if ref_hit[i] and not any(i == a for a, _ in matched)]
        pool_b += [gb[j] for j in range(len(gb)) if used[j] and not any(j == b for _, b in matched)]
        pool_c = [rc[i] for i in range(len(rb)) if ref_hit[i] and not any(i == a for a, _ in matched)]
        pool_c += [gc[j] for j in range(len(gb)) if used[j] and not any(j == b for _, b in matched)]
        grew = True
        while grew:
            grew = False
            for boxes, classes, hit in ((rb, rc, ref_hit), (gb, gc, used)):
                for i in torch.nonzero(~hit).flatten().tolist():
                    if any(classes[i] == c and float(box_iou(boxes[i:i + 1], b[None])[0, 0]) > nms_iou
                           for b, c in zip(pool_b, pool_c, strict=True)):
                        hit[i] = True
                        pool_b.append(boxes[i])
                        pool_c.append(classes[i])
                        cascade += 1
                        grew = True

    def borderline(scores: torch.Tensor, hit: torch.Tensor, other: torch.Tensor) -> bool:
        # the other list was cut at max_det: a left-over scoring at or below its cut fell off there
        cut = float(other.min()) if len(other) >= max_det else None
        for s in scores[~hit].tolist():
            if abs(s - conf) <= score_tol or (cut is not None and s <= cut + score_tol):
                continue
            return False
        return True

    ok = borderline(rs, ref_hit, gs) and borderline(gs, used, rs)
    # a pass explains every left-over (tie swaps, what they decided, threshold and max_det flips)
    accounted = max(len(rb), len(gb)) if ok else len(matched) + swaps
    return {"eager": len(rb), "artifact": len(gb), "matched": len(matched), "tie_swaps": swaps, "swap_cascade": cascade,
            "accounted": accounted,
            "identical": len(matched) == len(rb) == len(gb), "min_iou": min(ious, default=1.0),
            "max_conf_diff": max(dconf, default=0.0), "max_box_error": max(dbox, default=0.0), "passed": ok}


def match_classes(ref: dict, got: dict, *, score_tol: float, k: int = 5, **_: Any) -> dict:
    """Compare two classifications (``probs`` (nc,) each): the top-``k`` classes and all probabilities.

    Passes when every probability is within ``score_tol`` and the top-``k`` class lists are equal,
    except where the two classes at a position differ by at most ``score_tol`` in the eager
    probabilities (a near-tie whose order one ulp decided). Detection arguments are ignored.
    """
    rp, gp = ref["probs"].float().cpu(), got["probs"].float().cpu()
    if tuple(rp.shape) != tuple(gp.shape):
        return {"kind": "classes", "eager": int(rp.numel()), "artifact": int(gp.numel()), "matched": 0,
                "tie_swaps": 0, "identical": False, "min_iou": 1.0, "max_conf_diff": float("inf"), "passed": False}
    k = min(k, int(rp.numel()))
    r_top = torch.sort(rp, descending=True, stable=True).indices[:k]
    g_top = torch.sort(gp, descending=True, stable=True).indices[:k]
    same = r_top == g_top
    ties = [j for j in torch.nonzero(~same).flatten().tolist()
            if abs(float(rp[r_top[j]]) - float(rp[g_top[j]])) <= score_tol]
    diff = float((rp - gp).abs().max()) if rp.numel() else 0.0
    ok = len(ties) == int((~same).sum()) and diff <= score_tol and bool(torch.isfinite(gp).all())
    return {"kind": "classes", "what": "top-k classes", "eager": k, "artifact": k, "matched": int(same.sum()),
            "tie_swaps": len(ties), "accounted": k if ok else int(same.sum()) + len(ties),
            "identical": bool(same.all()), "min_iou": 1.0, "max_conf_diff": diff,
            "top_eager": r_top.tolist(), "top_artifact": g_top.tolist(), "passed": ok,
            "line": f"top-{k} classes equal at {int(same.sum())}/{k}" + (f" + {len(ties)} near-tie swaps" if ties
                                                                          else "")
                    + f" (max probability diff {diff:.2g})"}


def match_masks(ref: dict, got: dict, *, allowed: dict[str, torch.Tensor] | None = None, **_: Any) -> dict:
    """Compare two class maps (``mask`` (h, w) each) pixel by pixel.

    A pixel where they differ is a *tie* when the eager top-two margin there (``ref["margin"]``,
    the gap between its best and second-best upsampled logit) is at most twice the largest logit
    allowance of this image (``allowed``, the validator's per-element allowances): each of the
    two logits may move by its allowance, and bilinear upsampling (a convex combination) does
    not widen that. Ties do not count against the artifact; any other differing pixel fails.
    Without margins (predict() against the artifact's own decoding) the maps must be equal.
    """
    rm, gm = ref["mask"].cpu(), got["mask"].cpu()
    base = {"kind": "pixels", "what": "pixels", "min_iou": 1.0, "max_conf_diff": 0.0}
    if tuple(rm.shape) != tuple(gm.shape):
        return {**base, "eager": int(rm.numel()), "artifact": int(gm.numel()), "matched": 0, "tie_swaps": 0,
                "identical": False, "passed": False,
                "line": f"class map shapes differ: eager {tuple(rm.shape)}, artifact {tuple(gm.shape)}"}
    differ = rm != gm
    n, bad = int(rm.numel()), int(differ.sum())
    gap = 0.0
    ties = 0
    if bad and "margin" in ref and allowed:
        gap = 2.0 * max(float(t.max()) for t in allowed.values())
        ties = int((differ & (ref["margin"].cpu().float() <= gap)).sum())
    ok = ties == bad
    agree = (n - bad) / max(1, n)
    return {**base, "eager": n, "artifact": n, "matched": n - bad, "tie_swaps": ties,
            "accounted": n - bad + ties, "identical": bad == 0, "agreement": agree, "tie_gap": gap, "passed": ok,
            "line": f"pixels agree {100 * agree:.4f}% ({n - bad}/{n})"
                    + (f"; {ties} differing pixel(s) at a tie (eager margin <= {gap:.3g})" if ties else "")
                    + (f"; {bad - ties} differ beyond a tie" if bad > ties else "")}
