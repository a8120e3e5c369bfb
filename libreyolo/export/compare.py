"""``libreyolo.compare(model, artifact)``: re-validate any artifact against any checkpoint.

The same probes, float64 reference and tolerances as the validation an export runs before it
writes its file, so a user can prove that the file on a device came from this checkpoint (or
show that it did not). ``libreyolo compare model=<checkpoint> artifact=<file>`` exits 0 when
they match, 1 when they do not, 2 for user mistakes (a missing file, an artifact that cannot
run here).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from libreyolo.errors import ArgumentError
from libreyolo.export.report import ValidationReport

# what an artifact's metadata must agree on with the checkpoint before any number is compared
_IDENTITY = ("family", "size", "task", "nc")


def compare(model: Any, artifact: str | Path | Any, *, device: Any = None) -> ValidationReport:
    """Validate ``artifact`` (a path, or an artifact loaded by ``LibreYOLO``) against ``model`` (a
    checkpoint path or a loaded eager model). Returns the :class:`ValidationReport`: ``status`` is
    "passed", "failed" or "not validated" (with the reason)."""
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
        raise ArgumentError(f"artifact= must be an exported file (.onnx, .pte, .pt2, .mlpackage, .engine), "
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
    opts = ExportOptions(meta["format"], int(meta["imgsz"]), int(meta["batch"]), dynamic,
                         bool(args.get("half", False)), nms=meta.get("nms") or None,
                         device=resolve_device(runtime.device),
                         dynamic_spatial=dynamic and model.family.export.dynamic_spatial and exporter.dynamic_spatial)
    reason = exporter.not_validated_reason(opts)
    if reason:
        return ValidationReport.not_run(reason)
    if model.device != opts.device:
        model = model.to(opts.device)
    report = validate_artifact(model, exporter, Path(runtime.path), opts, runtime=runtime)
    weights = meta.get("source_weights_sha256", "")
    source = getattr(model, "source", None)
    if source and Path(source).is_file() and not str(weights).startswith("state_dict:"):
        from libreyolo.export.metadata import sha256_file

        same = sha256_file(source) == weights
        report.notes.append("the artifact records this checkpoint's sha256 as its source" if same else
                            "the artifact records another source file's sha256 (it was exported from other bytes; "
                            "the comparison above says whether the numbers agree)")
    return report
