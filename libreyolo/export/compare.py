"""``libreyolo.compare(model, artifact)``: re-validate any artifact against any checkpoint.

The same probes, float64 reference and tolerances as the validation an export runs before it
writes its file, so a user can prove that the file on a device came from this checkpoint (or
show that it did not). ``libreyolo compare model=<checkpoint> artifact=<file>`` exits 0 when
they match, 1 when they do not, 2 for user mistakes (a missing file, an artifact that cannot
run here).

An INT8 artifact is compared as its export compared it: with the quantized eager model, not the
float one (a correct INT8 artifact is thousands of float32 allowances away from the float model).
Its scales come from calibrating on the export's images, so ``data=`` (that dataset) is needed:
the checkpoint is calibrated again (deterministic: the same images give the same scales, checked
against the artifact's recorded calibration), the raw outputs are judged by the INT8 rules, and the
accuracy gate runs on the dataset's val split.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from libreyolo.errors import ArgumentError
from libreyolo.export.report import ValidationReport

# what an artifact's metadata must agree on with the checkpoint before any number is compared
_IDENTITY = ("family", "size", "task", "nc")


def compare(model: Any, artifact: str | Path | Any, *, device: Any = None, data: Any = None) -> ValidationReport:
    """Validate ``artifact`` (a path, or an artifact loaded by ``LibreYOLO``) against ``model`` (a
    checkpoint path or a loaded eager model). Returns the :class:`ValidationReport`: ``status`` is
    "passed", "failed" or "not validated" (with the reason). ``data``: for an INT8 artifact (and
    only there), the dataset its export calibrated on."""
    from libreyolo.api import LibreYOLO
    from libreyolo.export.base import ExportOptions, get_exporter
    from libreyolo.export.validate import validate_artifact
    from libreyolo.utils.checks import resolve_device

    if isinstance(model, (str, Path)):
        model = LibreYOLO(model, device=device)
    if not hasattr(model, "export"):
        raise ArgumentError(f"compare needs an eager model (a checkpoint .pt) as model=, got an artifact "
                            f"({type(model).__name__}); pass the artifact as artifact=")
    runtime = LibreYOLO(artifact, device=device or model.device) if isinstance(artifact, (str, Path)) else artifact
    meta = getattr(runtime, "metadata", None)
    if not isinstance(meta, dict):
        raise ArgumentError("artifact= must be an exported file (.onnx, .pte, .pt2, .mlpackage, .engine, .tflite) or "
                            "folder (_ncnn_model/, _openvino_model/), "
                            f"got {type(runtime).__name__}")
    mine = {"family": model.family.name, "size": model.size, "task": model.family.task, "nc": model.nc}
    differ = [f"{k} {meta.get(k)!r} (checkpoint: {mine[k]!r})" for k in _IDENTITY if meta.get(k) != mine[k]]
    names = {str(k): v for k, v in model.names.items()}
    if not differ and {str(k): v for k, v in dict(meta.get("names") or {}).items()} != names:
        differ.append("class names differ from the checkpoint's")
    if differ:
        report = ValidationReport("failed", runtime=runtime.describe())
        report.checks.append({"probe": "metadata", "output": "identity", "group": "metadata", "kind": "input",
                              "max_abs_error": 0.0, "ratio": 0.0, "allowed": 0.0, "cosine": 0.0, "passed": False,
                              "shape": "the artifact is of another model: " + "; ".join(differ)})
        report.notes.append("nothing numeric was compared: the artifact's metadata names another model")
        return report
    exporter = get_exporter(meta["format"])
    args = meta.get("export_args", {})
    dynamic = bool(args.get("dynamic", False))
    int8 = meta.get("precision") == "int8"
    if data is not None and not int8:
        raise ArgumentError(f"data= applies to INT8 artifacts only (it rebuilds their quantized reference); "
                            f"{runtime.path} is {meta.get('precision')}: drop data=")
    opts = ExportOptions(meta["format"], int(meta["imgsz"]), int(meta["batch"]), dynamic,
                         bool(args.get("half", False)), nms=meta.get("nms") or None,
                         device=resolve_device(runtime.device),
                         dynamic_spatial=dynamic and model.family.export.dynamic_spatial and exporter.dynamic_spatial,
                         int8=int8, data=None if data is None else str(data),
                         max_drop=float(args.get("max_drop", ExportOptions.max_drop)))
    reason = exporter.not_validated_reason(opts)
    if reason:
        return ValidationReport.not_run(reason)
    if int8 and data is None:  # (an artifact that cannot run here needs no calibration data)
        origin = (meta.get("quantization") or {}).get("calibration", "not recorded")
        raise ArgumentError(f"{runtime.path} is an INT8 artifact: it is compared with the quantized eager model, "
                            f"whose scales come from calibrating on the export's images; pass data= with that "
                            f"dataset (the export calibrated on: {origin})")
    if model.device != opts.device:
        model = model.to(opts.device)
    if int8:
        return _compare_int8(model, exporter, runtime, opts, meta)
    report = validate_artifact(model, exporter, Path(runtime.path), opts, runtime=runtime)
    _note_source(report, model, meta)
    return report


# what a calibration here must reproduce of the export's (libreyolo.export.int8.Int8Plan.describe)
_CALIBRATION = ("recipe", "method", "samples", "layers", "excluded")


def _compare_int8(model: Any, exporter: Any, runtime: Any, opts: Any, meta: dict[str, Any]) -> ValidationReport:
    """An INT8 artifact against the checkpoint calibrated again on ``opts.data``: the export's checks."""
    from libreyolo.export import int8 as int8_export
    from libreyolo.export.driver import int8_checks
    from libreyolo.export.validate import validate_artifact

    int8_export.check_data(model, opts.data)
    opts.calibration = int8_export.plan(model, opts.data, opts.imgsz)
    recorded = meta.get("quantization") or {}
    here = opts.calibration.describe()
    differ = [f"{k} {recorded.get(k)!r} (here: {here[k]!r})" for k in _CALIBRATION
              if k in recorded and recorded[k] != here[k]]
    if differ:
        report = ValidationReport("failed", runtime=runtime.describe())
        report.checks.append({"probe": "calibration", "output": "quantization", "group": "calibration",
                              "kind": "input", "max_abs_error": 0.0, "ratio": 0.0, "allowed": 0.0, "cosine": 0.0,
                              "passed": False, "shape": "calibrating here does not reproduce the export's: "
                              + "; ".join(differ)})
        report.notes.append(f"nothing numeric was compared: pass data= with the images the export calibrated on "
                            f"({recorded.get('calibration', 'not recorded')})")
        return report
    path = Path(runtime.path)
    report = validate_artifact(opts.calibration.quantized, exporter, path, opts, runtime=runtime)
    gate = int8_checks(exporter, path, opts, report)
    if gate is not None and not gate["passed"]:
        report.status = "failed"
        report.notes.append(f"INT8 accuracy gate failed: {gate['metric']} {gate['float']:.4f} (float) -> "
                            f"{gate['int8']:.4f} (artifact), a drop of {gate['drop']:.4f} > "
                            f"max_drop={gate['max_drop']:g}")
    _note_source(report, model, meta)
    return report


def _note_source(report: ValidationReport, model: Any, meta: dict[str, Any]) -> None:
    """Whether the artifact records the checkpoint file's sha256 as its source."""
    weights = meta.get("source_weights_sha256", "")
    source = getattr(model, "source", None)
    if source and Path(source).is_file() and not str(weights).startswith("state_dict:"):
        from libreyolo.export.metadata import sha256_file

        same = sha256_file(source) == weights
        report.notes.append("the artifact records this checkpoint's sha256 as its source" if same else
                            "the artifact records another source file's sha256 (it was exported from other bytes; "
                            "the comparison above says whether the numbers agree)")
