"""Export to ONNX, ExecuTorch, CoreML, TensorRT, AOTInductor and Triton, each artifact validated against eager.

``export(model, "onnx", imgsz=320)`` or ``model.export(format="onnx")``; see
:func:`libreyolo.export.driver.export` for the options and ``docs/export.md`` for each format.
"""
from __future__ import annotations

from libreyolo.export.base import FORMATS, ExportError, ExportOptions, get_exporter
from libreyolo.export.driver import export
from libreyolo.export.report import ExportReport, ValidationReport

__all__ = ["FORMATS", "ExportError", "ExportOptions", "ExportReport", "ValidationReport", "export", "get_exporter"]
