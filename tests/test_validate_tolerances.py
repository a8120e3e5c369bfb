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


def test_fp16_allowance_adds_twice_the_eager_models_own_fp16_drift():
    """The demo detector's eager fp16 output moves boxes past the fixed fp16 allowance; an artifact
    as far off as twice that drift passes, one farther fails, and the cosine bar still applies."""
    from libreyolo import LibreYOLO
    from libreyolo.assets import DEMO_MODEL
    from libreyolo.export.validate import FP16_DRIFT_FACTOR, _half_copy, compare_outputs, fp16_drift, probe_images

    model = LibreYOLO(DEMO_MODEL)
    x = probe_images(160)["ramps"]
    with torch.inference_mode():
        ref = model.family.named_outputs(model.net(x))
    drift = fp16_drift(model, model.family, x, ref, _half_copy(model.net))
    pred = ref["predictions"]
    assert 0 < drift["predictions"] < 10, drift
    with torch.inference_mode():
        eager16 = model.family.named_outputs(_half_copy(model.net)(x.half()))["predictions"].float()
    atol, rtol, cos = 5e-2, 1e-2, 0.999
    allowance = FP16_DRIFT_FACTOR * drift["predictions"]
    assert compare_outputs(pred, eager16, atol, rtol, cos, drift=allowance)["passed"]
    off = pred.clone()
    i = int(pred[0, :4].abs().argmin())  # a box row element: a small value, so rtol adds nothing
    off[0, i // pred.shape[2], i % pred.shape[2]] += atol + allowance * 0.9
    assert compare_outputs(pred, off, atol, rtol, cos, drift=allowance)["passed"]
    off[0, i // pred.shape[2], i % pred.shape[2]] += allowance * 0.2 + 2 * rtol * float(pred.abs().max())
    assert not compare_outputs(pred, off, atol, rtol, cos, drift=allowance)["passed"]
    assert not compare_outputs(pred, off, atol, rtol, cos)["passed"]  # no drift: the fixed thresholds
    scrambled = pred.flip(2)  # within a large allowance element-wise, but another output: cosine fails
    assert not compare_outputs(pred, scrambled, atol, rtol, cos, drift=1e9)["passed"]


def test_fp16_drift_ignores_outputs_that_overflow_in_fp16():
    from libreyolo.export.validate import fp16_drift

    class Fam:
        @staticmethod
        def named_outputs(out):
            return {"a": out * 1e5, "b": out}  # 1e5 overflows float16 (max 65504)

    class M:
        device = torch.device("cpu")

    x = torch.ones(1, 4)
    drift = fp16_drift(M(), Fam(), x, {"a": x * 1e5, "b": x + 0.01}, lambda t: t)
    assert set(drift) == {"b"} and abs(drift["b"] - 0.01) < 1e-3
