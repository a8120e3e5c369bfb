"""Serving: :class:`Batcher` (micro-batching for concurrent callers) and ``create_app`` (the
HTTP service of ``libreyolo serve``; needs ``pip install 'libreyolo[serve]'``).

The names load on first use (PEP 562): ``libreyolo.serve.options`` and ``libreyolo.serve.cli``
(read by the CLI before it does any work) import without torch or FastAPI.
"""
from __future__ import annotations

from typing import Any

__all__ = ["BatchAborted", "Batcher", "BatcherBusy", "BatcherClosed", "RequestTooLarge", "create_app",
           "default_batch_sizes"]

_WHERE = {"BatchAborted": "batcher", "Batcher": "batcher", "BatcherClosed": "batcher",
          "default_batch_sizes": "batcher", "BatcherBusy": "budget", "RequestTooLarge": "budget",
          "create_app": "app"}  # app imports FastAPI: only when asked for


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"libreyolo.serve.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'libreyolo.serve' has no attribute {name!r}")
