"""LibreYOLO: checkpoint-compatible vision models, fast serving, validated export.

``import libreyolo`` stays light: torch and the model code load on first use of ``LibreYOLO``.
"""
from __future__ import annotations

from typing import Any

from libreyolo._version import __version__
from libreyolo.assets import SAMPLE_IMAGE, SHAPES_IMAGE

__all__ = ["SAMPLE_IMAGE", "SHAPES_IMAGE", "LibreYOLO", "__version__", "compare", "set_fused_attention"]


def __getattr__(name: str) -> Any:
    if name == "LibreYOLO":
        from libreyolo.api import LibreYOLO

        return LibreYOLO
    if name == "compare":  # re-validate an artifact against a checkpoint
        from libreyolo.export.compare import compare

        return compare
    if name == "set_fused_attention":  # switch the fused_attn flag of every attention module
        from libreyolo.kernels.attention import set_fused_attention

        return set_fused_attention
    if name in ("Results", "Boxes", "Probs"):
        from libreyolo import results

        return getattr(results, name)
    raise AttributeError(f"module 'libreyolo' has no attribute {name!r}")
