"""Reference (libreyolo 1.6.0) DEIM and RT-DETRv4 checkpoints load here and compute the same numbers.

Both families are D-FINE's network with SiLU in the decoder (feed-forward, localisation-quality
layers and MLP heads); the deim-n fixture has the 674 keys of dfine-n, rtdetrv4-s the 794 of
dfine-s, key for key and shape for shape.

The selection edge. Query rows are the top-300 encoder candidates, and the deim-n fixture's
untrained weights (no calibrating overrides) put candidates 300 and 301 of the "uniform" probe
5.8e-9 apart in float64, while float32 scores carry ~1.9e-6 of rounding error (measured here:
our float32 against our float64). Our float32 keeps the other candidate; the reference's float32
kept the one float64 keeps (our float64 run matches all 300 recorded rows within 2.5e-6). Exactly
one row then differs (0.085), every other row matches within 1.9e-5. So rows are matched
one-to-one as in tests/test_compat_detr.py, and rows left unmatched on both sides are excused only
under the export validator's selection-edge rule (:func:`libreyolo.export.selection.boundaries`,
from our own float32 and float64 scores): at most as many as candidates lie within reach of the
edge, all at or after the first row such a candidate can occupy. A wrong network moves every row
(checked below with D-FINE's ReLU decoder on DEIM weights) and a wrong row above the edge is
never excused (checked on synthetic rows).
"""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from libreyolo.engine.model import Model
from libreyolo.errors import CheckpointError
from libreyolo.export.selection import Boundary, boundaries, tap
from libreyolo.models.registry import get_family
from tests.compat_utils import (
    RAW_ATOL,
    assert_detections_match,
    fixtures,
    model_from_fixture,
    recorded_detections,
    schema,
)
from tests.test_compat_detr import _rows

FAMILIES = ("deim", "rtdetrv4")
QUERIES = 300


def _fixtures(compat_dir):
    found = [d for fam in FAMILIES for d in fixtures(compat_dir, family=fam)]
    if not found:
        pytest.skip(f"no {'/'.join(FAMILIES)} fixtures in {compat_dir}")
    return found


def match_rows(ours: np.ndarray, theirs: np.ndarray, atol: float, edge: Boundary) -> tuple[bool, str]:
    """(Q, D) rows matched one-to-one within ``atol`` (each row of ours to its nearest unused row of
    theirs); rows unmatched on both sides pass only as selection-edge swaps: as many on each side,
    at most ``edge.swaps``, none before ``edge.first_row``."""
    dist = np.abs(ours[:, None] - theirs[None]).max(-1)
    free = np.ones(len(theirs), bool)
    lost = []
    for i in range(len(ours)):
        cand = np.where(free & (dist[i] <= atol))[0]
        if len(cand) == 0:
            lost.append(i)
            continue
        free[cand[np.argmin(dist[i, cand])]] = False
    left = np.nonzero(free)[0].tolist()
    if not lost:
        return True, "all rows matched"
    why = f"unmatched rows: ours {lost[:8]}, recorded {left[:8]}; edge {edge}"
    ok = len(lost) == len(left) <= edge.swaps and min(lost) >= edge.first_row and min(left) >= edge.first_row
    return ok, why


def test_match_rows_excuses_only_an_edge_swap():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(QUERIES, 5)).astype(np.float32)
    edge = Boundary(swaps=1, first_row=QUERIES - 1)
    swapped = a[rng.permutation(QUERIES)]
    assert match_rows(swapped, a, 1e-4, edge)[0]
    last = a.copy()
    last[-1] += 0.1  # another candidate in the last row: excused
    assert match_rows(last, a, 1e-4, edge)[0]
    assert not match_rows(last, a, 1e-4, Boundary())[0]  # no near-tie at the edge: refused
    early = a.copy()
    early[10] += 0.1  # a wrong row above the edge: refused
    assert not match_rows(early, a, 1e-4, edge)[0]
    two = last.copy()
    two[-2] += 0.1  # more rows than candidates within reach: refused
    assert not match_rows(two, a, 1e-4, edge)[0]


@pytest.fixture(scope="module")
def runs(compat_dir, compat_fill):
    """Per fixture: the model loaded as ``LibreYOLO("x.pt")`` loads it, its float32 outputs on the
    three probes (one batch) and selection scores, and the float64 selection scores where a probe's
    rows do not all match (computed once, shared by the tests below)."""
    out = {}
    for d in _fixtures(compat_dir):
        s = schema(d)
        model = model_from_fixture(d, compat_fill)
        probes = compat_fill.probes(s["probe_size"], s["seed"])
        x = torch.cat(list(probes.values()))
        selection = model.family.export.selection
        with torch.no_grad(), tap(model.net.eval(), selection) as scores:
            y = model.net(x)
        recorded = np.load(d / "probes.npz")
        rows = {}
        for i, name in enumerate(probes):
            theirs = {k: recorded[f"output.{name}.{k}"][0] for k in ("pred_logits", "pred_boxes")}
            ours = {k: y[k][i].float().numpy() for k in theirs}
            assert all(ours[k].shape == theirs[k].shape for k in theirs), (d.name, name)
            rows[name] = (_rows(ours), _rows(theirs))
        edges = dict.fromkeys(probes, Boundary())
        failing = [i for i, (a, b) in enumerate(rows.values()) if not match_rows(a, b, RAW_ATOL, Boundary())[0]]
        if failing:  # the float64 scores of those probes, and float32's largest score error on them
            net64 = copy.deepcopy(model.net).double()
            with torch.no_grad(), tap(net64, selection) as scores64:
                net64(x[failing].double())
            del net64
            for j, edge in zip(failing, boundaries(scores[-1][failing], scores64[-1], QUERIES), strict=True):
                edges[list(probes)[j]] = edge
        out[d.name] = {"dir": d, "model": model, "x": x, "rows": rows, "edges": edges}
    return out


def test_every_deim_line_fixture_reproduces_probe_outputs(runs):
    for name, run in runs.items():
        assert run["model"].family.name == schema(run["dir"])["family"]
        for probe, (ours, theirs) in run["rows"].items():
            ok, why = match_rows(ours, theirs, RAW_ATOL, run["edges"][probe])
            assert ok, f"{name} {probe}: {why}"


def test_dfine_relu_decoder_on_deim_weights_is_refused(runs, compat_fill):
    """The mutation: the same weights in D-FINE's network (ReLU decoder) fail the probe check, even
    with the correct network's selection-edge allowance (first probe)."""
    run = next((r for r in runs.values() if r["model"].family.name == "deim"), None)
    if run is None:
        pytest.skip("no deim fixture")
    s = schema(run["dir"])
    net = get_family("dfine").build(s["size"], s["nc"]).eval()
    net.load_state_dict(compat_fill.fill(run["dir"]))
    probe = next(iter(run["rows"]))
    with torch.no_grad():
        y = net(run["x"][:1])
    ours = _rows({k: y[k][0].numpy() for k in ("pred_logits", "pred_boxes")})
    ok, why = match_rows(ours, run["rows"][probe][1], RAW_ATOL, run["edges"][probe])
    assert not ok and "unmatched" in why


def test_every_deim_line_fixture_predict_matches_reference_as_sets(runs, compat_dir):
    """At the recorded call (conf=0.01). Every recorded score is >= 0.93 (deim-n 0.930..0.936,
    rtdetrv4-s 0.934 for all 300 rows, one class each), so the threshold is 0.92 away from any
    score and decides nothing; the 300 rows are the 300 queries, compared as sets (class, IoU >=
    0.99, score within 1e-4). On deim-n one query is the selection-edge candidate above (299 of 300
    match, the bar is 99%)."""
    for run in runs.values():
        d = run["dir"]
        theirs, call = recorded_detections(d)
        assert "conf=0.01" in call, call
        assert float(theirs["conf"].min()) > 0.9, (d.name, float(theirs["conf"].min()))
        r = run["model"](str(compat_dir / "fixtures" / "sample.png"), conf=0.01)
        assert len(r) == len(theirs["conf"]), (d.name, len(r), len(theirs["conf"]))
        assert_detections_match(r, d)


# The reference's size tables, read from its code (libreyolo 1.6.0): DEIM from
# models/deim/nn.py SIZE_CONFIGS; RT-DETRv4 builds models/dfine/nn.py SIZE_CONFIGS (sizes s, m, l, x,
# models/rtdetrv4/model.py INPUT_SIZES) with activation='silu'. Per size: backbone stage widths
# returned (enc_in_channels), use_lab, encoder hidden / feed-forward / expansion / depth_mult,
# decoder hidden / feed-forward / layers / points per level, reg_scale.
REF_SIZES = {
    "n": ((512, 1024), True, 128, 512, 0.34, 0.5, 128, 512, 3, (6, 6), 4.0),
    "s": ((256, 512, 1024), True, 256, 1024, 0.5, 0.34, 256, 1024, 3, (3, 6, 3), 4.0),
    "m": ((384, 768, 1536), True, 256, 1024, 1.0, 0.67, 256, 1024, 4, (3, 6, 3), 4.0),
    "l": ((512, 1024, 2048), False, 256, 1024, 1.0, 1.0, 256, 1024, 6, (3, 6, 3), 4.0),
    "x": ((512, 1024, 2048), False, 384, 2048, 1.0, 1.0, 256, 1024, 6, (3, 6, 3), 8.0),
}
REF_FAMILY_SIZES = {"deim": ("n", "s", "m", "l", "x"), "rtdetrv4": ("s", "m", "l", "x")}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_size_has_the_reference_layout(family):
    from libreyolo.models.dfine.network import SIZES

    fam = get_family(family)
    assert fam.sizes == REF_FAMILY_SIZES[family]
    for size in fam.sizes:
        in_ch, lab, hidden, ffn, expansion, depth, dec_hidden, dec_ffn, layers, points, reg_scale = REF_SIZES[size]
        with torch.device("meta"):
            net = fam.build(size, 80)
        sd = {k: tuple(v.shape) for k, v in net.state_dict().items()}
        where = f"{family}-{size}"
        for i, c in enumerate(in_ch):
            assert sd[f"encoder.input_proj.{i}.conv.weight"] == (hidden, c, 1, 1), where
        assert f"encoder.input_proj.{len(in_ch)}.conv.weight" not in sd, where
        assert ("backbone.stem.stem1.lab.scale" in sd) == lab, where
        assert sd["encoder.encoder.0.layers.0.linear1.weight"] == (ffn, hidden), where
        blocks = round(3 * depth)  # the reference: RepNCSPELAN4(..., round(expansion * hidden // 2), round(3 * depth))
        assert sum(k.startswith("encoder.fpn_blocks.0.cv2.0.bottlenecks.") and k.endswith("conv1.conv.weight")
                   for k in sd) == blocks, where
        assert sd["encoder.fpn_blocks.0.cv2.0.conv1.conv.weight"][0] == round(expansion * hidden // 2), where
        assert sum(k.endswith(".linear1.weight") and k.startswith("decoder.decoder.layers.") for k in sd) == layers
        assert sd["decoder.decoder.layers.0.linear1.weight"] == (dec_ffn, dec_hidden), where
        assert sd["decoder.decoder.layers.0.cross_attn.num_points_scale"] == (sum(points),), where
        assert sd["decoder.decoder.layers.0.cross_attn.sampling_offsets.weight"] == (8 * sum(points) * 2, dec_hidden)
        assert sd["decoder.enc_score_head.weight"] == (80, dec_hidden), where
        assert ("decoder.input_proj.0.conv.weight" in sd) == (hidden != dec_hidden), where
        assert SIZES[size].reg_scale == reg_scale, where
        # SiLU in the decoder at every size (the reference's activation / mlp_act)
        dec = net.decoder
        acts = [dec.query_pos_head.act, dec.enc_bbox_head.act, dec.pre_bbox_head.act,
                *(h.act for h in dec.dec_bbox_head), *(layer.act for layer in dec.decoder.layers),
                *(q.reg_conf.act for q in dec.decoder.lqe_layers)]
        assert all(a is F.silu for a in acts), where


def test_fixture_key_counts(compat_dir):
    """The fixtures' key lists equal ours exactly (names and shapes, in order)."""
    for d in _fixtures(compat_dir):
        s = schema(d)
        with torch.device("meta"):
            net = get_family(s["family"]).build(s["size"], s["nc"])
        ours = [(k, list(v.shape)) for k, v in net.state_dict().items()]
        assert ours == [(t["key"], t["shape"]) for t in s["tensors"]], d.name


@pytest.mark.parametrize(("family", "size"), [("deim", "n"), ("rtdetrv4", "s")])
def test_saved_checkpoint_roundtrips_by_name(family, size, tmp_path):
    from libreyolo import LibreYOLO

    fam = get_family(family)
    model = Model(fam, size, nc=3, names={0: "a", 1: "b", 2: "c"}, imgsz=640)
    path = Path(model.save(tmp_path / f"{fam.filename(size)}.pt"))
    assert path.name == {"deim": "LibreDEIMn.pt", "rtdetrv4": "LibreRTDETRv4s.pt"}[family]
    again = LibreYOLO(path)
    assert (again.family.name, again.size, again.nc) == (family, size, 3)
    # a bare state dict: the family and size come from the file name
    bare = tmp_path / "bare" / path.name
    bare.parent.mkdir()
    torch.save(model.net.state_dict(), bare)
    again = LibreYOLO(bare)
    assert (again.family.name, again.size) == (family, size)


def test_rtdetrv4_drops_the_distillation_projector_of_upstream_checkpoints(tmp_path):
    """Raw upstream RT-DETRv4 training checkpoints carry ``encoder.feature_projector.*`` (the
    projection to the distillation teacher's features); the detector has no such module, so
    loading an rtdetrv4 file drops those keys. Any other extra key is still refused, and D-FINE
    does not drop them."""
    from libreyolo import LibreYOLO

    fam = get_family("rtdetrv4")
    model = Model(fam, "s", nc=80, names={i: str(i) for i in range(80)}, imgsz=640)
    state = model.net.state_dict()
    projector = {"encoder.feature_projector.0.weight": torch.randn(768, 256),
                 "encoder.feature_projector.0.bias": torch.randn(768)}
    path = tmp_path / "LibreRTDETRv4s.pt"
    torch.save({"model": {**state, **projector}}, path)
    loaded = LibreYOLO(path)
    assert loaded.family.name == "rtdetrv4"
    got = loaded.net.state_dict()
    assert list(got) == list(state) and all(torch.equal(got[k], state[k]) for k in state)
    other = tmp_path / "other" / "LibreRTDETRv4s.pt"
    other.parent.mkdir()
    torch.save({"model": {**state, "encoder.projector_typo.weight": torch.zeros(2)}}, other)
    with pytest.raises(CheckpointError, match="unexpected: encoder.projector_typo.weight"):
        LibreYOLO(other)
    dfine = tmp_path / "LibreDFINEs.pt"
    torch.save({"model": {**state, **projector}}, dfine)
    with pytest.raises(CheckpointError, match="unexpected: encoder.feature_projector"):
        LibreYOLO(dfine)
    assert get_family("dfine").inference_state({**state, **projector}).keys() == {**state, **projector}.keys()
