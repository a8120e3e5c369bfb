"""The derived float32 bars of tests/numerics.py pass correct programs and fail wrong ones.

One mutation per kind of use: a module transform (Conv-BN folding), a kernel against its
reference path (fused attention), box coordinates (scaled by their own box).
"""
from __future__ import annotations

import torch
from torch import nn

from libreyolo.engine.inference import CopyKey, build_copy
from libreyolo.kernels.attention import attention
from libreyolo.layers.conv import ConvBNAct
from tests.numerics import FLOOR, MAX_NOISE, NOISE_MULTIPLE, float32_bar, float64_run, relative_error, scales


def _seeded_convs() -> nn.Module:
    net = nn.Sequential(ConvBNAct(3, 16, 3), ConvBNAct(16, 16, 3), ConvBNAct(16, 8, 3, act=False)).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, t in net.state_dict().items():
            if t.is_floating_point():
                t.copy_(torch.rand(t.shape, generator=g) + 0.5 if "var" in name else torch.randn(t.shape, generator=g))
    return net


def test_a_folded_copy_passes_and_one_weight_off_by_a_relative_1e3_fails():
    net = _seeded_convs()
    x = torch.randn(2, 3, 24, 24, generator=torch.Generator().manual_seed(1))
    folded, count = build_copy(net, CopyKey(torch.device("cpu"), torch.float32, True, False))
    exact = float64_run(net, x)
    assert exact.dtype == torch.float64 and net[0].conv.weight.dtype == torch.float32  # the source is untouched
    with torch.no_grad():
        plain = net(x)
        bar = float32_bar(folded(x), plain, exact)
        assert count == 3 and bar.ok and bar.noise > 0, bar
        folded[1].conv.weight.mul_(1.001)
        assert not float32_bar(folded(x), plain, exact).ok


def test_a_fused_kernel_passes_and_an_output_off_by_1e3_fails():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 16, generator=g) for _ in range(3))
    exact = float64_run(attention, q, k, v, fused=False)
    manual, fused = attention(q, k, v, fused=False), attention(q, k, v)
    assert float32_bar(fused, manual, exact).ok
    wrong = fused.clone()
    wrong[1, 2, 3, 4] += 1e-3
    assert not float32_bar(wrong, manual, exact).ok
    wrong[1, 2, 3, 4] = float("nan")
    assert relative_error(wrong, exact) == float("inf")


def test_box_coordinates_are_judged_against_their_own_box_extent():
    exact = torch.tensor([[500.123456789, 510.987654321, 546.555555555, 547.111111111],
                          [1.123456789, 2.987654321, 5.555555555, 6.111111111]], dtype=torch.float64)
    rounded = exact.float()
    big_box_ulps = rounded.clone()
    big_box_ulps[0] += 2 * torch.finfo(torch.float32).eps * 512  # two ulps at 547 px: rounding noise
    assert float32_bar(big_box_ulps, rounded, exact, box_dim=-1).ok
    small_box_off = rounded.clone()
    small_box_off[1, 2] += 1e-4  # 1.6e-5 of its own extent: a real error a per-tensor scale would miss
    assert float32_bar(small_box_off, rounded, exact).ok
    assert not float32_bar(small_box_off, rounded, exact, box_dim=-1).ok


def test_head_layout_scales_boxes_by_their_extent_and_scores_by_the_tensor():
    pred = torch.tensor([[[10.0, 500.0], [-20.0, 2.0], [5.0, 3.0], [1.0, 4.0],  # box rows (B, 4 + nc, A)
                          [0.5, 0.25], [0.125, 0.75]]])                            # two class scores
    s = scales(pred, box_dim=1)
    assert s[0, :4].tolist() == [[20.0, 500.0]] * 4 and s[0, 4:].tolist() == [[0.75, 0.75]] * 2
    assert scales(pred).unique().tolist() == [500.0]


def test_the_allowance_is_the_declared_multiple_of_the_measured_noise_plus_the_floor():
    exact = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)
    baseline = exact.float() + torch.tensor([0.0, 0.0, 4e-5])  # relative noise ~1e-5 of the scale 4
    noise = relative_error(baseline, exact)
    assert abs(noise - 1e-5) < 1e-7
    allowed = NOISE_MULTIPLE * noise + FLOOR
    for fraction, ok in ((0.9, True), (1.1, False)):
        candidate = exact.float() + torch.tensor([fraction * 4 * allowed, 0.0, 0.0])
        assert float32_bar(candidate, baseline, exact).ok is ok, fraction


def test_a_baseline_that_computes_something_else_is_not_taken_as_noise():
    exact = torch.linspace(1, 2, 5, dtype=torch.float64)
    other = exact.float() * (1 + 4 * MAX_NOISE)
    bar = float32_bar(other, other, exact)
    assert bar.error == bar.noise and not bar.ok and "not float32 noise" in str(bar)
