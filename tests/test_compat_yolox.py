"""Reference (libreyolo 1.6.0) YOLOX checkpoints load here and compute the same numbers.

Fixture tests pick up every ``yolox-*`` fixture under ``LIBREYOLO_COMPAT_DIR``. The per-size
tests need no fixture: ``tests/data/yolox_reference_*`` hold the reference's state-dict layout
and outputs for every size (written by ``tools/yolox_reference_data.py``).
"""
from __future__ import annotations

import ast
import hashlib
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.models.registry import family_from_filename, get_family
from libreyolo.models.yolox import YOLOX
from tests.compat_utils import (
    assert_detections_match,
    assert_probe_parity,
    fixtures,
    model_from_fixture,
    schema,
)

DATA = Path(__file__).parent / "data"
SIZES = ("n", "t", "s", "m", "l", "x")


def _yolox_fixtures(compat_dir: Path) -> list[Path]:
    found = fixtures(compat_dir, family="yolox")
    assert found, f"no yolox fixtures under {compat_dir / 'fixtures'}"
    return found


def _call_kwargs(call: str) -> dict:
    """The keyword arguments of the recorded ``predict('sample.png', k=v, ...)`` call."""
    inner = call[call.index("(") + 1:call.index(")")]
    return {k: ast.literal_eval(v) for k, v in re.findall(r"(\w+)\s*=\s*([^,]+)", inner)}


def _predict_like_the_fixture(model, compat_dir: Path, d: Path):
    call = str(np.load(d / "predict.npz")["call"])
    kwargs = _call_kwargs(call)
    assert kwargs, f"{d.name}: cannot read the recorded call {call!r}"
    return model(str(compat_dir / "fixtures" / "sample.png"), **kwargs)


def test_every_yolox_fixture_reproduces_probe_outputs(compat_dir, compat_fill):
    for d in _yolox_fixtures(compat_dir):
        assert_probe_parity(model_from_fixture(d, compat_fill), d, compat_fill)


def test_every_yolox_fixture_predict_matches_reference_as_sets(compat_dir, compat_fill):
    # >= 99% of detections matched both ways: same class, IoU >= 0.99, score within 1e-4
    for d in _yolox_fixtures(compat_dir):
        model = model_from_fixture(d, compat_fill)
        assert model.imgsz == json.loads((d / "meta.json").read_text())["imgsz"]
        assert_detections_match(_predict_like_the_fixture(model, compat_dir, d), d)


def test_reference_checkpoint_file_loads_and_matches_the_fixture(compat_dir, compat_fill):
    path = compat_dir / "checkpoints" / "yolox-n-seed0.pt"
    d = compat_dir / "fixtures" / "yolox-n"
    if not path.is_file() or not d.is_dir():
        pytest.skip(f"{path.name} or the yolox-n fixture is not in {compat_dir}")
    model = LibreYOLO(path)
    assert (model.family.name, model.size, model.nc, model.imgsz) == ("yolox", "n", 80, 416)
    assert model.names[0] == "person"
    filled = compat_fill.fill(d)
    assert all(torch.equal(filled[k], v) for k, v in model.net.state_dict().items())
    assert_probe_parity(model, d, compat_fill)
    assert_detections_match(_predict_like_the_fixture(model, compat_dir, d), d)


@pytest.mark.parametrize("size", SIZES)
def test_every_size_has_the_reference_state_dict_layout(size):
    expected = json.loads((DATA / "yolox_reference_state.json").read_text())[size]
    with torch.device("meta"):
        sd = YOLOX(size, 80).state_dict()
    lines = "\n".join(f"{k}:{list(v.shape)}" for k, v in sd.items())
    assert len(sd) == expected["keys"]
    assert sum(v.numel() for v in sd.values()) == expected["numel"]
    assert hashlib.sha256(lines.encode()).hexdigest() == expected["sha256"], f"yolox-{size}: key names/shapes/order"


def _filled(net: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """The compat fixtures' fill rule (fill.py docstring), in sorted key order."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for key, t in sorted(net.state_dict().items()):
        shape = list(t.shape)
        if key.endswith("num_batches_tracked"):
            out[key] = torch.zeros_like(t)
        elif key.endswith("running_var"):
            out[key] = torch.rand(shape, generator=g) * 0.5 + 0.75
        elif key.endswith("running_mean"):
            out[key] = torch.randn(shape, generator=g) * 0.1
        elif len(shape) >= 2:
            out[key] = torch.randn(shape, generator=g) / math.sqrt(max(1, math.prod(shape) // max(1, shape[0])))
        elif key.endswith("weight"):
            out[key] = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            out[key] = 0.1 * torch.randn(shape, generator=g)
    return out


@pytest.mark.parametrize("size", SIZES)
def test_every_size_reproduces_the_reference_outputs(size):
    """Same filled weights, same 0..255 input: the reference's three level maps.

    Compared at 1e-3 (+1e-3 relative): the larger random-weight networks amplify float rounding,
    which differs between machines; a structural difference (a shortcut, a depthwise conv, the
    Focus channel order) moves these maps by O(1).
    """
    ref = np.load(DATA / "yolox_reference_outputs.npz")
    with torch.device("meta"):
        net = YOLOX(size, 80)
    net.load_state_dict(_filled(net, 5), assign=True)
    net.eval()
    with torch.no_grad():
        levels = net(torch.from_numpy(ref["input"]))
    assert len(levels) == 3
    for i, level in enumerate(levels):
        want = torch.from_numpy(ref[f"{size}.{i}"])
        assert level.shape == want.shape
        err = (level - want).abs()
        assert bool((err <= 1e-3 + 1e-3 * want.abs()).all()), f"yolox-{size} level {i}: max abs error {err.max():.3g}"


def test_file_names_and_yaml_names_select_yolox():
    fam = get_family("yolox")
    for size in SIZES:
        found = family_from_filename(f"LibreYOLOX{size}")
        assert found is not None and found[0] is fam and found[1] == size
        assert fam.filename(size) == f"LibreYOLOX{size}"
    assert family_from_filename("LibreYOLOXq") is None
    model = LibreYOLO("LibreYOLOXs.yaml")
    assert (model.family.name, model.size, model.imgsz) == ("yolox", "s", 640)
    assert LibreYOLO("LibreYOLOXn.yaml").imgsz == 416  # the reference's default size for n and t


def test_a_saved_checkpoint_loads_back_key_for_key(tmp_path):
    model = LibreYOLO("LibreYOLOXn.yaml", nc=3, names=["a", "b", "c"])
    path = model.save(tmp_path / "LibreYOLOXn.pt")
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["model_family"] == "yolox" and ckpt["size"] == "n" and ckpt["imgsz"] == 416
    again = LibreYOLO(path)
    assert again.nc == 3 and again.names == {0: "a", 1: "b", 2: "c"}
    for (k, a), (k2, b) in zip(model.net.state_dict().items(), again.net.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(a, b)


def test_a_checkpoint_whose_class_head_disagrees_with_nc_is_refused(tmp_path):
    from libreyolo.errors import CheckpointError

    model = LibreYOLO("LibreYOLOXn.yaml", nc=3, names=["a", "b", "c"])
    state = model.net.state_dict()
    path = tmp_path / "bad.pt"
    torch.save({"model": state, "model_family": "yolox", "size": "n", "nc": 80, "imgsz": 416}, path)
    with pytest.raises(CheckpointError, match="head.cls_preds.0.bias"):
        LibreYOLO(path)


def test_fixture_schema_has_the_reference_layout(compat_dir):
    # a fixture from the reference states every key and shape: ours must list the same, in order
    for d in _yolox_fixtures(compat_dir):
        s = schema(d)
        with torch.device("meta"):
            ours = YOLOX(s["size"], s["nc"]).state_dict()
        assert [(t["key"], t["shape"]) for t in s["tensors"]] == [(k, list(v.shape)) for k, v in ours.items()]
