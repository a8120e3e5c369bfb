"""CUDA graphs for inference: capture a family's network forward once per input key, replay it.

Used by every eager model's ``predict(cuda_graph=True | "auto")``; see docs/graphs.md.
:class:`GraphRunner` does the work, :mod:`libreyolo.graphs.parity` verifies a family
(graph output bit-for-bit equal to eager) before it may set ``SUPPORTS_CUDA_GRAPH``.
"""
from __future__ import annotations

from libreyolo.graphs.backend import CudaGraphBackend, EmulatedGraphBackend, GraphBackend
from libreyolo.graphs.runner import (
    AUTO_CAPTURE_AT,
    DEFAULT_MAX_GRAPHS,
    GraphCaptureError,
    GraphNotSupportedError,
    GraphProgram,
    GraphRunner,
    GraphUnavailableError,
)

__all__ = [
    "AUTO_CAPTURE_AT",
    "DEFAULT_MAX_GRAPHS",
    "CudaGraphBackend",
    "EmulatedGraphBackend",
    "GraphBackend",
    "GraphCaptureError",
    "GraphNotSupportedError",
    "GraphProgram",
    "GraphRunner",
    "GraphUnavailableError",
]
