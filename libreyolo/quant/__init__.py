"""Reference quantization numerics (they define the meaning; `libreyolo.kernels` only speeds them up).

Call the references directly when you want the defining numbers, or go through
the registry (`libreyolo.kernels.call("fake_quant_fp8", x, scale)`) to get the
fastest implementation that proves parity with them.
"""

from __future__ import annotations

from libreyolo.quant.fake_quant import (
    FP8_E4M3_MAX,
    INT8_AFFINE_RANGE,
    INT8_SYMMETRIC_MAX,
    fake_quant_fp8,
    fake_quant_int8_affine,
    fake_quant_int8_per_channel,
)

__all__ = [
    "FP8_E4M3_MAX",
    "INT8_AFFINE_RANGE",
    "INT8_SYMMETRIC_MAX",
    "fake_quant_fp8",
    "fake_quant_int8_affine",
    "fake_quant_int8_per_channel",
]
