"""One validator for every format: run the artifact through its runtime, compare with eager.

Inputs: the sample image (letterboxed like predict does) and probes of different
distributions (uniform, clipped normal, smooth ramps), at the exported batch size, plus a
second batch size and a non-square size when the artifact has dynamic axes. Raw outputs are
compared per output (max abs error against ``atol + rtol * |eager|``, cosine similarity in
float64) with the family contract's thresholds for the format and precision; decoded
predictions are compared by the function the family's contract names (``decoded_match``:
detections matched by class and IoU, classifications by their top-5 classes and probabilities),
and the sample image goes through both full ``predict()`` pipelines.
"""
from __future__ import annotations

import importlib
import math
import time
from pathlib import Path
from typing import Any

import torch

from libreyolo.export.base import Exporter, ExportOptions
from libreyolo.export.module import ExportModule
from libreyolo.export.report import ValidationReport
from libreyolo.ops.boxes import box_iou
from libreyolo.ops.letterbox import LetterboxMeta
from libreyolo.results import decoded_predictions

VALIDATION_CONF = 0.25


def probe_images(imgsz: int, height: int | None = None, seed: int = 0) -> dict[str, torch.Tensor]:
    """Synthetic (1, 3, H, W) inputs in [0, 1] of three distributions, rebuilt exactly from ``seed``."""
    h, w = height or imgsz, imgsz
    g = torch.Generator().manual_seed(seed)
    uniform = torch.rand(1, 3, h, w, generator=g)
    normal = (0.5 + 0.2 * torch.randn(1, 3, h, w, generator=g)).clamp(0, 1)
    ys = torch.linspace(0, 1, h).view(1, 1, h, 1).expand(1, 1, h, w)
    xs = torch.linspace(0, 1, w).view(1, 1, 1, w).expand(1, 1, h, w)
    ramps = torch.cat((xs, ys, 0.5 + 0.5 * torch.sin(6.0 * (xs + ys))), 1).contiguous()
    return {"uniform": uniform, "clipped-normal": normal, "ramps": ramps}


def sample_batch(family: Any, imgsz: int) -> tuple[torch.Tensor, list[LetterboxMeta]]:
    from libreyolo.assets import SAMPLE_IMAGE
    from libreyolo.data.sources import load_sources

    return family.letterbox(imgsz)([load_sources(SAMPLE_IMAGE)[0].data])


def align_row_sets(ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor], names: tuple[str, ...],
                   atol: float, rtol: float) -> tuple[dict[str, torch.Tensor], int]:
    """The artifact's outputs with the rows (axis 1) of ``names`` put back in eager order where
    they only traded places, and the largest number of rows moved in one image.

    A row is moved only onto an eager row it matches within the allowance in every output of
    ``names``; rows that match nothing stay where they are, so the comparison still fails them.
    """
    if not names or any(n not in ref or n not in got for n in names):
        return got, 0
    r = torch.cat([ref[n].detach().float().cpu().flatten(2) for n in names], -1)
    g = torch.cat([got[n].detach().float().cpu().flatten(2) for n in names], -1)
    if r.shape != g.shape or r.dim() != 3:
        return got, 0
    allowed = atol + rtol * r.abs()
    out_of_place = ((r - g).abs() > allowed).any(-1)
    order = torch.arange(r.shape[1]).repeat(r.shape[0], 1)
    most = 0
    for b in range(r.shape[0]):
        rows = out_of_place[b].nonzero().flatten().tolist()
        free, moved = list(rows), 0
        for i in rows:
            for j in free:
                if bool(((r[b, i] - g[b, j]).abs() <= allowed[b, i]).all()):
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


# An fp16 artifact is compared with the float32 eager model. The fixed fp16 thresholds alone are
# tighter than the eager model's own fp16 numerics on a trained network: the demo detector at 320,
# eager fp16 against eager fp32 on the CPU, moves box coordinates by up to 1.45 px on the ramps
# probe (3.3 times the fixed allowance), and the AOTInductor fp16 package by 1.88 px on the H200.
# So each raw output of an fp16 artifact may also differ by this factor times the largest
# difference between the eager model run in fp16 and in fp32 on the same probe (its "drift");
# the cosine bar and the detection matching are unchanged.
FP16_DRIFT_FACTOR = 2.0


def fp16_drift(model: Any, family: Any, x: torch.Tensor, ref: dict[str, torch.Tensor],
               half_net: Any) -> dict[str, float]:
    """Largest |eager fp16 - eager fp32| of each output on input ``x`` (float32 ``ref``)."""
    with torch.inference_mode():
        half = family.named_outputs(half_net(x.to(model.device, torch.float16)))
    drift = {k: float((half[k].float() - ref[k].float()).abs().max()) for k in ref
             if k in half and half[k].shape == ref[k].shape and ref[k].is_floating_point() and ref[k].numel()}
    return {k: v for k, v in drift.items() if math.isfinite(v)}  # an fp16 overflow widens nothing


def _half_copy(net: Any) -> Any | None:
    """A float16 copy of ``net`` for the drift measurement, or None where it cannot run."""
    import copy

    try:
        return copy.deepcopy(net).half().eval()
    except Exception:  # pragma: no cover - a module that cannot be copied or cast
        return None


def compare_outputs(ref: torch.Tensor, got: torch.Tensor, atol: float, rtol: float, min_cos: float,
                    drift: float = 0.0) -> dict:
    """Max abs error, worst error relative to the allowance, cosine; ``passed`` by the thresholds.

    The allowance of each element is ``atol + rtol * |ref| + drift`` (``drift``: see
    :data:`FP16_DRIFT_FACTOR`)."""
    if tuple(ref.shape) != tuple(got.shape):
        return {"max_abs_error": float("inf"), "allowed": atol, "cosine": 0.0, "passed": False,
                "shape": f"{tuple(got.shape)} vs eager {tuple(ref.shape)}"}
    r, g = ref.double().cpu(), got.double().cpu()
    err = (r - g).abs()
    allowed = atol + rtol * r.abs() + drift
    if r.is_floating_point() and r.numel() and float(r.norm()) > 0 and float(g.norm()) > 0:
        cos = float(torch.dot(r.flatten(), g.flatten()) / (r.norm() * g.norm()))
    else:
        cos = 1.0 if torch.equal(r, g) else 0.0
    worst = int(torch.argmax(err / allowed)) if err.numel() else 0  # the element nearest (or past) its allowance
    ok = bool((err <= allowed).all()) and cos >= min_cos and bool(torch.isfinite(g).all())
    return {"max_abs_error": float(err.max()) if err.numel() else 0.0,
            "worst_error": float(err.flatten()[worst]) if err.numel() else 0.0,
            "allowed": float(allowed.flatten()[worst]) if err.numel() else atol, "cosine": cos, "passed": ok}


def _detection_conf(model: Any, sample: torch.Tensor, metas: list, conf: float, wanted: int = 100) -> float:
    """``conf``, lowered when fewer than ``wanted`` (box, class) pairs of the sample pass it, so
    that the decoded-detection comparison always has detections to compare."""
    family = model.family
    with torch.inference_mode():
        out = family.named_outputs(model.net(sample.to(model.device, next(model.net.parameters()).dtype)))
    if not all(bool(torch.isfinite(t).all()) for t in out.values() if t.is_floating_point()):
        from libreyolo.export.base import ExportError

        raise ExportError("the eager model itself outputs NaN or Inf on the sample image (overflowing or broken "
                          "weights), so there is nothing valid to export or compare; nothing was written")
    name = family.export.nms_input
    if name is None:
        if family.task != "detect":
            return conf
        # no candidate tensor to rank (a set predictor, e.g. DETR): step conf down until the
        # family's own postprocessing keeps enough detections
        for c in (conf, 0.1, 0.05, 0.02, 0.01, 0.005, 0.001):
            if c > conf:
                continue
            kept = family.postprocess(out, metas, conf=c, iou=0.45, max_det=300, classes=None)
            if sum(int(k["conf"].numel()) for k in kept) >= min(wanted, 20):
                return c
        return c
    scores = out[name][:, 4:].float().flatten()
    if int((scores > conf).sum()) >= wanted or scores.numel() <= wanted:
        return conf
    return float(scores.topk(wanted).values[-1]) * 0.999


def match_detections(ref: dict, got: dict, *, conf: float, max_det: int, iou_min: float, score_tol: float,
                     nms_iou: float = 0.45) -> dict:
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
    return {"eager": len(rb), "artifact": len(gb), "matched": len(matched), "tie_swaps": swaps, "swap_cascade": cascade,
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
    return {"kind": "classes", "eager": k, "artifact": k, "matched": int(same.sum()), "tie_swaps": len(ties),
            "identical": bool(same.all()), "min_iou": 1.0, "max_conf_diff": diff,
            "top_eager": r_top.tolist(), "top_artifact": g_top.tolist(), "passed": ok}


def _batches(probes: dict[str, torch.Tensor], size: int,
             count: int | None = None) -> list[tuple[list[str], torch.Tensor]]:
    """Probes packed into batches of ``size`` (cycling through them), each with its probe names."""
    names = list(probes)
    count = -(-len(names) // size) if count is None else count
    out = []
    for b in range(count):
        pick = [names[(b * size + j) % len(names)] for j in range(size)]
        out.append((pick, torch.cat([probes[n] for n in pick])))
    return out


def _progress(items: list, desc: str) -> Any:
    """The validation inputs with a bar on stderr: on terminals only, and only once it takes a while."""
    import sys

    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="input", file=sys.stderr, disable=None, delay=2.0, leave=False)


def validate_artifact(model: Any, exporter: Exporter, path: Path, opts: ExportOptions) -> ValidationReport:
    """Run the artifact at ``path`` with its runtime and compare it with ``model``.

    On CUDA, float32 is compared with TF32 off on both sides (:func:`exact_float32`): the
    comparison is of two float32 programs, not of their TF32 noise.
    """
    from libreyolo.utils.numerics import exact_float32

    with exact_float32(opts.device):
        report = _validate(model, exporter, path, opts)
    if opts.device.type == "cuda" and opts.precision == "fp32":
        report.notes.append("compared with TF32 off (cuDNN and cuBLAS) on both sides")
    return report


def _validate(model: Any, exporter: Exporter, path: Path, opts: ExportOptions) -> ValidationReport:
    start = time.perf_counter()
    family = model.family
    runtime = importlib.import_module(f"libreyolo.runtimes.{exporter.runtime}").load(path, device=opts.device)
    reference = ExportModule(model.net, family, opts.nms, nc=model.nc)
    atol, rtol, min_cos = family.export.thresholds(exporter.name, opts.precision, opts.device.type)
    iou_min = 0.99 if opts.precision == "fp32" else 0.9
    nms = opts.nms
    conf = max(VALIDATION_CONF, nms["conf"]) if nms else VALIDATION_CONF
    iou, max_det = (nms["iou"], nms["max_det"]) if nms else (0.45, 300)
    report = ValidationReport("passed", runtime=runtime.describe())
    # how decoded predictions are compared is the family's declaration (detections, classes, ...)
    module_name, _, attr = family.export.decoded_match.partition(":")
    match_decoded = getattr(importlib.import_module(module_name), attr)

    sample, sample_metas = sample_batch(family, opts.imgsz)
    if not nms:
        conf = _detection_conf(model, sample, sample_metas, conf)
        if conf < VALIDATION_CONF:
            report.notes.append(f"the eager model scores few boxes above {VALIDATION_CONF} on the sample image "
                                f"(e.g. untrained weights), so detections are compared at conf={conf:.3g}")
    probes = {"sample": sample, **probe_images(opts.imgsz)}
    batches = _batches(probes, opts.batch)
    if opts.dynamic:
        batches += _batches(probes, opts.batch + 1, count=1)
        if opts.dynamic_spatial:
            h = max(2 * family.stride, opts.imgsz - 2 * family.stride)
            batches.append(([f"{h}x{opts.imgsz}"], probe_images(opts.imgsz, height=h, seed=1)["uniform"]))

    capped = 0
    art_sample = None
    half_net = _half_copy(model.net) if opts.precision == "fp16" and not nms else None
    largest_drift = 0.0
    for picks, x in _progress(batches, f"validating {exporter.name}"):
        name = "+".join(dict.fromkeys(picks)) + (f" (batch {len(picks)})" if len(picks) > 1 else "")
        x_ref = x.to(model.device, next(model.net.parameters()).dtype)
        with torch.inference_mode():
            eager_named = family.named_outputs(model.net(x_ref))
            ref = eager_named if reference.nms is None else dict(zip(
                reference.output_names(), reference.nms(eager_named[family.export.nms_input], x_ref), strict=True))
        got = runtime._forward(x.to(runtime.device, runtime._input_dtype(False)))
        if nms is None:
            compared, moved = align_row_sets(ref, got, family.export.row_sets, atol, rtol)
            if moved:
                report.notes.append(f"{name}: {moved} query row(s) traded places with a near-tied one (set "
                                    f"prediction; at most {family.export.max_moved_rows} allowed)")
                if moved > family.export.max_moved_rows:
                    report.checks.append({"probe": name, "output": "+".join(family.export.row_sets),
                                          "max_abs_error": float("inf"), "allowed": atol, "cosine": 0.0,
                                          "passed": False, "shape": f"{moved} rows out of order"})
            drift = {}
            if half_net is not None:
                try:
                    drift = fp16_drift(model, family, x, ref, half_net)
                except Exception as exc:  # an op without fp16 support on this device: fixed thresholds only
                    report.notes.append(f"the eager model's fp16 drift could not be measured ({type(exc).__name__}); "
                                        "the fixed fp16 thresholds apply")
                    half_net = None
                largest_drift = max([largest_drift, *drift.values()])
            for out_name, ref_t in ref.items():
                check = compare_outputs(ref_t, compared[out_name], atol, rtol, min_cos,
                                        drift=FP16_DRIFT_FACTOR * drift.get(out_name, 0.0))
                report.checks.append({"probe": name, "output": out_name, **check})
        # decoded: eager postprocessing of eager outputs against the artifact's own decoder
        plain = LetterboxMeta((x.shape[2], x.shape[3]), 1.0, (0.0, 0.0))
        metas = [sample_metas[0] if p == "sample" else plain for p in picks]
        eager = family.postprocess(eager_named, metas, conf=conf, iou=iou, max_det=max_det, classes=None)
        art = runtime.family.postprocess(got, metas, conf=conf, iou=iou, max_det=max_det, classes=None)
        if nms:
            over = (eager_named[family.export.nms_input][:, 4:] > conf).flatten(1).sum(1)
            if bool((over > nms["topk"]).any()):
                within_topk = runtime.family.postprocess(ref, metas, conf=conf, iou=iou, max_det=max_det, classes=None)
                eager = [t if bool(o > nms["topk"]) else e for e, t, o in zip(eager, within_topk, over, strict=True)]
                capped += int((over > nms["topk"]).sum())
        for k, (e, a) in enumerate(zip(eager, art, strict=True)):
            m = match_decoded(e, a, conf=conf, max_det=max_det, iou_min=iou_min, score_tol=atol, nms_iou=iou)
            report.detections.append({"probe": picks[k] + (f" (batch {len(picks)})" if len(picks) > 1 else ""), **m})
        if art_sample is None and picks[0] == "sample":
            art_sample = art[0]

    # the sample image through the artifact's complete predict(); the eager side is the same
    # letterbox + network + postprocess that eager predict() runs, computed above
    from libreyolo.assets import SAMPLE_IMAGE

    if art_sample is not None:
        r = runtime.predict(SAMPLE_IMAGE, imgsz=opts.imgsz, conf=conf, iou=iou, max_det=max_det)
        got = decoded_predictions(family.task, r)
        m = match_decoded(art_sample, got, conf=conf, max_det=max_det, iou_min=iou_min, score_tol=atol, nms_iou=iou)
        report.detections.append({"probe": "predict(sample) vs artifact decode", **m})
    if nms:
        report.notes.append("embedded NMS outputs are compared as detection sets (rows of tied scores may swap)")
    if capped:
        report.notes.append(
            f"on {capped} input(s) more than topk={nms['topk']} (box, class) pairs score above conf={conf}: "
            "the embedded NMS is exact for the top-k candidates only, so those inputs were compared with eager "
            "greedy NMS over the same top-k candidates (see docs/export.md, embedded NMS limits)")
    if opts.precision == "fp16":
        report.notes.append("fp16 artifact compared with the float32 eager model at the fp16 thresholds")
        if half_net is not None:
            report.notes.append(f"raw outputs may also differ by {FP16_DRIFT_FACTOR:g}x the eager model's own fp16 "
                                f"drift from fp32 on each probe (largest drift: {largest_drift:.3g})")
    if not all(c["passed"] for c in report.checks) or not all(d["passed"] for d in report.detections):
        report.status = "failed"
    report.seconds = time.perf_counter() - start
    return report
