"""Swappable kernels, chosen in one place.

A slot names what is computed (`fake_quant_fp8`, `ms_deform_attn`, ...).
`resolve(slot)` returns the newest registered implementation whose predicate
accepts the call, else the slot's reference (from `libreyolo.quant`), else
None for slots whose callers keep a portable path. `active()` shows the
choice per slot. Accelerated providers (Triton, Hub, an installed
`libreyolo_kernels` package) are imported lazily on first selection, never at
import; `LIBREYOLO_KERNELS=off` skips them entirely. See docs/kernels.md.

The attention helper lives at `libreyolo.kernels.attention.attention` (the
name `libreyolo.kernels.attention` is the subpackage, so it is not re-exported
here under the same name).
"""

from __future__ import annotations

from libreyolo.kernels._registry import (
    REFERENCE,
    UNAVAILABLE,
    Implementation,
    KernelBinding,
    KernelWarning,
    active,
    bind,
    call,
    call_or,
    candidates,
    define_slot,
    disable,
    register,
    resolve,
    selected,
    selector,
    slots,
    unregister,
)
from libreyolo.kernels.attention import (
    fused_attention_allowed,
    ms_deform_attn,
    ms_deform_attn_portable,
    set_fused_attention,
)

__all__ = [
    "REFERENCE",
    "UNAVAILABLE",
    "Implementation",
    "KernelBinding",
    "KernelWarning",
    "active",
    "bind",
    "call",
    "call_or",
    "candidates",
    "define_slot",
    "disable",
    "fused_attention_allowed",
    "ms_deform_attn",
    "ms_deform_attn_portable",
    "register",
    "resolve",
    "selected",
    "selector",
    "set_fused_attention",
    "slots",
    "unregister",
]
