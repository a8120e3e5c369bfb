"""Faster providers for the reference numerics in `libreyolo.quant`.

Providers live in submodules by backend and are imported only by
`register_providers()`, which the registry calls lazily on first use.
"""

from __future__ import annotations

__all__ = ["register_providers"]


def register_providers() -> None:
    """Register the Triton fake-quant kernels when Triton and a CUDA device are present."""
    from libreyolo.kernels._providers import triton_usable

    if not triton_usable():
        return
    from libreyolo.kernels.quant import triton_provider

    triton_provider.register()
