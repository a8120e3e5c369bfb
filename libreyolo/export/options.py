"""The options of ``export()`` / ``libreyolo export``, declared once (see :mod:`libreyolo.options`).

Which formats take which options, and what each format can do, is declared in the format table
(:mod:`libreyolo.export.formats`); format-specific refinements stay with each exporter
(``Exporter.check``), but every value is first checked here, before any model is loaded.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from libreyolo.errors import ArgumentError
from libreyolo.export.formats import FORMATS, SCOPED_OPTIONS, format_name
from libreyolo.options import Opt, as_bool, as_device, as_ids, batch_opt, imgsz_opt
from libreyolo.utils.checks import MAX_BATCH

ONNX_OPSETS = (13, 20)  # the TorchScript exporter's range in torch 2.11-2.14 (libreyolo.export.onnx)
MAX_WORKSPACE_GIB = 1024.0


def as_nms(name: str, value: Any) -> bool | dict[str, Any]:
    """``nms``: a flag, or a dict of the embedded NMS's settings (checked by the driver)."""
    if isinstance(value, dict):
        return value
    try:
        return as_bool(name, value)
    except ArgumentError:
        raise ArgumentError(f"{name} must be true, false or a dict of NMS settings, got {value!r:.60}") from None


as_nms.allowed = "true, false or a dict of NMS settings"  # type: ignore[attr-defined]


def as_format(name: str, value: Any) -> str:
    """A format name, alias or suffix -> its canonical name (the format table)."""
    return format_name(value)


as_format.allowed = ", ".join(FORMATS)  # type: ignore[attr-defined]


def as_batch_sizes(name: str, value: Any) -> list[int]:
    """Batch sizes such as ``4,8`` (each >= 1; checked against ``max_batch`` by the exporter)."""
    bad = ArgumentError(f"{name} must be batch sizes from 1 to {MAX_BATCH} such as 4,8, got {value!r:.60}")
    try:
        sizes = sorted(set(as_ids(name, value)))
    except ArgumentError:
        raise bad from None
    if not sizes or sizes[0] < 1 or sizes[-1] > MAX_BATCH:
        raise bad
    return sizes


as_batch_sizes.allowed = "batch sizes such as 4,8"  # type: ignore[attr-defined]

MAX_QUEUE_DELAY_US = 10_000_000
MAX_INSTANCES = 64

EXPORT_OPTIONS: dict[str, Opt] = {
    "format": Opt(as_format, "onnx", f"artifact format: {', '.join(FORMATS)} (listed above)"),
    "imgsz": imgsz_opt("input size (a multiple of the model stride; default from the model)"),
    "batch": batch_opt(1, "batch size of the exported input (tensorrt + dynamic: the largest)"),
    "dynamic": Opt(as_bool, False, "dynamic batch (and spatial where supported)", True),
    "half": Opt(as_bool, False, "fp16 weights and input (CUDA export)", True),
    "opset": Opt(int, None, "ONNX opset (default 17)", min=ONNX_OPSETS[0], max=ONNX_OPSETS[1]),
    "simplify": Opt(as_bool, False, "simplify the ONNX graph (needs libreyolo[onnx-simplify])", True),
    "nms": Opt(as_nms, False, "embed NMS in the exported graph", True),
    "e2e": Opt(as_bool, False, "end-to-end artifact: uint8 RGB NCHW pixels in; the family's colour order and "
               "normalisation (and NMS, for dense detectors) inside the graph (libreyolo.export.e2e)", True),
    "device": Opt(as_device, None, "device used for export: cpu, cuda, cuda:N"),
    "output": Opt(str, None, "artifact path (or an existing folder); triton: the model repository folder"),
    "name": Opt(str, None, "file name in the default folder (instead of output); triton: the model name"),
    "workspace": Opt(float, None, "TensorRT workspace", min=0.0, max=MAX_WORKSPACE_GIB, min_open=True, unit="GiB"),
    "autotune": Opt(as_bool, False, "on CUDA: Inductor max-autotune (much longer compile)", True),
    "int8": Opt(as_bool, False, "INT8 artifact: quantize()'s scales (calibrated on data's train split), gated on "
                "the val split's accuracy", True),
    "data": Opt(str, None, "int8: dataset (YAML, or a classification root) for calibration and the accuracy gate"),
    "max_drop": Opt(float, None, "int8: largest allowed drop (default 0.02) of mAP50-95 (top-1 for "
                    "classifiers), absolute",
                    min=0.0, max=1.0),
    "max_batch": Opt(int, None, "max_batch_size of the model config (default 8; the ONNX batch axis is "
                     "dynamic)", min=1, max=MAX_BATCH),
    "preferred_batch": Opt(as_batch_sizes, None, "dynamic_batching preferred_batch_size, e.g. 4,8 (default: "
                           "none, Triton batches up to max_batch)"),
    "queue_delay_us": Opt(int, None, "dynamic_batching max_queue_delay_microseconds (default 100)", min=0,
                          max=MAX_QUEUE_DELAY_US, unit="microseconds"),
    "instances": Opt(int, None, "model instances per device (instance_group count, default 1)", min=1,
                     max=MAX_INSTANCES),
    "validate": Opt(as_bool, True, "validate the artifact against the eager model", True),
    "require_validation": Opt(as_bool, False, "fail when the artifact cannot be validated here", True),
    "verbose": Opt(as_bool, True, "print the report", True),
}


def _scoped_help() -> None:
    """A format-scoped option's help names the formats that take it (from the format table)."""
    for key, takers in SCOPED_OPTIONS.items():
        opt = EXPORT_OPTIONS[key]
        EXPORT_OPTIONS[key] = dataclasses.replace(opt, help=f"{opt.help} [format={', '.join(takers)}]")


_scoped_help()


def check_export_options(given: dict[str, Any]) -> dict[str, Any]:
    """Every export option checked by its declaration (unknown names refused); the defaults filled in."""
    unknown = sorted(k for k in given if k not in EXPORT_OPTIONS)
    if unknown:
        raise ArgumentError(f"unknown export option(s): {', '.join(unknown)}; known: {', '.join(EXPORT_OPTIONS)}")
    return {k: opt.check(k, given.get(k, opt.default)) for k, opt in EXPORT_OPTIONS.items()}


def check_output_folder(output: Any) -> None:
    """A given ``output`` whose folder cannot be written is refused before the model is loaded."""
    import os
    from pathlib import Path

    if output is None:
        return
    path = Path(output)
    folder = path if path.is_dir() else (path.parent if str(path.parent) else Path("."))
    if not folder.is_dir():
        raise ArgumentError(f"output {str(path)!r}: the folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK):
        raise ArgumentError(f"output {str(path)!r}: the folder {folder} is not writable")
