"""Questions providers ask about the calling context: tracing, exporting, compiling.

Accelerated providers (Triton, Hub) must never end up inside an exported
graph, so every one of them declines when any of these report true. The checks
are written once here so that all providers agree on what "exporting" means.
"""

from __future__ import annotations

import os

import torch

__all__ = ["KernelWarning", "capturing_for_export", "compiling", "env_disabled", "eager_only_ok",
           "export_capture_reasons"]


class KernelWarning(RuntimeWarning):
    """Warned (once per cause) when a provider is skipped or disabled."""


_FALSE_WORDS = frozenset({"0", "false", "off", "no"})


def capturing_for_export() -> bool:
    """True while a graph is being captured for an artifact.

    Covers `torch.jit.trace` (TorchScript, CoreML and NCNN paths), the
    TorchScript-based and dynamo-based ONNX exporters, and `torch.export`.
    Plain `torch.compile` is deliberately *not* included: it is not an
    export, and it lowers fused ops better than primitive ones.
    """
    if torch.jit.is_tracing():
        return True
    if torch.onnx.is_in_onnx_export():
        return True
    is_exporting = getattr(torch.compiler, "is_exporting", None)
    return bool(is_exporting is not None and is_exporting())


def export_capture_reasons() -> tuple[str, ...]:
    """The predicates that report an export capture right now, by name (empty when none does).

    The same checks as :func:`capturing_for_export`, all evaluated, so that a slot that declines
    can say why (see ``libreyolo.kernels.attention.record_attention``).
    """
    reasons = []
    if torch.jit.is_tracing():
        reasons.append("torch.jit.is_tracing()")
    if torch.onnx.is_in_onnx_export():
        reasons.append("torch.onnx.is_in_onnx_export()")
    is_exporting = getattr(torch.compiler, "is_exporting", None)
    if is_exporting is not None and is_exporting():
        reasons.append("torch.compiler.is_exporting()")
    return tuple(reasons)


def compiling() -> bool:
    """True while dynamo traces the code (`torch.compile` or `torch.export`)."""
    is_compiling = getattr(torch.compiler, "is_compiling", None)
    return bool(is_compiling is not None and is_compiling())


def eager_only_ok() -> bool:
    """True when the call runs eagerly: not traced, compiled, exported or ONNX-exported."""
    return not (capturing_for_export() or compiling())


def env_disabled(variable: str) -> bool:
    """True when an opt-out variable such as `LIBREYOLO_HUB_KERNELS` is set to 0/false/off/no."""
    return os.environ.get(variable, "").strip().lower() in _FALSE_WORDS
