"""Attention kernels, by purpose: fused SDPA policy and multi-scale deformable attention.

Backends live in their own modules (`deformable_triton`,
`deformable_hub`) and are imported only by `register_providers()`,
which the registry calls lazily on first use.
"""

from __future__ import annotations

from libreyolo.kernels.attention.deformable import ms_deform_attn, ms_deform_attn_portable
from libreyolo.kernels.attention.sdpa import (
    AttentionCall,
    attention,
    attention_primitive,
    fused_attention_allowed,
    record_attention,
    set_fused_attention,
)

__all__ = [
    "AttentionCall",
    "attention",
    "attention_primitive",
    "fused_attention_allowed",
    "ms_deform_attn",
    "ms_deform_attn_portable",
    "record_attention",
    "register_providers",
    "set_fused_attention",
]


def register_providers() -> None:
    """Register the Triton (when Triton and CUDA exist) and Hub (when `kernels` exists) providers."""
    from libreyolo.kernels._providers import package_present, triton_usable

    if triton_usable():
        from libreyolo.kernels.attention import deformable_triton

        deformable_triton.register()
    if package_present("kernels"):
        from libreyolo.kernels.attention import deformable_hub

        deformable_hub.register()
