"""Serving: :class:`Batcher` (micro-batching for concurrent callers) and ``create_app`` (the
HTTP service of ``libreyolo serve``; needs ``pip install 'libreyolo[serve]'``)."""
from __future__ import annotations

from typing import Any

from libreyolo.serve.batcher import BatchAborted, Batcher, BatcherClosed, default_batch_sizes
from libreyolo.serve.budget import BatcherBusy, RequestTooLarge

__all__ = ["BatchAborted", "Batcher", "BatcherBusy", "BatcherClosed", "RequestTooLarge", "create_app",
           "default_batch_sizes"]


def __getattr__(name: str) -> Any:
    if name == "create_app":  # imports FastAPI: only when asked for
        from libreyolo.serve.app import create_app

        return create_app
    raise AttributeError(f"module 'libreyolo.serve' has no attribute {name!r}")
