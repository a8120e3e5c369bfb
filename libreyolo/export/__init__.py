"""Export to every format of the format table (:mod:`libreyolo.export.formats`), each artifact validated against eager.

``export(model, "onnx", imgsz=320)`` or ``model.export(format="onnx")``; see
:func:`libreyolo.export.driver.export` for the options and ``docs/export.md`` for each format.

The names load on first use (PEP 562), so ``libreyolo.export.options`` (read by the CLI before it
does any work) imports without torch.
"""
from __future__ import annotations

from typing import Any

__all__ = ["FORMATS", "ExportError", "ExportOptions", "ExportReport", "ValidationReport", "export", "get_exporter"]

_WHERE = {"FORMATS": "base", "ExportError": "base", "ExportOptions": "base", "get_exporter": "base",
          "export": "driver", "ExportReport": "report", "ValidationReport": "report"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"libreyolo.export.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'libreyolo.export' has no attribute {name!r}")
