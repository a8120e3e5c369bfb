"""Fused scaled-dot-product attention, governed by policy rather than availability.

`F.scaled_dot_product_attention` needs nothing beyond PyTorch, so the only
question is *when* it may be used. Rule: never while a graph is captured for
an artifact (`torch.jit.trace`, ONNX export of either kind, `torch.export`);
those graphs must carry the primitive matmul-softmax-matmul expression, which
every runtime understands. Plain `torch.compile` is not an export and keeps
the fused op, which it lowers better than the primitive one.

Families whose manual path is not byte-exact against the fused op keep the
manual path by default and expose a `fused_attn` flag on their attention
modules; `set_fused_attention` flips it model-wide.
"""

from __future__ import annotations

import logging
import math
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from libreyolo.kernels.context import capturing_for_export, export_capture_reasons

__all__ = [
    "AttentionCall",
    "attention",
    "attention_primitive",
    "fused_attention_allowed",
    "record_attention",
    "set_fused_attention",
]

_LOG = logging.getLogger("libreyolo")
_local = threading.local()  # active recorders of this thread (export runs in the calling thread)
_logged_declines: set[tuple[str, ...]] = set()


@dataclass(frozen=True)
class AttentionCall:
    """One call of :func:`attention`: the path taken and, when fused was asked for but not used,
    the export predicates that declined it (e.g. ``("torch.compiler.is_exporting()",)``)."""

    fused_requested: bool
    path: str                       # "sdpa" or "primitive"
    declined_by: tuple[str, ...]    # empty unless fused was requested and an export capture declined it


@contextmanager
def record_attention() -> Iterator[list[AttentionCall]]:
    """Record every :func:`attention` call made in this thread inside the block.

    ``with record_attention() as calls: torch.onnx.export(...)`` then shows, per attention
    slot, whether SDPA ran and which predicate made it decline. Recording costs nothing when
    no block is active.
    """
    calls: list[AttentionCall] = []
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(calls)
    try:
        yield calls
    finally:
        stack.remove(calls)


def _note(call: AttentionCall) -> None:
    for calls in getattr(_local, "stack", None) or ():
        calls.append(call)
    if call.declined_by and call.declined_by not in _logged_declines:
        _logged_declines.add(call.declined_by)
        _LOG.debug("fused attention declined (%s): primitive matmul-softmax-matmul emitted",
                   ", ".join(call.declined_by))


def fused_attention_allowed() -> bool:
    """Whether the fused SDPA op may be used here (False while capturing for export)."""
    return not capturing_for_export()


def _default_scale(q: torch.Tensor) -> float:
    if not torch.jit.is_tracing():
        return 1.0 / math.sqrt(q.shape[-1])
    # The head size is fixed for a traced model, so baking it in as a constant
    # is correct; silence the tracer's generic warning about it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return 1.0 / math.sqrt(int(q.shape[-1]))


def attention_primitive(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """`softmax(q @ k^T * scale + mask) @ v` written with primitive ops only.

    `mask` follows SDPA: a bool mask marks positions that take part (True =
    attend); a floating mask is added to the scores.
    """
    if scale is None:
        scale = _default_scale(q)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    return torch.matmul(scores.softmax(dim=-1), v)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    fused: bool = True,
) -> torch.Tensor:
    """Attention over the last two dims of `q` (..., Lq, D), `k` (..., Lk, D), `v` (..., Lk, Dv).

    Uses `F.scaled_dot_product_attention` when `fused` is true and no export
    capture is running; otherwise the primitive expression. Model code calls
    this one helper instead of choosing between the two itself.
    """
    if not torch.jit.is_tracing():  # traced sizes are tensors; the ops below check shapes anyway
        _check_shapes(q, k, v)
    declined: tuple[str, ...] = ()
    if fused:
        declined = export_capture_reasons()
        if not declined:
            _note(_SDPA_CALL)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    _note(AttentionCall(bool(fused), "primitive", declined))
    return attention_primitive(q, k, v, mask=mask, scale=scale)


_SDPA_CALL = AttentionCall(True, "sdpa", ())


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() < 2 or k.dim() < 2 or v.dim() < 2:
        raise ValueError(
            f"attention expects (..., L, D) tensors, got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"attention shapes do not fit: q {tuple(q.shape)} and k {tuple(k.shape)} need the same last "
            f"dim, k and v {tuple(v.shape)} the same sequence length (dim -2)"
        )


def set_fused_attention(model: Any, enabled: bool = True) -> int:
    """Set the `fused_attn` flag of every submodule that has one; returns how many it set.

    ``model``: a network (``nn.Module``) or a model ``LibreYOLO(...)`` returns (its master network
    is switched and its inference copies and their graphs are rebuilt, so that the next predict
    runs the new path). The count is the number of attention modules the switch controls (all
    of them now equal `enabled`), so 0 means the model has no switchable attention.
    """
    if not isinstance(model, nn.Module) and callable(getattr(model, "set_fused_attention", None)):
        return model.set_fused_attention(enabled)
    if not isinstance(model, nn.Module):
        raise TypeError(f"set_fused_attention expects an nn.Module or a LibreYOLO model, got {type(model).__name__}")
    switched = 0
    for module in model.modules():
        if isinstance(getattr(module, "fused_attn", None), bool):
            module.fused_attn = bool(enabled)
            switched += 1
    return switched
