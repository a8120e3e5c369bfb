"""DEIMv2: reference (libreyolo 1.6.0) checkpoints load here and compute the same numbers, and
every size has the reference's layout.

Probe parity (every deimv2 fixture present): the fixture records the reference *network
module's* outputs on the probes. For the ViT sizes (s, m, l, x) that module takes
ImageNet-normalised input, while ours normalises inside (so that artifacts take [0, 1] images),
so the probes go through :meth:`DEIMv2.forward_normalized`, the reference module's function.
Rows are compared as in tests/test_compat_detr.py (in order, else one-to-one): the top-300
query selection has near-ties (deimv2-s: 58+ rows of its uniform and normal probes move; the
sorted values agree to 7e-7). A real bug is caught: passing the border-masked memory to the
decoder layers (instead of only to the query selection) left every row of the ramp probe off by
up to 0.04 and failed this test.

Layout (every size, meta device): key shapes derived from the reference's size table
(``SIZE_CONFIGS`` in libreyolo/models/deimv2/nn.py of the reference, and the DINOv3 / ViT-tiny /
HGNetv2 configurations it names) written below as data, so a wrong width or depth fails;
``test_layout_check_rejects_a_wrong_table`` shows the check failing on a mutated table.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from libreyolo.models.deimv2.network import SIZES, DEIMv2
from libreyolo.models.registry import family_from_filename, get_family
from tests.compat_utils import (
    RAW_ATOL,
    SCORE_TOL,
    fixtures,
    model_from_fixture,
    recorded_detections,
    schema,
    set_match,
)
from tests.test_compat_detr import rows_match

# --- the reference's size table (libreyolo 1.6.0 models/deimv2/nn.py SIZE_CONFIGS), as facts -----------------
# decoder: hidden, layers, FFN, points per level, queries; encoder: FFN (0 = lite encoder), expansion,
# depth_mult; backbone: HGNetv2 name and returned stages, or ViT name, taken blocks, STA width, projection width
REF = {
    "atto": dict(hidden=64, layers=3, ffn=160, points=(4, 2), queries=100, enc_ffn=0, expansion=0.34, depth=0.5,
                 hgnet="Atto", return_idx=(2,), gateway=False, shared_box=True, imgsz=320),
    "femto": dict(hidden=96, layers=3, ffn=256, points=(4, 2), queries=150, enc_ffn=0, expansion=0.34, depth=0.5,
                  hgnet="Femto", return_idx=(2,), gateway=False, shared_box=True, imgsz=416),
    "pico": dict(hidden=112, layers=3, ffn=320, points=(4, 2), queries=200, enc_ffn=0, expansion=0.34, depth=0.5,
                 hgnet="Pico", return_idx=(2,), gateway=False, shared_box=True, imgsz=640),
    "n": dict(hidden=128, layers=3, ffn=512, points=(6, 6), queries=300, enc_ffn=512, expansion=0.34, depth=0.5,
              hgnet="B0", return_idx=(2, 3), gateway=True, shared_box=False, imgsz=640),
    "s": dict(hidden=192, layers=4, ffn=512, points=(3, 6, 3), queries=300, enc_ffn=512, expansion=0.34,
              depth=0.67, vit=(192, 3, False), take=(3, 7, 11), sta=16, gateway=True, shared_box=False, imgsz=640),
    "m": dict(hidden=256, layers=4, ffn=512, points=(3, 6, 3), queries=300, enc_ffn=512, expansion=0.67,
              depth=1.0, vit=(256, 4, False), take=(3, 7, 11), sta=16, gateway=True, shared_box=False, imgsz=640),
    "l": dict(hidden=224, layers=4, ffn=1792, points=(3, 6, 3), queries=300, enc_ffn=896, expansion=1.0,
              depth=1.0, vit=(384, 6, "mlp"), take=(5, 8, 11), sta=32, gateway=True, shared_box=False, imgsz=640),
    "x": dict(hidden=256, layers=6, ffn=2048, points=(3, 6, 3), queries=300, enc_ffn=1024, expansion=1.25,
              depth=1.37, vit=(384, 6, "swiglu"), take=(5, 8, 11), sta=64, gateway=True, shared_box=False,
              imgsz=640),
}
# HGNetv2 stage output widths (reference models/deim/backbone.py arch_configs)
HGNET_OUT = {"Atto": (64, 256, 256), "Femto": (64, 256, 512), "Pico": (64, 256, 512), "B0": (64, 256, 512, 1024)}
NC, REG_MAX, DEC_HEADS, ENC_HEADS = 80, 32, 8, 8


def expected_shapes(size: str) -> dict[str, tuple[int, ...]]:
    """Key -> shape the reference's table implies (a sample of the keys that carry each width/depth)."""
    r = REF[size]
    h, L = r["hidden"], r["layers"]
    p = sum(r["points"])
    e: dict[str, tuple[int, ...]] = {
        "decoder.enc_score_head.weight": (NC, h),
        f"decoder.dec_score_head.{L - 1}.weight": (NC, h),
        f"decoder.dec_bbox_head.{L - 1}.layers.2.weight": (4 * (REG_MAX + 1), h),
        "decoder.query_pos_head.layers.0.weight": (h, 4),
        "decoder.query_pos_head.layers.2.weight": (h, h),
        "decoder.denoising_class_embed.weight": (NC + 1, h),
        f"decoder.decoder.layers.{L - 1}.swish_ffn.w12.weight": (2 * (r["ffn"] // 2), h),
        f"decoder.decoder.layers.{L - 1}.swish_ffn.w3.weight": (h, r["ffn"] // 2),
        "decoder.decoder.layers.0.cross_attn.sampling_offsets.weight": (DEC_HEADS * p * 2, h),
        "decoder.decoder.layers.0.cross_attn.num_points_scale": (p,),
        f"decoder.decoder.lqe_layers.{L - 1}.reg_conf.layers.0.weight": (64, 20),
        "decoder.anchors": (1, sum((r["imgsz"] // s) ** 2 for s in ((16, 32) if "hgnet" in r else (8, 16, 32))), 4),
    }
    e["decoder.decoder.layers.0.gateway.gate.weight" if r["gateway"] else "decoder.decoder.layers.0.norm2.scale"] = \
        (2 * h, 2 * h) if r["gateway"] else (h,)
    c4, blocks = round(r["expansion"] * h // 2), round(3 * r["depth"])
    if r["enc_ffn"]:
        e["encoder.encoder.0.layers.0.linear1.weight"] = (r["enc_ffn"], h)
        e["encoder.fpn_blocks.0.cv2.0.conv1.conv.weight"] = (2 * c4, h, 1, 1)
        e[f"encoder.pan_blocks.0.cv3.0.bottlenecks.{blocks - 1}.conv1.conv.weight"] = (c4, c4, 3, 3)
        e["encoder.pan_blocks.0.cv4.conv.weight"] = (h, 2 * h + 2 * c4, 1, 1)
    else:
        e["encoder.fpn_block.cv2.0.conv1.conv.weight"] = (2 * c4, h, 1, 1)
        e[f"encoder.pan_block.cv3.0.bottlenecks.{blocks - 1}.conv1.conv.weight"] = (c4, c4, 3, 3)
        e["encoder.fpn_block.cv2.1.conv.weight"] = (c4, c4, 3, 3)  # the ELAN4 tail conv
        e["encoder.input_proj.0.conv.weight"] = (h, HGNET_OUT[r["hgnet"]][r["return_idx"][0]], 1, 1)
    if "hgnet" in r:
        outs = HGNET_OUT[r["hgnet"]]
        last = len(outs) - 1
        e[f"backbone.stages.{last}.blocks.0.aggregation.1.conv.weight"] = (outs[last], outs[last] // 2, 1, 1)
    else:
        dim, heads, kind = r["vit"]
        c = r["sta"]
        proj = h if kind else dim  # l/x project the DINOv3 features to the decoder width
        pre = "backbone.dinov3." if kind else "backbone.dinov3._model."
        e[pre + "cls_token"] = (1, 1, dim)
        e[pre + "blocks.11.attn.qkv.weight"] = (3 * dim, dim)
        e[pre + "rope_embed.periods"] = (dim // heads // 4,)
        e["backbone.sta.conv4.1.weight"] = (4 * c, 4 * c, 3, 3)
        e["backbone.convs.0.weight"] = (proj, dim + 2 * c, 1, 1)
        e["backbone.convs.2.weight"] = (proj, dim + 4 * c, 1, 1)
        if kind:
            e[pre + "storage_tokens"] = (1, 4, dim)
            e[pre + "blocks.11.ls2.gamma"] = (dim,)
            e[pre + "blocks.11.attn.qkv.bias_mask"] = (3 * dim,)
            if kind == "swiglu":  # ratio 6, two thirds, rounded up to a multiple of 8
                e[pre + "blocks.11.mlp.w1.weight"] = (1536, dim)
            else:
                e[pre + "blocks.11.mlp.fc1.weight"] = (4 * dim, dim)
    return e


def layout_mismatches(net: torch.nn.Module, size: str) -> list[str]:
    r = REF[size]
    sd = net.state_dict()
    bad = [f"{k}: {tuple(sd[k].shape) if k in sd else 'missing'} != {v}"
           for k, v in expected_shapes(size).items() if k not in sd or tuple(sd[k].shape) != v]
    counts = {
        "decoder layers": (len({k.split(".")[3] for k in sd if k.startswith("decoder.decoder.layers.")}), r["layers"]),
        "score heads": (len({k.split(".")[2] for k in sd if k.startswith("decoder.dec_score_head.")}), r["layers"]),
        "queries": (net.decoder.num_queries, r["queries"]),
    }
    if "take" in r:
        pre = "backbone.dinov3." if r["vit"][2] else "backbone.dinov3._model."
        blocks = {int(k[len(pre):].split(".")[1]) for k in sd if k.startswith(pre + "blocks.")}
        counts["vit blocks"] = (len(blocks), 12)
        counts["taken blocks"] = (tuple(net.backbone.dinov3.take), r["take"])
    else:
        counts["hgnet stages"] = (len({k.split(".")[2] for k in sd if k.startswith("backbone.stages.")}),
                                  len(HGNET_OUT[r["hgnet"]]))
    bad += [f"{name}: {got} != {want}" for name, (got, want) in counts.items() if got != want]
    if r["shared_box"]:  # one head object under every layer's key
        heads = net.decoder.dec_bbox_head
        if not all(m is heads[0] for m in heads):
            bad.append("dec_bbox_head is not shared across layers")
    return bad


@pytest.mark.parametrize("size", list(REF))
def test_every_size_has_the_reference_layout(size):
    with torch.device("meta"):
        net = DEIMv2(size, NC)
    assert layout_mismatches(net, size) == []
    fam = get_family("deimv2")
    assert fam.default_imgsz_for(size) == REF[size]["imgsz"]
    assert family_from_filename(f"LibreDEIMv2{size}") == (fam, size)
    # an int reg_scale in the reference's table becomes an int64 parameter in its checkpoints
    want = torch.int64 if size in ("n", "s", "m", "l", "x") else torch.float32
    assert net.decoder.reg_scale.dtype == want


def test_layout_check_rejects_a_wrong_table(monkeypatch):
    import dataclasses

    wrong = dataclasses.replace(SIZES["m"], expansion=0.5)  # a wrong width inside the encoder's ELAN blocks
    monkeypatch.setitem(SIZES, "m", wrong)
    with torch.device("meta"):
        net = DEIMv2("m", NC)
    assert any("encoder." in m for m in layout_mismatches(net, "m"))


def test_families_do_not_claim_each_others_file_names():
    assert family_from_filename("LibreDEIMv2atto") == (get_family("deimv2"), "atto")
    assert family_from_filename("LibreDFINEs")[0].name == "dfine"
    assert family_from_filename("LibreDEIMv2q") is None


def test_untrained_atto_roundtrips_through_a_checkpoint(tmp_path):
    from libreyolo import LibreYOLO
    from libreyolo.engine.model import Model

    fam = get_family("deimv2")
    model = Model(fam, "atto", nc=3, names={0: "a", 1: "b", 2: "c"}, imgsz=320)
    again = LibreYOLO(model.save(tmp_path / "LibreDEIMv2atto.pt"))
    assert (again.family.name, again.size, again.nc, again.imgsz) == ("deimv2", "atto", 3, 320)
    mine, theirs = model.net.state_dict(), again.net.state_dict()
    assert list(mine) == list(theirs) and all(torch.equal(mine[k], theirs[k]) for k in mine)
    with torch.no_grad():
        out = again.net.eval()(torch.rand(1, 3, 320, 320))
    assert out["pred_logits"].shape == (1, 100, 3) and bool(out["pred_boxes"].isfinite().all())


# --- fixtures ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def loaded(compat_dir, compat_fill):
    found = fixtures(compat_dir, family="deimv2")
    if not found:
        pytest.skip(f"no deimv2 fixtures in {compat_dir}")
    return [(d, model_from_fixture(d, compat_fill)) for d in found]


def test_every_deimv2_fixture_reproduces_probe_outputs(loaded, compat_fill):
    for d, model in loaded:
        s = schema(d)
        recorded = np.load(d / "probes.npz")
        probes = compat_fill.probes(s["probe_size"], s["seed"])
        with torch.no_grad():  # one batch of the three probes: one forward per fixture
            out = model.net.eval().forward_normalized(torch.cat(list(probes.values())))
        keys = {re.sub(r"^output\.[^.]+\.", "", k) for k in recorded}
        assert keys == {"pred_logits", "pred_boxes"}, keys  # every output the fixture records is compared
        for i, name in enumerate(probes):
            ours = np.concatenate([out[k][i].float().numpy() for k in ("pred_logits", "pred_boxes")], -1)
            theirs = np.concatenate([recorded[f"output.{name}.{k}"][0] for k in ("pred_logits", "pred_boxes")], -1)
            assert ours.shape == theirs.shape, (d.name, name)
            ok, moved, err = rows_match(ours, theirs, RAW_ATOL)
            assert ok, f"{d.name} {name}: {moved} query rows differ from the recording (max abs error {err:.3g})"


def test_every_deimv2_fixture_predict_matches_reference_as_sets(loaded, compat_dir):
    """The recorded call (conf=0.01, all 300 detections kept) must match as sets; then the subset
    above the widest gap between consecutive recorded scores (measured on the recording, not tuned):
    a threshold there is not tied, so the expected set cannot hinge on float noise."""
    for d, model in loaded:
        theirs, call = recorded_detections(d)
        assert "conf=0.01" in call, call
        r = model(str(compat_dir / "fixtures" / "sample.png"), conf=0.01)
        ours = {"xyxy": r.boxes.xyxy, "conf": r.boxes.conf, "cls": r.boxes.cls}
        assert len(ours["conf"]) == len(theirs["conf"]), (d.name, len(ours["conf"]), len(theirs["conf"]))
        assert min(set_match(ours, theirs)) >= 0.99, (d.name, set_match(ours, theirs))
        scores = np.sort(theirs["conf"].numpy())[::-1]
        gaps = scores[:-1] - scores[1:]
        i = int(np.argmax(gaps))
        assert gaps[i] > 10 * SCORE_TOL, (d.name, float(gaps[i]))
        conf = float(scores[i] + scores[i + 1]) / 2
        a, b = ({k: v[det["conf"] >= conf] for k, v in det.items()} for det in (ours, theirs))
        assert len(a["conf"]) == len(b["conf"]) == i + 1, (d.name, conf, len(a["conf"]), len(b["conf"]))
        assert min(set_match(a, b)) == 1.0, (d.name, conf, set_match(a, b))
