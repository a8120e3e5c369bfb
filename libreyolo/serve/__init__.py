"""Serving: :class:`Batcher` (micro-batching for concurrent callers) and ``create_app`` (the
HTTP service of ``libreyolo serve``; needs ``pip install 'libreyolo[serve]'``).

The names load on first use (PEP 562): ``libreyolo.serve.options`` and ``libreyolo.serve.cli``
(read by the CLI before it does any work) import without torch or FastAPI.
"""
from __future__ import annotations

from typing import Any

__all__ = ["Batcher", "BatcherClosed", "create_app", "default_batch_sizes"]


def __getattr__(name: str) -> Any:
    if name == "create_app":  # imports FastAPI: only when asked for
        from libreyolo.serve.app import create_app

        return create_app
    if name in ("Batcher", "BatcherClosed", "default_batch_sizes"):
        from libreyolo.serve import batcher

        return getattr(batcher, name)
    raise AttributeError(f"module 'libreyolo.serve' has no attribute {name!r}")
