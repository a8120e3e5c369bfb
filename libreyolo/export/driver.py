"""The one export driver: check options, build, stamp metadata, validate, install atomically.

It knows no family and no format by name: the family's :class:`ExportContract` says what the
graph looks like, the format's :class:`Exporter` says how to write it.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from libreyolo.errors import ArgumentError
from libreyolo.export.base import (
    Exporter,
    ExportError,
    ExportOptions,
    ValidationFailed,
    default_output,  # noqa: F401 - exporters of other formats import it from here
    get_exporter,
)
from libreyolo.export.e2e import input_normalization
from libreyolo.export.formats import FORMAT_TABLE, SCOPED_OPTIONS, foreign_options, int8_formats
from libreyolo.export.metadata import (
    METADATA_VERSION,
    sha256_file,
    sha256_state,
    stamp,
    toolchain_versions,
)
from libreyolo.export.module import ExportModule
from libreyolo.export.nms import DEFAULTS as NMS_DEFAULTS
from libreyolo.export.options import EXPORT_OPTIONS, check_export_options
from libreyolo.export.report import ExportReport, ValidationReport
from libreyolo.utils.checks import check_batch, nonfinite_keys, resolve_device
from libreyolo.utils.log import LOGGER, want_info
from libreyolo.utils.tempfiles import TempGuard, recover_folder, replace_folder


def _options(model: Any, exporter: Exporter, checked: dict[str, Any]) -> ExportOptions:
    """The export options of ``model`` for ``exporter`` from the table-checked values (``checked``:
    :func:`libreyolo.export.options.check_export_options`); every refusal comes from a declared
    capability of the format's row or of the family's export contract, never from a format's name."""
    fmt = exporter.name
    passed = {k: checked[k] for k in SCOPED_OPTIONS if checked[k] != EXPORT_OPTIONS[k].default}
    foreign = foreign_options(exporter.spec, passed)
    if foreign:
        raise ArgumentError(foreign)
    imgsz = model.family.check_imgsz(model.imgsz if checked["imgsz"] is None else checked["imgsz"])
    batch = check_batch(checked["batch"], "", ArgumentError)
    dynamic, half, nms, device = checked["dynamic"], checked["half"], checked["nms"], checked["device"]
    contract = model.family.export
    if dynamic and not exporter.dynamic_shapes:
        raise ArgumentError(f"dynamic=True is not possible for format={fmt}: its artifacts have static shapes; "
                            "export with dynamic=False and the batch/imgsz you will run with")
    if dynamic and not contract.dynamic_batch:
        raise ArgumentError(f"family {model.family.name} declares static shapes; dynamic=True is not possible")
    if exporter.batch_axis_dynamic and not contract.dynamic_batch:
        raise ArgumentError(f"format={fmt} needs a dynamic batch axis (its server batches requests along it), but "
                            f"family {model.family.name} declares static shapes; export format=onnx instead")
    exporter.check_family(model.family)
    e2e = checked["e2e"]
    if e2e and not exporter.e2e_input:
        able = ", ".join(f.name for f in FORMAT_TABLE if f.e2e_input)
        raise ArgumentError(f"e2e=True (uint8 input, preprocessing inside) is not supported for format={fmt}; "
                            f"formats with end-to-end artifacts: {able}")
    if e2e and (nms is None or nms is False) and contract.nms_output() is not None:
        nms = True  # a dense detector's end-to-end artifact has NMS inside
    nms_params = None
    if nms is not None and nms is not False:
        if contract.nms_refusal() is not None:
            raise ArgumentError(f"nms={nms!r} does not apply to family {model.family.name}: it has no NMS "
                                f"({contract.nms_refusal()}); export with nms=False (the default): the artifact "
                                "outputs the predictions and the runtime decodes them as eager does")
        if not exporter.embedded_nms or contract.nms_output() is None:
            what = f"format={fmt}" if not exporter.embedded_nms else f"family {model.family.name}"
            raise ArgumentError(f"nms=True (NMS inside the artifact) is not supported for {what}; "
                                "export with nms=False (the runtime then runs NMS, as eager does)")
        nms_params = dict(NMS_DEFAULTS)
        if isinstance(nms, dict):
            unknown = sorted(set(nms) - set(NMS_DEFAULTS))
            if unknown:
                raise ArgumentError(f"unknown nms option(s) {unknown}; known: {sorted(NMS_DEFAULTS)}")
            nms_params.update(nms)
        elif nms is not True:
            raise ArgumentError(f"nms must be True, False or a dict of {sorted(NMS_DEFAULTS)}, got {nms!r}")
    dev = resolve_device(device) if device is not None else model.device
    data, max_drop = checked["data"], checked["max_drop"]
    int8 = checked["int8"] or model.is_quantized  # a quantized model's artifact is its INT8 one
    if not int8 and (data is not None or max_drop is not None):
        raise ArgumentError("data= and max_drop= apply to INT8 exports only; pass int8=True (or drop them)")
    if int8:
        why = "the model is quantized (model.quantize()), so its artifact is INT8; " if model.is_quantized else ""
        if exporter.int8_mode == "no":
            raise ArgumentError(f"{why}int8=True is not supported for format={fmt}; INT8 artifacts: "
                                f"{', '.join(int8_formats())}" + ("; or export the float model: "
                                                                  "model.dequantize().export(...)" if why else ""))
        if half:
            raise ArgumentError(f"{why}int8=True and half=True exclude each other; pass one of them")
        if data is None or data == "":
            raise ArgumentError(f"{why}int8=True needs data=: a dataset (YAML, or a classification folder) whose "
                                "train split calibrates the activations and whose val split gates the accuracy"
                                + ("; or export the float model: model.dequantize().export(...)" if why else ""))
    if e2e and (half or int8):
        raise ArgumentError(f"e2e=True and {'half' if half else 'int8'}=True cannot be combined yet (the "
                            "end-to-end artifact is float32 inside); export one of them")
    if half and exporter.half == "no":
        raise ArgumentError(f"half=True is not supported for format={fmt}; export in float32")
    if half and exporter.half == "cuda" and dev.type != "cuda":
        raise ArgumentError(f"half=True for format={fmt} needs a CUDA device to trace in float16 "
                            f"(device is {dev}); pass device=cuda:0 or export in float32")
    # the format's own options: fields of ExportOptions, the others (Triton's config) in format_options
    fields = {f.name for f in dataclasses.fields(ExportOptions)}
    own = {k: v for k, v in checked.items() if k in exporter.format_options}
    opts = ExportOptions(fmt, imgsz, batch, dynamic, half, nms=nms_params, device=dev,
                         validate=checked["validate"], require_validation=checked["require_validation"],
                         dynamic_spatial=dynamic and contract.dynamic_spatial and exporter.dynamic_spatial,
                         device_explicit=device is not None, int8=int8,
                         data=None if data is None else str(data),
                         max_drop=0.02 if max_drop is None else float(max_drop),
                         format_options={k: v for k, v in own.items() if k not in fields and v is not None},
                         e2e=input_normalization(model.family, imgsz) if e2e else None,
                         **{k: v for k, v in own.items() if k in fields})
    exporter.check(opts)
    return opts


def _metadata(model: Any, exporter: Exporter, opts: ExportOptions, module: ExportModule) -> dict[str, Any]:
    from libreyolo.export import e2e

    family, contract = model.family, model.family.export
    box = family.letterbox(opts.imgsz)
    source = getattr(model, "source", None)
    weights = sha256_file(source) if source and Path(source).is_file() else "state_dict:" + sha256_state(model.net)
    axes = {}
    if opts.dynamic:
        from libreyolo.export.onnx import dynamic_axes

        axes = {k: {str(a): n for a, n in v.items()} for k, v in (dynamic_axes(module, opts) or {}).items()}
    return {
        "libreyolo_metadata": METADATA_VERSION, "format": exporter.name, "family": family.name,
        "size": model.size, "task": family.task, "nc": model.nc, "names": {str(k): v for k, v in model.names.items()},
        "imgsz": opts.imgsz, "batch": opts.batch, "stride": family.stride,
        "input_name": contract.input_name, "output_names": list(module.output_names()),
        "input_dtype": e2e.PIXEL_DTYPE if opts.e2e else ("float16" if opts.half and exporter.half == "cuda"
                                                         else "float32"),
        # network input = (8-bit pixel * scale - mean) / std, per channel in ``color`` order
        "normalization": input_normalization(family, opts.imgsz),
        **({"e2e": e2e.describe(opts.e2e, opts.nms is not None)} if opts.e2e else {}),
        "letterbox": box.describe(),  # the preprocessing (letterbox, resize + crop, ...), checked by runtimes
        "precision": opts.precision, "dynamic_axes": axes, "nms": opts.nms,
        "export_args": opts.as_metadata(), "versions": toolchain_versions(*exporter.toolchain),
        "source_weights_sha256": weights,
        **({"runtime_config": config} if (config := exporter.runtime_config(opts)) else {}),
        "validation": {"status": "pending"},
    }


def _install(exporter: Exporter, built: Path, final: Path) -> None:
    """Move the built artifact (and its companions first) onto ``final``; all or nothing.

    A folder goes through :func:`libreyolo.utils.tempfiles.replace_folder`: an older folder at
    ``final`` is removed only once the new one is in place, at every signal point; between the two
    renames it waits in the exporter's work parent (never a second name next to ``final`` where a
    server polling the folder could see it, unless the work parent is that folder)."""
    moved: list[Path] = []
    created = not final.parent.exists()  # a Triton repository made by this export
    try:
        final.parent.mkdir(exist_ok=True)
        for comp in exporter.companions(built):
            target = final.with_name(final.name + comp.name[len(built.name):])
            os.replace(comp, target)
            moved.append(target)
        if built.is_dir():
            replace_folder(built, final, aside_dir=exporter.work_parent(final))
        else:
            os.replace(built, final)
    except BaseException:
        for target in moved:
            target.unlink(missing_ok=True)
        if created and not final.exists():
            shutil.rmtree(final.parent, ignore_errors=True)
        raise


def int8_checks(exporter: Exporter, built: Path, opts: ExportOptions, report: ValidationReport) -> dict | None:
    """An INT8 artifact's distance from the float model and its accuracy gate (None: it cannot run here)."""
    import importlib

    from libreyolo.export import int8 as int8_export

    if report.status in ("failed", "skipped") or exporter.not_validated_reason(opts):
        if report.status != "failed":
            report.notes.append("INT8 accuracy gate: not run (the artifact cannot run here, or validate=False); "
                                "not validated here")
        return None
    plan = opts.calibration
    if exporter.int8_mode == "qdq":
        check = int8_export.check_parameters(plan, exporter, built)
        report.checks.append(check)
        if not check["passed"]:
            report.status = "failed"
            return None
    runtime = importlib.import_module(f"libreyolo.runtimes.{exporter.runtime}").load(built, device=opts.device)
    distance = int8_export.float_distance(plan, runtime, opts.imgsz)
    report.notes.append("compared with the quantized eager model (" + plan.describe()["calibrated"] + ", "
                        f"{plan.describe()['method']} on {plan.describe()['samples']} image(s) of {plan.origin}); "
                        "distance from the float model on the sample image: " + ", ".join(
                            f"{k} max |diff| {v['max_abs']:.3g} of {v['float_max_abs']:.3g}, cosine {v['cosine']:.5f}"
                            for k, v in distance.items()))
    result = int8_export.gate(plan, runtime, opts.data, opts.imgsz, opts.max_drop)
    result["distance_from_float"] = distance
    report.extra_lines.append(int8_export.gate_line(result))
    return result


def export(model: Any, format: str = "onnx", **options: Any) -> ExportReport:  # noqa: A002
    """Export an eager model to an artifact, validate it against eager, and install it atomically.

    ``format``: a format of the format table (:mod:`libreyolo.export.formats`, ``docs/formats.md``) or
    an alias. ``options``: those of :data:`libreyolo.export.options.EXPORT_OPTIONS`, each checked by its
    declaration (an unknown name is an :class:`~libreyolo.errors.ArgumentError`); a format-scoped one
    (``opset``, ``workspace``, ``autotune``, Triton's config) is refused by formats whose row lacks it.
    ``imgsz`` defaults to the model's. ``nms=True`` (or a dict of ``topk``, ``iterations``, ``iou``, ``conf``,
    ``max_det``) embeds NMS. ``e2e=True`` writes an end-to-end artifact: uint8 RGB NCHW pixels in, the
    family's colour order and normalisation (and NMS, for dense detectors) inside (:mod:`libreyolo.export.e2e`).
    ``int8=True`` with ``data=`` writes an INT8 artifact (quantize()'s scales, calibrated
    on data's train split), validated against the quantized eager model and refused when its
    accuracy on data's val split drops by more than ``max_drop`` (default 0.02;
    :mod:`libreyolo.export.int8`). ``validate=False`` skips the comparison with eager (with a loud warning);
    ``require_validation=True`` fails when the artifact cannot be run here. ``format="triton"`` writes
    a Triton Inference Server model folder ``<output>/<name>/`` (``config.pbtxt`` + ``1/model.onnx``);
    ``max_batch``, ``preferred_batch``, ``queue_delay_us`` and ``instances`` fill its config
    (:mod:`libreyolo.export.triton`). Raises
    :class:`~libreyolo.errors.ArgumentError` for bad options and :class:`ExportError` when the
    toolchain fails or the artifact does not match eager; nothing is left at the output path then.
    """
    checked = check_export_options({"format": format, **options})  # the table every entry point uses
    exporter = get_exporter(checked["format"])
    opts = _options(model, exporter, checked)
    verbose = checked["verbose"]
    final = exporter.resolve_output(model, checked["output"], checked["name"])
    if exporter.is_directory:  # a swap a hard kill interrupted is finished first (the old folder back)
        recover_folder(final, exporter.work_parent(final))
    if opts.int8:
        from libreyolo.export import int8 as int8_export

        int8_export.check_data(model, opts.data)  # a missing val split is found before anything is built
    if opts.require_validation:  # known before building: fail fast
        reason = "validate=False was passed" if not opts.validate else exporter.not_validated_reason(opts)
        if reason:
            raise ExportError(f"require_validation=True but the artifact cannot be validated here: {reason}; "
                              f"nothing was written to {final}")
    bad, count = nonfinite_keys(model.family.finite_check_view(model.net.state_dict()))
    if bad:
        raise ExportError(f"the model's weights hold NaN or Inf in {count} tensor(s) ({', '.join(bad)}"
                          f"{', ...' if count > len(bad) else ''}): an artifact of them would detect nothing. "
                          f"Export a model with finite weights; nothing was written to {final}")
    start = time.perf_counter()
    reference_model = model
    if opts.int8:
        opts.calibration = int8_export.plan(model, opts.data, opts.imgsz)
        reference_model = opts.calibration.quantized  # the artifact is compared with the quantized eager model
    if opts.int8 and exporter.int8_mode == "qdq":
        from libreyolo.quant.qdq import export_view

        net = export_view(opts.calibration.quantized.net).to(opts.device).eval()
    else:
        net = copy.deepcopy(opts.calibration.float_model.net if opts.int8 else model.net).to(opts.device).eval()
    net = net.half() if opts.half and exporter.half == "cuda" else net.float()
    module = ExportModule(net, model.family, opts.nms, nc=model.nc, e2e=opts.e2e).to(opts.device).eval()
    dtype = torch.float16 if opts.half and exporter.half == "cuda" else torch.float32
    example = torch.full((opts.batch, 3, opts.imgsz, opts.imgsz), 0.5, dtype=dtype, device=opts.device)
    if opts.e2e:  # 8-bit pixels (mid grey)
        example = torch.full((opts.batch, 3, opts.imgsz, opts.imgsz), 128, dtype=torch.uint8, device=opts.device)
    with TempGuard() as guard:  # SIGTERM during the export removes the work folder too
        work = guard.add(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=exporter.work_parent(final)))
        try:
            built = work / final.name
            with torch.no_grad():
                exporter.build(module, example, built, opts, work)
            meta = _metadata(model, exporter, opts, module)
            if opts.int8:
                meta["quantization"] = {**opts.calibration.describe(), **exporter.int8_metadata(built, opts)}
            content = exporter.content_sha256(built)
            exporter.write_metadata(built, stamp(meta, content), meta)
            if opts.validate:
                from libreyolo.export.validate import validate_artifact

                reason = exporter.not_validated_reason(opts)
                report = (ValidationReport.not_run(reason) if reason
                          else validate_artifact(reference_model, exporter, built, opts))
            else:
                report = ValidationReport.skipped()
                LOGGER.warning("validate=False: this artifact was NOT compared with the eager model. Its outputs may "
                               "be wrong and nothing here would notice.")
            if report.status != "skipped":
                report.notes.extend(exporter.report_notes(final, opts))
            if report.status in ("passed", "failed"):
                exporter.after_validation(built, opts, report)
            gate = None
            if opts.int8:
                gate = int8_checks(exporter, built, opts, report)
            meta["validation"] = report.to_dict()
            if gate is not None:
                meta["validation"]["accuracy"] = gate
            encoded = stamp(meta, content)
            exporter.write_metadata(built, encoded, meta)
            if exporter.content_sha256(built) != content:
                raise ExportError(f"writing the metadata changed the {exporter.name} model bytes, so the artifact's "
                                  "integrity hash would not hold; this is a bug, please report it")
            meta.update(content_sha256=content, metadata_sha256=encoded["metadata_sha256"])
            if report.status == "failed":
                raise ValidationFailed(f"{exporter.name} artifact does not match the eager model; nothing was written "
                                  f"to {final}.\n{report.text()}")
            if gate is not None and not gate["passed"]:
                raise int8_export.AccuracyGateFailed(
                    f"INT8 accuracy gate: {gate['metric']} fell from {gate['float']:.4f} (float eager model) to "
                    f"{gate['int8']:.4f} ({exporter.name} INT8 artifact) on the val split of {gate['data']}, a drop of "
                    f"{gate['drop']:.4f} > max_drop={gate['max_drop']:g}; nothing was written to {final}. Calibrate on "
                    "more representative images (model.quantize(data=..., samples=..., method='percentile')), keep "
                    "sensitive layers in float (exclude=...), or allow a larger max_drop")
            if opts.require_validation and report.status != "passed":
                raise ExportError(f"require_validation=True but the artifact was {report.headline()}; nothing was "
                                  f"written to {final}")
            _install(exporter, built, final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    out = ExportReport(path=final, format=exporter.name, validation=report, metadata=meta,
                       seconds=time.perf_counter() - start)
    if verbose:
        want_info()
        LOGGER.info("%s", out.text())
    return out
