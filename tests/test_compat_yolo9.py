"""Reference (libreyolo 1.6.0) checkpoints load here and compute the same numbers."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.checkpoint import read_checkpoint
from tests.compat_utils import assert_detections_match, assert_probe_parity, fixtures, model_from_fixture


def _yolo9_fixtures(compat_dir: Path) -> list[Path]:
    found = fixtures(compat_dir, family="yolo9")
    assert found, f"no yolo9 fixtures under {compat_dir / 'fixtures'}"
    return found


def test_every_yolo9_fixture_reproduces_probe_outputs(compat_dir, compat_fill):
    for d in _yolo9_fixtures(compat_dir):
        assert_probe_parity(model_from_fixture(d, compat_fill), d, compat_fill)


def test_every_yolo9_fixture_predict_matches_reference_as_sets(compat_dir, compat_fill):
    # strict bar: >= 99% of detections matched both ways (class, IoU >= 0.99, score within 1e-4);
    # the fixtures' scores are spread so the recorded set does not hinge on float noise
    for d in _yolo9_fixtures(compat_dir):
        model = model_from_fixture(d, compat_fill)
        call = str(np.load(d / "predict.npz")["call"])
        assert "conf=0.01" in call, call  # the recorded call; other arguments default
        r = model(str(compat_dir / "fixtures" / "sample.png"), conf=0.01)
        assert_detections_match(r, d)


def test_reference_checkpoint_file_loads_and_matches_fixture(compat_dir, compat_fill):
    path = compat_dir / "checkpoints" / "yolo9-t-seed0.pt"
    model = LibreYOLO(path)
    assert (model.family.name, model.size, model.nc, model.imgsz) == ("yolo9", "t", 80, 640)
    assert model.names[0] == "person"
    d = compat_dir / "fixtures" / "yolo9-t"
    schema = json.loads((d / "schema.json").read_text())
    recorded = np.load(d / "probes.npz")
    x = compat_fill.probes(schema["probe_size"], schema["seed"])["uniform"]
    with torch.no_grad():
        pred = model.net(x)["predictions"].numpy()
    assert np.abs(pred - recorded["output.uniform.predictions"]).max() <= 1e-4


def test_checkpoint_metadata_is_read_like_the_reference_writes_it(compat_dir):
    ckpt = read_checkpoint(compat_dir / "checkpoints" / "yolo9-t-seed0.pt")
    assert ckpt.meta["schema_version"] == "1.0"
    assert ckpt.meta.get("letterbox_pad") == "topleft"
    assert set(ckpt.names) == set(range(80))


@pytest.mark.parametrize("size", ["t", "s", "m", "c"])
def test_every_size_builds_and_roundtrips_its_state_dict(size, tmp_path):
    model = LibreYOLO(f"LibreYOLO9{size}.yaml")
    path = model.save(tmp_path / f"LibreYOLO9{size}.pt")
    again = LibreYOLO(path)
    for (k, a), (k2, b) in zip(model.net.state_dict().items(), again.net.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(a, b)
