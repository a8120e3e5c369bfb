"""ViT/DeiT on a CUDA GPU: no host syncs in the forward; fused vs manual attention in fp32 and fp16 autocast.

Run on the H200: ``PYTHONPATH=. python -m pytest -m gpu tests/test_classify_gpu.py -s`` (the byte-exact
statements are printed; timings come from bench/attention_bench.py).
"""
from __future__ import annotations

import pytest
import torch

from libreyolo import LibreYOLO, set_fused_attention
from libreyolo.kernels.attention import record_attention
from tests.numerics import assert_within_float32_noise, float64_run

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", params=[("LibreViTti-cls", "vit"), ("LibreDeiTt-cls", "deit")])
def model(request):
    torch.manual_seed(0)
    return LibreYOLO(f"{request.param[0]}.yaml", nc=1000, device="cuda")


def test_forward_makes_no_host_synchronisation(model):
    x = torch.rand(2, 3, 224, 224, device="cuda")
    with torch.inference_mode():
        model.net(x)  # warm up (lazy init may sync)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            model.net(x)
        finally:
            torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("precision", ["fp32", "fp16-autocast"])
def test_fused_agrees_with_manual_and_says_whether_byte_exact(model, precision, monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # true float32 for the fp32 comparison
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    x = torch.rand(4, 3, 224, 224, device="cuda", generator=torch.Generator("cuda").manual_seed(1)) * 2 - 1
    outs = {}
    for fused in (True, False):
        set_fused_attention(model.net, enabled=fused)
        with torch.inference_mode(), record_attention() as calls, \
                torch.autocast("cuda", dtype=torch.float16, enabled=precision != "fp32"):
            outs[fused] = model.net(x).float()
        assert {c.path for c in calls} == {"sdpa" if fused else "primitive"}
    set_fused_attention(model.net, enabled=True)
    diff = float((outs[True] - outs[False]).abs().max())
    print(f"\n{model.family.name} {precision}: fused byte-exact vs manual: {torch.equal(outs[True], outs[False])}, "
          f"max abs diff {diff:.3g}")
    if precision == "fp32":  # float32: within NOISE_MULTIPLE x the manual path's own error against float64
        set_fused_attention(model.net, enabled=False)
        try:
            exact = float64_run(model.net, x)
        finally:
            set_fused_attention(model.net, enabled=True)
        assert_within_float32_noise(outs[True], outs[False], exact)
    else:  # fp16 autocast: half-precision drift, not float32 rounding (tests/numerics.py does not apply)
        torch.testing.assert_close(outs[True], outs[False], atol=5e-2, rtol=0)


def test_predict_on_cuda_matches_cpu_top5(model):
    from libreyolo import SAMPLE_IMAGE

    gpu = model(SAMPLE_IMAGE)
    cpu = model(SAMPLE_IMAGE, device="cpu")
    model.to("cuda")
    assert gpu.probs.top5 == cpu.probs.top5
    torch.testing.assert_close(gpu.probs.data.cpu(), cpu.probs.data, atol=1e-5, rtol=0)
