"""Validation tolerances: per format, device and precision; float32 compared with TF32 off on CUDA."""
from __future__ import annotations

import pytest
import torch


def test_thresholds_pick_the_most_specific_key_format_device_precision():
    from libreyolo.models.base import ExportContract

    c = ExportContract(tolerances={"fp32": 1e-4, "onnx:fp32": 2e-4, "fp16": 5e-2},
                       rtol={"fp32": 1e-6, "aoti:cuda:fp32": 1e-5, "fp16": 1e-2})
    assert c.thresholds("aoti", "fp32", "cuda")[:2] == (1e-4, 1e-5)
    assert c.thresholds("aoti", "fp32", "cpu")[:2] == (1e-4, 1e-6)
    assert c.thresholds("onnx", "fp32")[:2] == (2e-4, 1e-6)
    assert c.thresholds("onnx", "fp16", "cuda")[:2] == (5e-2, 1e-2)


def test_exact_float32_turns_tf32_off_only_for_cuda_and_restores_the_flags():
    from libreyolo.utils.numerics import exact_float32

    cudnn, mm = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = cudnn.allow_tf32, mm.allow_tf32
    try:
        cudnn.allow_tf32 = mm.allow_tf32 = True
        with exact_float32("cpu"):
            assert cudnn.allow_tf32 and mm.allow_tf32
        with pytest.raises(ValueError), exact_float32("cuda"):
            assert not cudnn.allow_tf32 and not mm.allow_tf32
            raise ValueError("the flags come back even when the body fails")
        assert cudnn.allow_tf32 and mm.allow_tf32
    finally:
        cudnn.allow_tf32, mm.allow_tf32 = saved
