"""Float32 that is float32: TF32 off while artifacts are compared with the eager model on CUDA."""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

_LOCK = threading.Lock()


@contextlib.contextmanager
def exact_float32(device: torch.device | str) -> Iterator[None]:
    """Turn TF32 off for cuDNN convolutions and cuBLAS matmuls on CUDA, restoring the flags after.

    PyTorch runs float32 convolutions in TF32 on Ampere and later by default (10-bit mantissa,
    about 1e-3 relative error per product). Two correct float32 programs (eager, and an artifact
    that folded Conv-BN or fused kernels) then differ by TF32 noise rather than by float32
    rounding, and a comparison at float32 tolerances measures the noise. The flags are process
    global, so this is for validation and parity checks, not for serving.
    """
    if torch.device(device).type != "cuda":
        yield
        return
    with _LOCK:
        saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        with _LOCK:
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
