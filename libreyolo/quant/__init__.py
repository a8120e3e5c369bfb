"""Reference quantization numerics (they define the meaning; `libreyolo.kernels` only speeds them up).

Call the references directly when you want the defining numbers, or go through
the registry (`libreyolo.kernels.call("fake_quant_fp8", x, scale)`) to get the
fastest implementation that proves parity with them.

The names below load on first use (PEP 562), so ``libreyolo.quant.options`` (read by the CLI
before it does any work) imports without torch.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "FP8_E4M3_MAX",
    "INT8_AFFINE_RANGE",
    "INT8_SYMMETRIC_MAX",
    "fake_quant_fp8",
    "fake_quant_int8_affine",
    "fake_quant_int8_per_channel",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from libreyolo.quant import fake_quant

        return getattr(fake_quant, name)
    raise AttributeError(f"module 'libreyolo.quant' has no attribute {name!r}")
