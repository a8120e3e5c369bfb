"""RT-DETRv2: reference (libreyolo 1.6.0) checkpoints load here and compute the same numbers; every size
has the reference's layout; the v2 attention's flat per-level layout is v1's where the counts agree and
stays on the portable path where they differ.

Raw outputs are per-query rows in the order of the top-300 query selection, which float noise
reorders where candidates tie within an ulp: rows are matched as in tests/test_compat_detr.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.models.detr_shared.deformable import ProjectedDeformableAttention
from libreyolo.models.registry import get_family
from libreyolo.models.rtdetr.decoder import MSDeformableAttention
from tests.compat_utils import RAW_ATOL, assert_detections_match_above_gap, fixtures, model_from_fixture, schema
from tests.test_compat_detr import rows_match


def _v2_fixtures(compat_dir):
    found = fixtures(compat_dir, family="rtdetrv2")
    if not found:
        pytest.skip(f"no rtdetrv2 fixture under {compat_dir / 'fixtures'}")
    return found


@pytest.fixture(scope="module")
def loaded(compat_dir, compat_fill):
    return [(d, model_from_fixture(d, compat_fill)) for d in _v2_fixtures(compat_dir)]


def _rows(out: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([out["pred_logits"], out["pred_boxes"]], axis=-1)


def test_every_rtdetrv2_fixture_reproduces_probe_outputs(loaded, compat_fill):
    for d, model in loaded:
        assert model.family.name == "rtdetrv2"
        s = schema(d)
        recorded = np.load(d / "probes.npz")
        probes = compat_fill.probes(s["probe_size"], s["seed"])
        with torch.no_grad():  # the three probes as one batch: one forward
            out = model.net.eval()(torch.cat(list(probes.values())))
        for i, name in enumerate(probes):
            theirs = {k: recorded[f"output.{name}.{k}"][0] for k in ("pred_logits", "pred_boxes")}
            ours = {k: out[k][i].float().numpy() for k in theirs}
            assert all(ours[k].shape == theirs[k].shape for k in theirs), (d.name, name)
            ok, moved, err = rows_match(_rows(ours), _rows(theirs), RAW_ATOL)
            assert ok, f"{d.name} {name}: {moved} query rows differ from the recording (max abs error {err:.3g})"


def test_every_rtdetrv2_fixture_predict_matches_reference_as_sets(loaded, compat_dir):
    """The recorded predict(conf=0.01) is the top 300 (query, class) pairs; its lowest rows are float
    noise (rtdetrv2-r18: 300 rows from 0.938 down, consecutive ones often 1e-6 apart). As the top-k
    comes before the conf filter, the reference's answer at a higher conf is the recorded rows above
    it: compared at the middle of the widest gap of the recorded scores (rtdetrv2-r18: 6.7e-4 wide,
    157 rows above), every detection must match both ways."""
    sample = str(compat_dir / "fixtures" / "sample.png")
    for d, model in loaded:
        assert_detections_match_above_gap(lambda conf, m=model: m(sample, conf=conf), d)


# the reference's size table (libreyolo 1.6.0, models/rtdetr/model.py RTDETR_CONFIGS, the ResNet sizes
# models/rtdetrv2/model.py builds; PResNet blocks per stage from its depth): depth, blocks per stage,
# encoder hidden width, encoder FFN width, CSP expansion, decoder layers, eval_idx (the decoder's default
# num_points=4 on each of 3 levels, hidden 256, FFN 1024, 8 heads, stored anchors at 640)
REFERENCE_SIZES = {
    "r18": (18, (2, 2, 2, 2), 256, 1024, 0.5, 3, -1),
    "r34": (34, (3, 4, 6, 3), 256, 1024, 0.5, 4, -1),
    "r50": (50, (3, 4, 6, 3), 256, 1024, 1.0, 6, -1),
    "r50m": (50, (3, 4, 6, 3), 256, 1024, 0.5, 6, 2),
    "r101": (101, (3, 4, 23, 3), 384, 2048, 1.0, 6, -1),
}


@pytest.mark.parametrize("size", sorted(REFERENCE_SIZES))
def test_every_size_has_the_reference_layout(size):
    depth, blocks, enc, enc_ffn, expansion, layers, eval_idx = REFERENCE_SIZES[size]
    fam = get_family("rtdetrv2")
    with torch.device("meta"):
        net = fam.build(size, 80)
    sd = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    for stage, count in enumerate(blocks):
        assert f"backbone.res_layers.{stage}.blocks.{count - 1}.branch2a.conv.weight" in sd
        assert not any(k.startswith(f"backbone.res_layers.{stage}.blocks.{count}.") for k in sd)
    bottleneck = depth >= 50
    assert ("backbone.res_layers.0.blocks.0.branch2c.conv.weight" in sd) == bottleneck
    # the reference loads these sizes' checkpoints with frozen backbone norms: no batch counters
    assert ("backbone.conv1.conv1_1.norm.num_batches_tracked" in sd) == (not bottleneck)
    widths = (512, 1024, 2048) if bottleneck else (128, 256, 512)
    for i, c in enumerate(widths):
        assert sd[f"encoder.input_proj.{i}.0.weight"] == (enc, c, 1, 1)
        assert sd[f"decoder.input_proj.{i}.conv.weight"] == (256, enc, 1, 1)
    assert sd["encoder.encoder.0.layers.0.linear1.weight"] == (enc_ffn, enc)
    assert sd["encoder.fpn_blocks.0.conv1.conv.weight"] == (int(enc * expansion), 2 * enc, 1, 1)
    assert f"decoder.decoder.layers.{layers - 1}.linear1.weight" in sd
    assert not any(k.startswith(f"decoder.decoder.layers.{layers}.") for k in sd)
    assert sd["decoder.decoder.layers.0.linear1.weight"] == (1024, 256)
    assert sd["decoder.decoder.layers.0.cross_attn.num_points_scale"] == (12,)
    assert sd["decoder.decoder.layers.0.cross_attn.sampling_offsets.weight"] == (8 * 12 * 2, 256)
    assert sd["decoder.anchors"] == (1, 8400, 4) and sd["decoder.valid_mask"] == (1, 8400, 1)
    assert sd["decoder.enc_output.proj.weight"] == (256, 256) and "decoder.enc_output.0.weight" not in sd
    assert net.decoder.decoder.eval_idx == (eval_idx if eval_idx >= 0 else layers + eval_idx)


@pytest.mark.parametrize("size", sorted(REFERENCE_SIZES))
def test_every_size_builds_from_its_name_without_downloading(size, tmp_path):
    model = LibreYOLO(f"LibreRTDETRv2{size}.yaml")
    assert (model.family.name, model.size, model.imgsz) == ("rtdetrv2", size, 640)
    if size != "r18":
        return  # the names and builds are what differ; one save/load round trip is enough
    again = LibreYOLO(model.save(tmp_path / "LibreRTDETRv2r18.pt"))
    assert again.family.name == "rtdetrv2"
    assert all(torch.equal(a, b) for a, b in zip(model.net.state_dict().values(), again.net.state_dict().values(),
                                                 strict=True))


def _linked(points: tuple[int, ...]) -> tuple[ProjectedDeformableAttention, MSDeformableAttention | None]:
    torch.manual_seed(0)
    v2 = ProjectedDeformableAttention(32, 4, points).eval()
    with torch.no_grad():
        for p in v2.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    if len(set(points)) > 1:
        return v2, None
    v1 = MSDeformableAttention(32, 4, len(points), points[0]).eval()
    v1.load_state_dict({k: v for k, v in v2.state_dict().items() if k != "num_points_scale"})
    return v2, v1


def _inputs(shapes=((8, 8), (4, 4), (2, 2))):
    g = torch.Generator().manual_seed(1)
    s = sum(h * w for h, w in shapes)
    query = torch.randn(2, 5, 32, generator=g)
    ref = torch.cat((torch.rand(2, 5, 1, 2, generator=g), 0.2 + 0.3 * torch.rand(2, 5, 1, 2, generator=g)), -1)
    return query, ref, torch.randn(2, s, 32, generator=g), [tuple(x) for x in shapes]


def test_v2_flat_layout_equals_v1_where_every_level_has_the_same_points():
    v2, v1 = _linked((4, 4, 4))
    with torch.no_grad():
        a, b = v2(*_inputs()), v1(*_inputs())
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_differing_points_per_level_stay_on_the_portable_path():
    from libreyolo import kernels
    from libreyolo.kernels.attention import ms_deform_attn_portable
    from libreyolo.kernels.attention.deformable import accelerated_inputs_ok

    seen = []

    def provider(*args, **kwargs):  # accepted only where a compiled provider could be (uniform points)
        seen.append(kwargs.get("points_per_level"))
        return ms_deform_attn_portable(*args, **kwargs)

    def eligible(*args, points_per_level=None, discrete=False):
        return not args or accelerated_inputs_ok(*args, points_per_level, discrete, allow_grad=True,
                                                 device_type="cpu")

    kernels.register("ms_deform_attn", provider, name="v2-points-spy", predicate=eligible)
    try:
        v2, _ = _linked((2, 3, 4))
        uniform, _ = _linked((4, 4, 4))
        with torch.no_grad():
            out = v2(*_inputs())
            assert seen == []  # 2, 3 and 4 points: declined, the portable path answered
            uniform(*_inputs())
            assert seen == [(4, 4, 4)]  # the same provider does take the uniform layout
    finally:
        kernels.unregister("ms_deform_attn", "v2-points-spy")
    assert out.shape == (2, 5, 32) and bool(torch.isfinite(out).all())
