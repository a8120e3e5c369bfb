"""Swin (classify) matches the reference library: weights load key for key, logits and top-5 agree.

Every ``swin-*`` fixture under ``LIBREYOLO_COMPAT_DIR`` is checked (the shared folder has swin-t;
``tools/make_reference_fixture.py`` writes others, for more sizes, seeds and input sizes, from the
reference library). The tests without fixtures pin what the window attention does: the shift
mask, the additive mask SDPA receives, batching, and whether fused SDPA is byte-exact on CPU.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from libreyolo import LibreYOLO, set_fused_attention
from libreyolo.errors import ArgumentError
from libreyolo.models.registry import family_from_filename, get_family
from libreyolo.models.swin.network import MASK_VALUE, SwinTransformer, WindowAttention, shifted_window_mask
from tests.compat_utils import RAW_ATOL, assert_probe_parity, fixtures, model_from_fixture, schema
from tests.numerics import assert_within_float32_noise, float64_run, to_float64

PROB_ATOL = 1e-4
# measured on CPU (torch 2.13): SDPA with the bias as an additive mask rounds differently from
# matmul-softmax-matmul (max ~1e-7 on logits), which is why swin keeps the manual path by default
FUSED_BYTE_EXACT_ON_CPU = False
ATTENTION_MODULES = {"t": 12, "s": 24, "b": 24}
# the reference's state dicts (nc=1000): key count, element count, sha256 of the "key:[shape]" lines
# in order; taken from the reference library (built and listed, a black box) with
# tools/make_reference_fixture.py, t also from the shared fixture's schema.json
REFERENCE_STATE = {
    "t": (173, 28288354, "03b39ce43256e2068c7186436f5978103ca14f608b65a1335890788ccd413cfb"),
    "s": (329, 49606258, "84acae121455656c09aead8cd129cc1be867486ff121fae7dceacb2e095db9ad"),
    "b": (329, 87768224, "f0102cd5308c1fe54eb25b1078eed1d884744cff5fab007972f869a6e2c41746"),
}


def swin_fixtures(compat_dir: Path) -> list[Path]:
    found = fixtures(compat_dir, family="swin")
    assert found, f"no swin fixtures under {compat_dir}/fixtures"
    return found


def seeded_swin(size: str = "t", nc: int = 1000, seed: int = 0) -> SwinTransformer:
    """An untrained swin with well-spread weights (a non-zero position bias, so masks matter)."""
    net = SwinTransformer(size, nc).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in net.state_dict().items():
            if t.is_floating_point():
                if t.ndim >= 2:
                    t.copy_(torch.randn(t.shape, generator=g) / t[0].numel() ** 0.5)
                else:
                    t.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn(t.shape, generator=g))
    return net


# --- the reference's numbers ---------------------------------------------------------------------
def test_swin_fixtures_reproduce_probe_logits(compat_dir, compat_fill):
    for d in swin_fixtures(compat_dir):
        model = model_from_fixture(d, compat_fill)
        assert (model.family.name, model.size) == ("swin", schema(d)["size"])
        assert_probe_parity(model, d, compat_fill)


def test_swin_fixtures_predict_the_reference_top5(compat_dir, compat_fill):
    for d in swin_fixtures(compat_dir):
        ref = np.load(d / "predict.npz")
        assert str(ref["call"]) == "predict('sample.png')", str(ref["call"])
        r = model_from_fixture(d, compat_fill)(str(d.parent / "sample.png"))
        assert r.probs is not None and r.boxes is None
        assert r.probs.top5 == ref["top5"].tolist(), (d.name, r.probs.top5, ref["top5"].tolist())
        err = float(np.abs(r.probs.top5conf.numpy() - ref["top5conf"]).max())
        assert err <= PROB_ATOL, f"{d.name}: top-5 probabilities differ by {err:.3g}"


def test_swin_fixtures_list_exactly_our_state_dict_keys_in_order(compat_dir):
    for d in swin_fixtures(compat_dir):
        s = schema(d)
        net = get_family("swin").build(s["size"], s["nc"])
        assert [(k, list(v.shape)) for k, v in net.state_dict().items()] == \
            [(t["key"], t["shape"]) for t in s["tensors"]], d.name


def test_swin_matches_the_reference_at_other_input_sizes_where_recorded(compat_dir, compat_fill):
    """Fixtures written with ``--extra-sizes`` hold logits for other (padded, rectangular) sizes."""
    checked = 0
    for d in swin_fixtures(compat_dir):
        recorded = np.load(d / "probes.npz")
        extra = [k for k in recorded.files if k.startswith("output.extra.")]
        if not extra:
            continue
        s = schema(d)
        net = model_from_fixture(d, compat_fill).net
        g = torch.Generator().manual_seed(s["seed"] + 2000)  # the order the tool drew them in
        for key in extra:
            h, w = map(int, key.rsplit(".", 1)[1].split("x"))
            with torch.no_grad():
                ours = net(torch.rand(1, 3, h, w, generator=g)).numpy()
            err = float(np.abs(ours - recorded[key]).max())
            assert err <= RAW_ATOL, f"{d.name} {key}: max abs error {err:.3g}"
            checked += 1
    if not checked:
        pytest.skip("no swin fixture records other input sizes (tools/make_reference_fixture.py --extra-sizes)")


@pytest.mark.parametrize("size", sorted(REFERENCE_STATE))
def test_every_size_has_the_reference_state_dict_layout(size):
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        state = SwinTransformer(size, 1000).state_dict()
    lines = "\n".join(f"{k}:{list(v.shape)}" for k, v in state.items())
    got = (len(state), sum(v.numel() for v in state.values()), hashlib.sha256(lines.encode()).hexdigest())
    assert got == REFERENCE_STATE[size], (size, got)


def test_file_names_and_input_size_follow_the_reference():
    assert [(f.name, s) for f, s in (family_from_filename(n) for n in ("LibreSwint-cls", "LibreSwinB-cls"))] \
        == [("swin", "t"), ("swin", "b")]
    assert family_from_filename("LibreSwinl-cls") is None  # the reference's l is not offered here
    model = LibreYOLO("LibreSwint-cls.yaml", nc=3)
    assert (model.family.name, model.size, model.imgsz) == ("swin", "t", 224)
    assert model.family.filename("s") == "LibreSwins-cls"
    with pytest.raises(ArgumentError, match="224"):
        model.predict(np.zeros((64, 64, 3), np.uint8), imgsz=256)


def test_checkpoint_round_trip_keeps_weights(tmp_path):
    model = LibreYOLO("LibreSwint-cls.yaml", nc=4, names=["a", "b", "c", "d"])
    again = LibreYOLO(model.save(tmp_path / "LibreSwint-cls.pt"))
    assert (again.family.name, again.size, again.nc, again.names[3]) == ("swin", "t", 4, "d")
    for (k, a), (_, b) in zip(model.net.state_dict().items(), again.net.state_dict().items(), strict=True):
        assert torch.equal(a, b), k


# --- window attention ----------------------------------------------------------------------------
def _mask_by_slices(h: int, w: int, window: int, shift: int) -> torch.Tensor:
    """The shift mask written the way the Swin paper's code builds it: label 9 slices, compare labels."""
    labels = torch.zeros(h, w)
    cuts = (slice(0, -window), slice(-window, -shift), slice(-shift, None))
    for i, hs in enumerate(cuts):
        for j, ws in enumerate(cuts):
            labels[hs, ws] = i * 3 + j
    win = labels.reshape(h // window, window, w // window, window).permute(0, 2, 1, 3).reshape(-1, window * window)
    return (win[:, None, :] != win[:, :, None]).float() * MASK_VALUE


@pytest.mark.parametrize("hw", [(56, 56), (14, 21), (7, 14)])
def test_shift_mask_separates_exactly_the_regions_the_roll_joined(hw):
    torch.testing.assert_close(shifted_window_mask(*hw, 7, 3), _mask_by_slices(*hw, 7, 3), rtol=0, atol=0)


def test_batched_forward_equals_each_image_alone():
    net = seeded_swin()
    x = torch.rand(3, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    net64 = to_float64(net)
    with torch.no_grad():
        batched, alone = net(x), torch.cat([net(x[i:i + 1]) for i in range(3)])
        exact = torch.cat([net64(x[i:i + 1].double()) for i in range(3)])
    assert_within_float32_noise(batched, alone, exact)  # the batch changes rounding only


def test_fused_attention_defaults_off_and_set_fused_attention_counts_the_modules():
    for size, count in ATTENTION_MODULES.items():
        with torch.device("meta"):
            net = SwinTransformer(size, 10)
        assert [m.fused_attn for m in net.modules() if isinstance(m, WindowAttention)] == [False] * count
        assert set_fused_attention(net) == count
        assert all(m.fused_attn for m in net.modules() if isinstance(m, WindowAttention))
        assert set_fused_attention(net, enabled=False) == count


def test_fused_attention_is_not_byte_exact_against_manual_on_cpu():
    """Statement for swin on CPU: fused SDPA and the manual path agree within ~1e-7, not bit for bit."""
    net = seeded_swin()
    x = torch.rand(2, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        manual = net(x)
        assert set_fused_attention(net) == ATTENTION_MODULES["t"]
        fused = net(x)
    assert torch.equal(fused, manual) is FUSED_BYTE_EXACT_ON_CPU
    set_fused_attention(net, enabled=False)
    assert_within_float32_noise(fused, manual, float64_run(net, x))


def test_fused_path_gives_sdpa_the_position_bias_plus_shift_mask_as_an_additive_mask(monkeypatch):
    net = seeded_swin()
    set_fused_attention(net)
    seen = []
    original = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        seen.append(attn_mask)
        return original(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    with torch.no_grad():
        net(torch.rand(2, 3, 224, 224))
    assert len(seen) == ATTENTION_MODULES["t"] and all(m is not None and m.is_floating_point() for m in seen)
    block = net.layers[0].blocks[1]  # stage 1, shifted: 8x8 windows per image
    bias = block.attn.position_bias()
    mask = shifted_window_mask(56, 56, 7, block.shift)
    expect = (bias[None, None] + mask[None, :, None]).expand(2, -1, -1, -1, -1).reshape(2 * 64, *bias.shape)
    torch.testing.assert_close(seen[1], expect, rtol=0, atol=0)
    first = net.layers[0].blocks[0].attn.position_bias()  # unshifted: the bias alone, broadcast over windows
    torch.testing.assert_close(seen[0], first[None].expand_as(seen[0]), rtol=0, atol=0)


@pytest.mark.gpu
def test_cuda_forward_matches_cpu_and_fused_matches_manual_in_fp32_and_fp16_autocast(monkeypatch):
    """On the GPU: manual fp32 logits equal the CPU's within float noise; fused SDPA agrees with the
    manual path in fp32 and under fp16 autocast (bench/attention_bench.py records bit-exactness)."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # true float32 for the comparison
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    net = seeded_swin()
    x = torch.rand(4, 3, 224, 224, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        cpu = net(x)
        exact = float64_run(net, x)  # the manual path in float64, on the CPU
        net, xc = net.cuda(), x.cuda()
        for dtype in (None, torch.float16):
            with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
                set_fused_attention(net, enabled=False)
                manual = net(xc).float()
                set_fused_attention(net)
                fused = net(xc).float()
            if dtype is None:  # float32: each within NOISE_MULTIPLE x the CPU float32 error against float64
                assert_within_float32_noise(fused.cpu(), cpu, exact, what="fused on CUDA")
                assert_within_float32_noise(manual.cpu(), cpu, exact, what="manual on CUDA")
            else:  # fp16 autocast: half-precision drift, not float32 rounding (tests/numerics.py does not apply)
                torch.testing.assert_close(fused, manual, atol=5e-2, rtol=0)
                torch.testing.assert_close(manual.cpu(), cpu, atol=5e-1, rtol=0)
