"""Reference (libreyolo 1.6.0) RTMDet checkpoints load here and compute the same numbers.

Fixture tests pick up every ``rtmdet-*`` fixture under ``LIBREYOLO_COMPAT_DIR``. The per-size
tests need no fixture: they check the layout every size must have (the reference's width and
depth multipliers, the cross-level shared convs) on the meta device.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.models.registry import family_from_filename, get_family
from libreyolo.models.rtmdet import RTMDet
from tests.compat_utils import (
    assert_detections_match,
    assert_probe_parity,
    fixtures,
    model_from_fixture,
    schema,
)

SIZES = ("t", "s", "m", "l", "x")
# the reference's per-size table: first stem conv's output channels (64 * width // 2), neck width,
# and CSP blocks per backbone stage and per neck block (max(round(n * depth), 1))
LAYOUT = {"t": (12, 96, (1, 1, 1, 1), 1), "s": (16, 128, (1, 2, 2, 1), 1), "m": (24, 192, (2, 4, 4, 2), 2),
          "l": (32, 256, (3, 6, 6, 3), 3), "x": (40, 320, (4, 8, 8, 4), 4)}


def _rtmdet_fixtures(compat_dir: Path) -> list[Path]:
    found = fixtures(compat_dir, family="rtmdet")
    assert found, f"no rtmdet fixtures under {compat_dir / 'fixtures'}"
    return found


def _predict_like_the_fixture(model, compat_dir: Path, d: Path):
    call = str(np.load(d / "predict.npz")["call"])
    inner = call[call.index("(") + 1:call.index(")")]
    kwargs = {k: ast.literal_eval(v) for k, v in re.findall(r"(\w+)\s*=\s*([^,]+)", inner)}
    assert kwargs, f"{d.name}: cannot read the recorded call {call!r}"
    return model(str(compat_dir / "fixtures" / "sample.png"), **kwargs)


def _meta_state(size: str, nc: int = 80) -> dict[str, torch.Tensor]:
    with torch.device("meta"):
        return RTMDet(size, nc).state_dict()


def test_every_rtmdet_fixture_reproduces_probe_outputs(compat_dir, compat_fill):
    for d in _rtmdet_fixtures(compat_dir):
        assert_probe_parity(model_from_fixture(d, compat_fill), d, compat_fill)


def test_every_rtmdet_fixture_predict_matches_reference_as_sets(compat_dir, compat_fill):
    # >= 99% of detections matched both ways: same class, IoU >= 0.99, score within 1e-4
    for d in _rtmdet_fixtures(compat_dir):
        model = model_from_fixture(d, compat_fill)
        assert model.imgsz == json.loads((d / "meta.json").read_text())["imgsz"]
        assert_detections_match(_predict_like_the_fixture(model, compat_dir, d), d)


def test_fixture_schema_has_the_reference_layout(compat_dir):
    # every key and shape the reference lists, in its order, shared-conv aliases included
    for d in _rtmdet_fixtures(compat_dir):
        s = schema(d)
        ours = _meta_state(s["size"], s["nc"])
        assert [(t["key"], t["shape"]) for t in s["tensors"]] == [(k, list(v.shape)) for k, v in ours.items()]


def test_a_wrong_distance_mapping_fails_probe_parity(compat_dir, compat_fill):
    # the parity bar has power: exp() on the box distances (the m/l/x rule) applied to a t model
    d = _rtmdet_fixtures(compat_dir)[0]
    model = model_from_fixture(d, compat_fill)
    model.net.head.exp_distances = not model.net.head.exp_distances
    with pytest.raises(AssertionError, match="max abs error"):
        assert_probe_parity(model, d, compat_fill)


def test_rgb_input_instead_of_bgr_fails_the_predict_match(compat_dir, compat_fill):
    import dataclasses

    d = _rtmdet_fixtures(compat_dir)[0]
    model = model_from_fixture(d, compat_fill)
    family = model.family
    rgb = dataclasses.replace(family.letterbox(model.imgsz), channels="RGB")
    original = type(family).letterbox
    type(family).letterbox = lambda self, imgsz: rgb
    try:
        result = _predict_like_the_fixture(model, compat_dir, d)
    finally:
        type(family).letterbox = original
    with pytest.raises(AssertionError, match="matched"):
        assert_detections_match(result, d)


def test_saved_checkpoint_is_in_the_reference_format(compat_dir, compat_fill, tmp_path):
    d = _rtmdet_fixtures(compat_dir)[0]
    model = model_from_fixture(d, compat_fill)
    path = model.save(tmp_path / "LibreRTMDett.pt")
    ckpt = torch.load(path, weights_only=True)
    meta = json.loads((d / "meta.json").read_text())
    assert set(meta) <= set(ckpt), f"missing metadata: {set(meta) - set(ckpt)}"
    assert (ckpt["model_family"], ckpt["size"], ckpt["task"], ckpt["nc"], ckpt["imgsz"]) == ("rtmdet", "t", "detect",
                                                                                          80, 640)
    filled = compat_fill.fill(d)
    # every key in the reference's order, the shared-conv aliases included, as its save() writes them
    assert list(ckpt["model"]) == [t["key"] for t in schema(d)["tensors"]]
    assert set(ckpt["model"]) == set(filled)
    assert all(torch.equal(ckpt["model"][k], v) for k, v in filled.items())
    again = LibreYOLO(path)
    assert again.names[0] == "person"
    assert_probe_parity(again, d, compat_fill)


@pytest.mark.parametrize("size", SIZES)
def test_every_size_builds_with_the_reference_layout(size):
    stem, width, stage_blocks, neck_blocks = LAYOUT[size]
    sd = _meta_state(size)
    assert sd["backbone.stem.0.conv.weight"].shape[0] == stem
    assert sd["head.rtm_cls.0.weight"].shape == (80, width, 1, 1)
    for i, n in enumerate(stage_blocks, 1):
        blocks = {k.split(".")[4] for k in sd if k.startswith(f"backbone.stage{i}.") and ".blocks." in k}
        assert len(blocks) == n, f"rtmdet-{size} stage{i}: {len(blocks)} blocks, want {n}"
    neck = {k.split(".")[4] for k in sd if k.startswith("neck.top_down_blocks.0.blocks.")}
    assert len(neck) == neck_blocks
    # the three levels' tower convs are one module, named under every level
    for tower in ("cls_convs", "reg_convs"):
        for i in range(2):
            assert all(f"head.{tower}.{lv}.{i}.conv.weight" in sd for lv in range(3))
    assert get_family("rtmdet").state_nc(sd) == 80


def test_every_size_has_the_same_key_names_up_to_block_counts():
    def pattern(size: str) -> set[str]:
        return {re.sub(r"\.blocks\.\d+\.", ".blocks.*.", k) for k in _meta_state(size)}

    t = pattern("t")
    assert all(pattern(size) == t for size in SIZES[1:])


def test_head_convs_are_shared_across_levels_with_per_level_norms():
    head = RTMDet("t", 3).head
    for tower in (head.cls_convs, head.reg_convs):
        for level in tower[1:]:
            for i, layer in enumerate(level):
                assert layer.conv is tower[0][i].conv
                assert layer.bn is not tower[0][i].bn
    assert len(list(head.parameters())) < len(head.state_dict())


def test_a_state_dict_with_level0_convs_only_loads_strictly():
    # mmdetection-converted files store the shared convs once, under level 0
    src = RTMDet("t", 3)
    state = {k: v for k, v in src.state_dict().items()
             if not re.match(r"head\.(cls|reg)_convs\.[12]\.\d+\.conv\.", k)}
    net = RTMDet("t", 3)
    net.load_state_dict(state, strict=True)
    for k, v in src.state_dict().items():
        assert torch.equal(net.state_dict()[k], v), k


def test_file_names_select_rtmdet():
    fam = get_family("rtmdet")
    for size in SIZES:
        found = family_from_filename(f"LibreRTMDet{size}")
        assert found is not None and found[0] is fam and found[1] == size
        assert fam.filename(size) == f"LibreRTMDet{size}"
    assert family_from_filename("LibreRTMDetn") is None
    model = LibreYOLO("LibreRTMDett.yaml")
    assert (model.family.name, model.size, model.imgsz) == ("rtmdet", "t", 640)


def test_normalisation_constants_are_the_float32_values_of_the_recipe():
    """The per-channel mean and std are made on the device by fills (no host copy), with the float32
    values a host tensor of the recipe's numbers holds: the normalised input is unchanged."""
    from libreyolo.models.rtmdet.family import BGR_MEAN, BGR_STD, _channels

    for values in (BGR_MEAN, BGR_STD):
        assert torch.equal(_channels(values, torch.device("cpu")),
                           torch.tensor(values, dtype=torch.float32).view(1, 3, 1, 1))
    batch = torch.randint(0, 256, (2, 3, 8, 8)).to(torch.float16)
    pre = get_family("rtmdet").letterbox(64)
    want = (batch.float() - torch.tensor(BGR_MEAN).view(1, 3, 1, 1)) / torch.tensor(BGR_STD).view(1, 3, 1, 1)
    assert torch.equal(pre.normalize(batch), want)
