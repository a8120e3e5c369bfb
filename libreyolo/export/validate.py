"""One validator for every format: run the artifact through its runtime, compare with eager.

Inputs: the sample image (letterboxed like predict does) and probes of different
distributions (uniform, clipped normal, smooth ramps), at the exported batch size, plus a
second batch size and a non-square size when the artifact has dynamic axes. Raw outputs are
compared per output group with a float64 copy of the eager model, each element within a
multiple of the eager float32 model's own error against float64 (the tolerance model of
:mod:`libreyolo.utils.tolerance`), and by cosine similarity; decoded predictions are compared
by the function the family's contract names (``decoded_match``: detections matched by class
and IoU, classifications by their top-5 classes and probabilities), and the sample image goes
through both full ``predict()`` pipelines.
"""
from __future__ import annotations

import importlib
import math
import time
from pathlib import Path
from typing import Any

import torch

from libreyolo.comparison import selection
from libreyolo.comparison.groups import (
    compare_group,
    compare_quantized,
    cosine,
    distribution_bars,
    distribution_checks,
    eager_drifts,
)
from libreyolo.comparison.matching import match_classes, match_detections  # noqa: F401 - older contracts name them here
from libreyolo.comparison.selection import align_row_sets, selection_edges
from libreyolo.export.base import Exporter, ExportOptions
from libreyolo.export.module import ExportModule
from libreyolo.export.report import ValidationReport
from libreyolo.ops.letterbox import LetterboxMeta
from libreyolo.results import decoded_predictions
from libreyolo.tasks import get_task
from libreyolo.tasks.base import resolve
from libreyolo.utils.tolerance import (
    DECISION_FACTOR,
    ELEMENT_MULTIPLE,
    FLOAT32_MULTIPLE,
    FLOOR,
    FP16_DRIFT_FACTOR,
    QUANTILES,
    align_exclusive,
    allowance,
    as_float64,
    float64_copy,
    groups_for,
    score_tolerance,
)


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

    pre = family.letterbox(imgsz)
    image = load_sources(SAMPLE_IMAGE)[0].data
    if hasattr(pre, "export_sample"):  # a preprocessor that keeps an image's own size takes its imgsz crop
        image = pre.export_sample(image)
    return pre([image])


def _half_copy(net: Any) -> Any | None:
    """A float16 copy of ``net`` for the fp16 drift measurement, or None where it cannot run."""
    import copy

    try:
        return copy.deepcopy(net).half().eval()
    except Exception:  # pragma: no cover - a module that cannot be copied or cast
        return None


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


def validate_artifact(model: Any, exporter: Exporter, path: Path, opts: ExportOptions,
                      runtime: Any = None) -> ValidationReport:
    """Run the artifact at ``path`` with its runtime (or the given loaded ``runtime``) and compare
    it with ``model`` and with a float64 copy of it.

    On CUDA, float32 is compared with TF32 off on both sides (:func:`exact_float32`): the
    comparison is of two float32 programs, not of their TF32 noise.
    """
    from libreyolo.utils.numerics import exact_float32

    with exact_float32(opts.device):
        report = _validate(model, exporter, path, opts, runtime)
    if opts.device.type == "cuda" and opts.precision == "fp32":
        report.notes.append("compared with TF32 off (cuDNN and cuBLAS) on both sides")
    return report


def _runs(model: Any, runtime: Any, reference: ExportModule, batches: list, net64: Any,
          half_net: Any) -> list[dict[str, Any]]:
    """Every validation input through eager float32, the float64 copy, eager fp16 (when asked) and
    the artifact."""
    family = model.family
    dtype = next(model.net.parameters()).dtype
    rows = family.export.query_rows()
    picked = rows.selection if rows.outputs and reference.nms is None else None
    runs = []
    for picks, x in _progress(batches, "validating"):
        x_ref = x.to(model.device, dtype)
        with torch.inference_mode():
            raw, s32 = selection.selection_runs(model.net, picked, x_ref)
            eager = family.named_outputs(raw)
            raw, s64 = selection.selection_runs(net64, picked, x.double().cpu())
            e64 = as_float64(family.named_outputs(raw))
            every64 = as_float64(family.tie_evidence(raw))
            ref = eager if reference.nms is None else dict(zip(
                reference.output_names(), reference.nms(eager[family.export.nms_output()], x_ref), strict=True))
            e16 = s16 = None
            if half_net is not None:
                floor_dtype = next((t.dtype for t in half_net.parameters() if t.is_floating_point()), torch.float32)
                raw, s16 = selection.selection_runs(half_net, picked, x.to(model.device, floor_dtype))
                e16 = {k: v.float() for k, v in family.named_outputs(raw).items()}
        got = runtime.network_outputs(x.to(runtime.device, runtime.input_dtype(False)))
        # compared on the CPU (the float64 reference is there); the artifact's outputs also stay
        # on its own device, whose decoding predict() must reproduce exactly
        runs.append({"picks": picks, "x": x, "eager": _cpu(eager), "e64": e64, "e16": _cpu(e16), "ref": _cpu(ref),
                     "got": _cpu(got), "got_device": got, "selection": (s32, s64, s16), "every64": every64})
    return runs


def _cpu(outputs: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor] | None:
    return None if outputs is None else {k: v.detach().cpu() for k, v in outputs.items()}


def _validate(model: Any, exporter: Exporter, path: Path, opts: ExportOptions, runtime: Any = None) -> ValidationReport:
    start = time.perf_counter()
    family = model.family
    contract = family.export
    if runtime is None:
        runtime = importlib.import_module(f"libreyolo.runtimes.{exporter.runtime}").load(path, device=opts.device)
    reference = ExportModule(model.net, family, opts.nms, nc=model.nc)  # on the network's float input
    min_cos = contract.cosine_floor(exporter.name, opts.precision, opts.device.type)
    # an INT8 artifact's boxes carry the flips of quantization codes, as the quantized eager model's own
    # float32 run does against float64: detections then match at the fp16 bar
    iou_min = 0.99 if opts.precision == "fp32" else 0.9
    nms = opts.nms
    report = ValidationReport("passed", runtime=runtime.describe())
    # how decoded predictions are compared, and at which options, is the task's declaration
    # (detections, classes, pixels, ...), unless the family's contract names its own matcher
    task = get_task(family.task)
    match_decoded = resolve(contract.decoded_match) if contract.decoded_match else task.matcher()
    vopts = task.export_validation_options(nms)

    sample, sample_metas = sample_batch(family, opts.imgsz)
    if not nms:
        vopts = task.validation_options(model, sample, sample_metas, vopts)
        note = task.validation_note(vopts)
        if note:
            report.notes.append(note)
    match_kw = {**task.match_options(vopts), "iou_min": iou_min}
    probes = {"sample": sample, **probe_images(opts.imgsz)}
    batches = _batches(probes, opts.batch)
    if opts.dynamic:
        batches += _batches(probes, opts.batch + 1, count=1)
        if opts.dynamic_spatial:
            h = max(2 * family.stride, opts.imgsz - 2 * family.stride)
            batches.append(([f"{h}x{opts.imgsz}"], probe_images(opts.imgsz, height=h, seed=1)["uniform"]))
    if opts.e2e is not None:
        # an end-to-end artifact takes 8-bit pixels: every probe is rounded to what pixels give, eager runs
        # it as the float input, the artifact as the pixels (the runtime's to_pixels of the same batch)
        from libreyolo.export.e2e import quantize_input

        batches = [(picks, quantize_input(x, opts.e2e)) for picks, x in batches]
        sample = quantize_input(sample, opts.e2e)

    try:
        net64 = float64_copy(model.net)
        with torch.inference_mode():
            net64(sample.double())
    except Exception as exc:  # an op without float64 support: no measured reference, no verdict
        return ValidationReport.not_run(f"the float64 reference of the eager model cannot run "
                                        f"({type(exc).__name__}: {exc}); the tolerances come from it")
    half_net = _half_copy(model.net) if opts.precision == "fp16" and not nms else None
    quant_floor = opts.int8 and exporter.int8_mode == "own" and opts.calibration is not None and not nms
    if quant_floor:
        # a format that quantizes with its own toolchain (its own observers and requantization) is
        # another quantization of the float model: it may differ from the quantized eager model by
        # FP16_DRIFT_FACTOR times that model's own distance from the float model (the quantization
        # floor), measured here in the slot of the fp16 drift: against the format's own quantization run
        # in eager (PT2E's converted graph) where the exporter left it, else against the float model
        half_net = opts.calibration.own_reference or opts.calibration.float_model.net
    try:
        runs = _runs(model, runtime, reference, batches, net64, half_net)
    except RuntimeError as exc:
        if half_net is None or "Half" not in str(exc):
            raise
        report.notes.append(f"the eager model cannot run in fp16 on {model.device} ({exc}); its fp16 drift "
                            "was measured on the CPU")
        half_net = half_net.cpu()
        runs = _runs(_OnCpu(model), runtime, reference, batches, net64, half_net)
    groups = groups_for(contract.groups, runs[0]["eager"])
    decisions: dict[str, int] = {}
    rows = contract.query_rows()
    d32, d16 = eager_drifts(groups, runs, rows.outputs, decisions, quant_floor)
    selection_edges(runs, rows.outputs, interior=not rows.whole_rows)
    if decisions:
        report.notes.append("eager float32 decides some elements otherwise than float64 (a tie broken the other way: "
                            + ", ".join(f"{n} in {k}" for k, n in decisions.items())
                            + f"); there an artifact may differ from float64 by {DECISION_FACTOR:g}x eager's own "
                            "difference, and they are left out of the drift")
    report.drift = {"float32": d32, **({"fp16": d16} if d16 is not None else {})}

    # INT8: the quantized eager model's own float32 detections against its float64 copy's (rounding
    # flips of the int8 codes move boxes and scores): the IoU bar and the left-overs an artifact
    # may have are FLOAT32_MULTIPLE times that measured disagreement
    quant_leftovers = 0
    if opts.precision == "int8":
        ref_iou, worst_left = 1.0, 0
        for run in runs:
            plain = LetterboxMeta((run["x"].shape[2], run["x"].shape[3]), 1.0, (0.0, 0.0))
            metas = [sample_metas[0] if p == "sample" else plain for p in run["picks"]]
            e32 = family.postprocess(run["eager"], metas, vopts)
            e64 = family.postprocess({k: v.float() for k, v in run["e64"].items()}, metas, vopts)
            pairs = list(zip(e64, e32, strict=True))
            if quant_floor and run["e16"] is not None:  # and the format's own quantization against quantize()'s
                pairs += list(zip(family.postprocess(run["e16"], metas, vopts), e32, strict=True))
            for a, b in pairs:
                m = match_decoded(a, b, score_tol=score_tolerance(groups, allowance(groups, run["e64"], d32, d16)),
                                  **{**match_kw, "iou_min": 0.5})
                ref_iou = min(ref_iou, float(m.get("min_iou", 1.0)))
                worst_left = max(worst_left, int(m.get("eager", 0)) - int(m.get("accounted", 0)),
                                 int(m.get("artifact", 0)) - int(m.get("accounted", 0)))
        iou_min = min(iou_min, max(0.5, 1.0 - FLOAT32_MULTIPLE * (1.0 - ref_iou)))
        match_kw["iou_min"] = iou_min
        quant_leftovers = int(math.ceil(FLOAT32_MULTIPLE * worst_left))
        report.notes.append("INT8: the quantized eager model's float32 detections match its float64 copy's"
                            + (" and the format's own quantization's (in eager)" if quant_floor else "") + " down to "
                            f"IoU {ref_iou:.4f} with up to {worst_left} unexplained left-over(s) per image; detections "
                            f"are matched at IoU {iou_min:.3f} and up to {quant_leftovers} left-over(s) per image are "
                            "allowed; raw outputs are compared as error distributions over all probes (quantiles "
                            f"{', '.join(f'{q:g}' for q in QUANTILES)} of the error from float64, each at most "
                            f"{FLOAT32_MULTIPLE:g}x the quantized eager model's own at the quantile with "
                            f"{1 + FLOAT32_MULTIPLE:g}x fewer elements above it), since its rounding flips land on "
                            "other elements than the artifact's")

    capped = 0
    art_sample = None
    score_tol = FLOOR
    bars = distribution_bars(groups, runs) if opts.precision != "fp16" else {}  # see the distribution checks
    judged: list[tuple[dict, dict]] = []  # (compared outputs, float64 outputs) of every probe
    for run in runs:
        picks, x, got = run["picks"], run["x"], run["got"]
        name = "+".join(dict.fromkeys(picks)) + (f" (batch {len(picks)})" if len(picks) > 1 else "")
        allowed = allowance(groups, run["e64"], d32, d16, eager=run["eager_aligned"])
        # decoded scores move by rounding only: the allowance without the decisions' wider bars
        score_tol = max(score_tol, score_tolerance(groups, allowance(groups, run["e64"], d32, d16)))
        compared = got
        if nms is None:
            compared, moved = align_row_sets(run["e64"], got, rows.outputs, allowed=allowed) if rows.whole_rows \
                else (got, 0)
            compared, excused = selection.excuse_rows(run["e64"], compared, rows.outputs, allowed,
                                                      run.get("edges", []), raw=got)
            if any(excused):
                report.notes.append(f"{name}: " + selection.describe(excused, run["edges"]))
            if moved:
                report.notes.append(f"{name}: {moved} query row(s) traded places with a near-tied one (set "
                                    f"prediction; at most {rows.max_moved} allowed)")
                if moved > rows.max_moved:
                    report.checks.append({"probe": name, "output": "+".join(rows.outputs), "group": "rows",
                                          "max_abs_error": math.inf, "ratio": math.inf, "allowed": 0.0,
                                          "cosine": 0.0, "passed": False, "shape": f"{moved} rows out of order"})
            for g in groups:
                if g.exclusive and g.output in got:
                    fixed, ties, flips = align_exclusive(g, run["eager_aligned"][g.output], compared[g.output],
                                                         allowed[g.output], run["every64"].get(g.output))
                    if flips:
                        compared = {**compared, g.output: fixed}
                        report.notes.append(f"{name}: {flips} column(s) of {g.key} hold their best value in another "
                                            f"channel than eager; {ties} of them at a tie (float64 puts the two "
                                            "channels closer than the artifact's own error elsewhere: realigned)")
                if g.output not in got:
                    report.checks.append({"probe": name, "output": g.output, "group": g.key, "ratio": math.inf,
                                          "max_abs_error": math.inf, "allowed": 0.0, "cosine": 0.0,
                                          "passed": False, "shape": "missing from the artifact's outputs"})
                    continue
                out, view = g.output, g.view
                gap = FLOAT32_MULTIPLE * (1.0 - cosine(view(run["eager_aligned"][out]), view(run["e64"][out])))
                if run["e16"] is not None:
                    gap += FP16_DRIFT_FACTOR * (1.0 - cosine(view(run["e16"][out]), view(run["eager"][out])))
                if opts.precision == "int8":
                    check = compare_quantized(g, run, compared, allowed, bars[g.key], min_cos, gap)
                else:
                    check = compare_group(g, run["eager_aligned"][out], run["e64"][out], compared[out], allowed[out],
                                          min_cos, gap)
                report.checks.append({"probe": name, "output": g.output, **check})
            judged.append((compared, run["e64"]))
        # decoded: eager postprocessing of eager outputs against the artifact's own decoder
        plain = LetterboxMeta((x.shape[2], x.shape[3]), 1.0, (0.0, 0.0))
        metas = [sample_metas[0] if p == "sample" else plain for p in picks]
        eager_named = run["eager"]
        # eager's side may carry what the matcher needs to tell a tie (validation=True: e.g. the
        # top-two logit margins of a class map); a family without such evidence ignores it
        eager = family.postprocess(eager_named, metas, vopts.replace(validation=True))
        art = runtime.family.postprocess(got, metas, vopts)
        own_decode = art
        if nms is None and compared is not got:  # ties realigned above: compare the decisions eager took
            art = runtime.family.postprocess(compared, metas, vopts)
        if nms:
            over = (eager_named[contract.nms_output()][:, 4:] > vopts.conf).flatten(1).sum(1)
            if bool((over > nms["topk"]).any()):
                within_topk = runtime.family.postprocess(run["ref"], metas, vopts)
                eager = [t if bool(o > nms["topk"]) else e for e, t, o in zip(eager, within_topk, over, strict=True)]
                capped += int((over > nms["topk"]).sum())
        for k, (e, a) in enumerate(zip(eager, art, strict=True)):
            m = match_decoded(e, a, score_tol=score_tol, allowed={n: t[k] for n, t in allowed.items()}, **match_kw)
            left = max(int(m.get("eager", 0)), int(m.get("artifact", 0))) - int(m.get("accounted", 0))
            if not m["passed"] and quant_leftovers and "accounted" in m and 0 < left <= quant_leftovers:
                m = {**m, "passed": True, "int8_leftovers": left}
            report.decoded.append({"probe": picks[k] + (f" (batch {len(picks)})" if len(picks) > 1 else ""), **m})
        if art_sample is None and picks[0] == "sample":
            # predict() must reproduce the artifact's own decoding, on its own device, exactly
            on_device = runtime.family.postprocess(run["got_device"], metas, vopts) \
                if runtime.device.type != "cpu" else own_decode
            art_sample = {k: v.cpu() for k, v in on_device[0].items()}

    # each group's error distribution over all probes: a systematic error below the worst element's
    # allowance everywhere (every output scaled by 1.0001) moves the median error far past eager's.
    # Not for fp16 programs yet: its fp16 floor is not measured on one (no GPU run has checked it)
    if judged and opts.precision != "fp16":
        report.checks += distribution_checks(groups, judged, bars)
    _check_preprocessing(model, runtime, opts, report)
    if opts.e2e is not None:  # the declaration the graph applies, against the family's own preprocessing
        from libreyolo.export.e2e import check_declaration

        report.checks.append(check_declaration(family, opts.imgsz, opts.e2e))
        report.notes.append("end-to-end artifact: fed uint8 RGB pixels (every probe rounded to 8 bit, eager fed the "
                            "same pixels through the family's normalisation)")
    # the sample image through the artifact's complete predict(); the eager side is the same
    # letterbox + network + postprocess that eager predict() runs, computed above
    from libreyolo.assets import SAMPLE_IMAGE

    if art_sample is not None:
        pre = runtime.family.letterbox(opts.imgsz)
        source = SAMPLE_IMAGE
        if hasattr(pre, "export_sample"):  # the crop the sample probe was (see sample_batch)
            from libreyolo.data.sources import load_sources

            source = pre.export_sample(load_sources(SAMPLE_IMAGE)[0].data).contiguous()
        r = runtime.predict(source, imgsz=opts.imgsz, **vopts)
        got = decoded_predictions(family.task, r)
        m = match_decoded(art_sample, got, score_tol=score_tol, **match_kw)
        report.decoded.append({"probe": "predict(sample) vs artifact decode", **m})
    report.notes.append(f"raw outputs may be {ELEMENT_MULTIPLE:g}x as far from a float64 copy of the eager model as "
                        "the eager float32 model is at their largest error (per output group, plus a floor of "
                        f"{FLOOR:.2g} of the element's scale)" + (
                            f", and {FLOAT32_MULTIPLE:g}x at the lower quantiles of their error distribution"
                            if judged and opts.precision == "fp32" else "")
                        + f"; scores compared within {score_tol:.3g}")
    if nms:
        report.notes.append("embedded NMS outputs are compared as detection sets (rows of tied scores may swap)")
    if capped:
        report.notes.append(
            f"on {capped} input(s) more than topk={nms['topk']} (box, class) pairs score above conf={vopts.conf}: "
            "the embedded NMS is exact for the top-k candidates only, so those inputs were compared with eager "
            "greedy NMS over the same top-k candidates (see docs/export.md, embedded NMS limits)")
    if quant_floor and d16 is not None:
        report.notes.append(f"{exporter.name} quantizes with its own toolchain: raw outputs may also differ by "
                            f"{FP16_DRIFT_FACTOR:g}x the distance between its own quantization run in eager and "
                            "the quantized eager model "
                            f"(the quantization floor; largest, relative to scale: {max(d16.values(), default=0):.3g})")
    if opts.precision == "fp16":
        report.notes.append("fp16 artifact compared with a float64 copy of the eager model")
        if d16 is not None:
            report.notes.append(f"raw outputs may also differ by {FP16_DRIFT_FACTOR:g}x the eager model's own fp16 "
                                f"drift from fp32 (largest, relative to scale: {max(d16.values(), default=0):.3g})")
    if not all(c["passed"] for c in report.checks) or not all(d["passed"] for d in report.decoded):
        report.status = "failed"
    report.seconds = time.perf_counter() - start
    return report


class _OnCpu:
    """The eager model's float32 network seen on the CPU (for an fp16 drift measured there)."""

    def __init__(self, model: Any) -> None:
        self.family, self.device = model.family, torch.device("cpu")
        self.net = model.net if model.device.type == "cpu" else __import__("copy").deepcopy(model.net).cpu()


def _check_preprocessing(model: Any, runtime: Any, opts: ExportOptions, report: ValidationReport) -> None:
    """The artifact's preprocessing (rebuilt from its metadata) must give the eager model's input
    tensor for the sample image bit for bit: a changed pad value, colour order or normalisation
    in the metadata would otherwise only show as slightly different detections."""
    from libreyolo.assets import SAMPLE_IMAGE
    from libreyolo.data.sources import load_sources

    image = [load_sources(SAMPLE_IMAGE)[0].data]
    ours, _ = model.family.letterbox(opts.imgsz)(image)
    theirs, _ = runtime.family.letterbox(opts.imgsz)(image)
    same = tuple(ours.shape) == tuple(theirs.shape) and torch.equal(ours.float().cpu(), theirs.float().cpu())
    diff = float((ours.float().cpu() - theirs.float().cpu()).abs().max()) if ours.shape == theirs.shape else math.inf
    report.checks.append({"probe": "sample", "output": "preprocessing", "group": "input", "kind": "input",
                          "max_abs_error": diff, "ratio": 0.0 if same else math.inf, "allowed": 0.0,
                          "cosine": 1.0 if same else 0.0, "passed": same,
                          **({} if same else {"shape": "the artifact's preprocessing (from its metadata) does not give "
                                                       "the eager model's input tensor"})})
