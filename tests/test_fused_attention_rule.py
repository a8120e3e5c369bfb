"""Every attention family's default path follows rule 2 of the kernels design: fused SDPA by
default only where it is byte-exact against the manual path (ViT/DeiT excepted by convention).

Each family's smallest size, untrained with seeded weights, in eval mode, runs a batch of four
inputs (uniform, clipped normal, a smooth ramp, large magnitude) once with every attention module
manual and once fused; the max abs difference of the output (and of each attention module alone,
on the inputs it saw) is printed, and the family's default is checked against the rule.
"""
from __future__ import annotations

import copy
import functools
import math

import pytest
import torch

from libreyolo.kernels.attention import record_attention, set_fused_attention
from libreyolo.models.registry import families
from tests.attention_rule import (
    ATTENTION_FAMILIES,
    FUSED_BY_CONVENTION,
    PathComparison,
    attention_modules,
    compare_paths,
    default_fused,
    outputs_equal,
    probe_batch,
    rule_violation,
    seeded_net,
)

# (size, input size): smallest sizes; classifiers take 224 only, the others small for the CPU
CASES = {
    "vit": ("ti", 224),
    "deit": ("t", 224),
    "swin": ("t", 224),
    "segformer": ("b0", 64),
    "swinir": ("s", 32),
    "rtdetr": ("r18", 96),
    "dfine": ("n", 96),
    "rtdetrv2": ("r18", 96),
    "deimv2": ("s", 64),  # the default size: its ViT backbone holds the family's self-attention
    "rfdetr": ("n", 64),   # the position table is resized to 4 x 4 patches: a 2 x 2 grid of 2 x 2 windows
    "lwdetr": ("t", 64),   # the smallest input: one patch per window of the 4 x 4 grid
    "deim": ("n", 96),
    "rtdetrv4": ("s", 96),
}
# the attention modules each case holds: one per transformer block (DETR: the encoder's one
# self-attention layer plus one per decoder layer; deformable attention has no flag)
EXPECTED_MODULES = {"vit": 12, "deit": 12, "swin": 12, "segformer": 8, "swinir": 24, "rtdetr": 4, "dfine": 4,
                    "rtdetrv2": 4,
                    "deimv2": 17,  # deimv2-s: 12 ViT blocks, the encoder's layer, 4 decoder layers
                    "rfdetr": 14, "lwdetr": 9,  # LW-DETR line: every ViT block plus one per decoder layer
                    "deim": 4, "rtdetrv4": 4}


def inputs(family: str, large: bool = True) -> torch.Tensor:
    return torch.cat(list(probe_batch(CASES[family][1], large=large).values()))


@functools.cache
def built(family: str) -> torch.nn.Module:
    x = inputs(family)
    return seeded_net(family, CASES[family][0], calibration=x[:3])


@functools.cache
def measured(family: str) -> PathComparison:
    net = built(family)
    comparison = compare_paths(net, inputs(family))
    print(f"\n{family} {CASES[family][0]} CPU fp32 {CASES[family][1]} px, fused vs manual: "
          f"byte-exact {comparison.byte_exact}, output max abs diff {comparison.output_diff:.3g}, "
          f"worst attention module {comparison.worst_module_diff:.3g}, default fused {default_fused(net)}")
    return comparison


def test_cases_cover_every_family_with_switchable_attention():
    with_flags = {name for name, fam in families().items()
                  if attention_modules(fam.build(fam.default_size, 10))}
    assert with_flags == set(ATTENTION_FAMILIES) == set(CASES)


def test_rule_accepts_manual_exact_and_exception_defaults_and_rejects_inexact_fused():
    assert rule_violation("swin", 2e-6, default=False) is None
    assert rule_violation("swin", 0.0, default=True) is None
    assert rule_violation("vit", 2e-6, default=True) is None and "vit" in FUSED_BY_CONVENTION
    assert "swin" in rule_violation("swin", 2e-6, default=True)
    assert rule_violation("swin", math.nan, default=True) is not None  # NaN is not byte-exact


@pytest.mark.parametrize("family", CASES)
def test_default_attention_path_follows_the_rule(family):
    comparison = measured(family)
    default = default_fused(built(family))
    assert comparison.byte_exact == (comparison.output_diff == 0.0)
    assert rule_violation(family, comparison.output_diff, default) is None
    if family in FUSED_BY_CONVENTION:
        assert default
    elif not comparison.byte_exact:
        assert not default, f"{family}: fused is not byte-exact here, so its default must be manual"
    # either way the paths agree to float32 rounding in each attention module
    assert comparison.worst_module_diff <= 1e-5


def test_rule_check_rejects_a_family_switched_to_fused_by_default(monkeypatch):
    """The mutation: make SegFormer's attention default to fused; the same check must fail."""
    from libreyolo.models.segformer.network import EfficientAttention

    original = EfficientAttention.__init__

    def fused_by_default(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.fused_attn = True

    monkeypatch.setattr(EfficientAttention, "__init__", fused_by_default)
    mutated = families()["segformer"].build(CASES["segformer"][0], 10)
    assert default_fused(mutated)
    comparison = measured("segformer")
    assert not comparison.byte_exact  # the measurement the mutation contradicts
    assert rule_violation("segformer", comparison.output_diff, default_fused(mutated)) is not None


@pytest.mark.parametrize("family", CASES)
def test_set_fused_attention_counts_every_attention_module_and_false_restores_manual_bytes(family):
    net, x = built(family), inputs(family)
    manual = measured(family).manual
    default = default_fused(net)
    try:
        n = set_fused_attention(net, True)
        with record_attention() as calls, torch.inference_mode():
            net(x)
        assert n == len(attention_modules(net)) == len(calls) == EXPECTED_MODULES[family]
        assert {c.path for c in calls} == {"sdpa"}
        assert set_fused_attention(net, enabled=False) == n
        with record_attention() as calls, torch.inference_mode():
            restored = net(x)
        assert {(c.fused_requested, c.path) for c in calls} == {(False, "primitive")}
        assert outputs_equal(restored, manual)
    finally:
        set_fused_attention(net, default)


@pytest.mark.gpu
@pytest.mark.parametrize("family", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_default_attention_path_follows_the_rule_on_cuda(family, dtype):
    net = copy.deepcopy(built(family)).to("cuda", dtype)
    comparison = compare_paths(net, inputs(family, large=dtype == torch.float32).to("cuda", dtype))
    default = default_fused(net)
    print(f"\n{family} {CASES[family][0]} {torch.cuda.get_device_name()} {dtype} {CASES[family][1]} px, "
          f"fused vs manual: byte-exact {comparison.byte_exact}, output max abs diff "
          f"{comparison.output_diff:.3g}, worst attention module {comparison.worst_module_diff:.3g}, "
          f"default fused {default}")
    assert not math.isnan(comparison.output_diff)
    assert rule_violation(family, comparison.output_diff, default) is None
