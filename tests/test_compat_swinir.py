"""SwinIR (restore) matches the reference: checkpoints load strictly, key for key, and compute its images.

The swinir-s fixture under ``LIBREYOLO_COMPAT_DIR`` is written as a reference-format checkpoint
(filled state dict + ``meta.json``), read back by ``LibreYOLO(path)``, and the network's eval output
on each probe (the 4x image before clamping) must be within 1e-4 of ``probes.npz``. The restore
task's behaviour (any input size, exact output size, no options) needs only the fixture's weights.
Inputs stay tiny (48-131 px): SwinIR is heavy on a CPU.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.errors import ArgumentError
from libreyolo.models.registry import families, family_from_filename
from tests.compat_utils import RAW_ATOL, assert_probe_parity, schema


@pytest.fixture(scope="module")
def swinir_dir(compat_dir) -> Path:
    d = compat_dir / "fixtures" / "swinir-s"
    if not d.is_dir():
        pytest.skip(f"no swinir-s fixture under {compat_dir}")
    return d


def _save_reference_checkpoint(path: Path, state: dict[str, torch.Tensor], meta: dict) -> Path:
    """A flat dict as the reference's ``save()`` writes it (``names`` keys back to ints)."""
    meta = {**meta, "names": {int(k): v for k, v in meta["names"].items()}}
    torch.save({"model": state, **meta}, path)
    return path


@pytest.fixture(scope="module")
def swinir_model(swinir_dir, compat_fill, tmp_path_factory):
    meta = json.loads((swinir_dir / "meta.json").read_text())
    path = tmp_path_factory.mktemp("swinir") / "LibreSwinIRs.pt"
    return LibreYOLO(_save_reference_checkpoint(path, compat_fill.fill(swinir_dir), meta))


def test_fixture_schema_lists_exactly_our_keys_and_shapes_in_order(swinir_dir):
    s = schema(swinir_dir)
    with torch.device("meta"):
        net = families()["swinir"].build(s["size"], s["nc"])
    assert [(k, list(v.shape)) for k, v in net.state_dict().items()] == [(t["key"], t["shape"]) for t in s["tensors"]]


def test_fixture_loads_through_the_checkpoint_loader_with_its_metadata(swinir_model, swinir_dir, compat_fill):
    meta = json.loads((swinir_dir / "meta.json").read_text())
    assert (swinir_model.family.name, swinir_model.task, swinir_model.size) == ("swinir", "restore", "s")
    assert (swinir_model.nc, swinir_model.names, swinir_model.imgsz) == (1, {0: "image"}, meta["imgsz"])
    state = compat_fill.fill(swinir_dir)
    for key, value in swinir_model.net.state_dict().items():
        assert torch.equal(value, state[key]), key


def test_fixture_reproduces_probe_images(swinir_model, swinir_dir, compat_fill):
    assert_probe_parity(swinir_model, swinir_dir, compat_fill)


def test_the_parity_bar_catches_a_wrong_model(swinir_model, swinir_dir, compat_fill):
    """One shift mask of the 64 x 64 build size is not used at 48 px, so perturb a weight that is:
    a relative 1e-3 on one attention projection must already break the 1e-4 bar."""
    import copy

    wrong = copy.deepcopy(swinir_model)
    with torch.no_grad():
        w = wrong.net.layers[2].residual_group.blocks[3].attn.proj.weight
        w.mul_(1.001)
    with pytest.raises(AssertionError, match="max abs error"):
        assert_probe_parity(wrong, swinir_dir, compat_fill)


def test_predict_restores_any_size_to_exactly_four_times_it(swinir_model):
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (97, 131, 3), dtype=np.uint8)
    r = swinir_model.predict(image, color_format="rgb")
    assert r.restored.data.dtype == torch.uint8
    assert tuple(r.restored.data.shape) == (388, 524, 3)
    assert len(r) == 1 and r.verbose() == "restored 4x: 388x524"
    assert r.summary() == [{"scale": 4, "input": {"height": 97, "width": 131},
                            "output": {"height": 388, "width": 524}}]


def test_predict_equals_the_network_output_rounded(swinir_model):
    """Padding, crop and quantisation: predict() is the network's image clamped, x255, rounded."""
    x = torch.rand(3, 21, 30, generator=torch.Generator().manual_seed(1))
    r = swinir_model.predict(x)
    with torch.no_grad():
        raw = swinir_model.net(x.unsqueeze(0))[0]
    want = raw.clamp(0, 1).mul(255).round().to(torch.uint8).permute(1, 2, 0)
    assert tuple(want.shape) == (84, 120, 3)
    assert torch.equal(r.restored.data, want)


def test_conf_is_a_clear_error_for_restoration(swinir_model):
    with pytest.raises(ArgumentError, match="restoration takes no predict options.*'conf'"):
        swinir_model.predict(torch.rand(3, 16, 16), conf=0.3)


def test_plot_is_side_by_side_and_save_writes_the_restored_image(swinir_model, tmp_path):
    from PIL import Image

    r = swinir_model.predict(torch.rand(3, 16, 24))
    assert r.plot().size == (2 * 96, 64)
    saved = r.save(tmp_path / "x.png")
    assert Image.open(saved).size == (192, 64)
    restored = Image.open(tmp_path / "x_restored.png")
    assert np.array_equal(np.asarray(restored), r.restored.numpy())


def test_match_images_allows_one_grey_level_and_reports_psnr():
    from libreyolo.export.match_images import match_images

    a = torch.full((4, 4, 3), 100, dtype=torch.uint8)
    one, two = a.clone(), a.clone()
    one[0, 0, 0], two[0, 0, 0] = 101, 102
    assert match_images({"image": a}, {"image": a})["passed"]
    ok = match_images({"image": a}, {"image": one})
    assert ok["passed"] and ok["max_grey_diff"] == 1 and 50 < ok["psnr"] < 70
    bad = match_images({"image": a}, {"image": two})
    assert not bad["passed"] and bad["max_grey_diff"] == 2
    assert not match_images({"image": a}, {"image": a[:2]})["passed"]


@pytest.mark.parametrize("size", ["s", "m", "l"])
def test_reference_file_names_give_the_size(size):
    fam, got = family_from_filename(f"LibreSwinIR{size}")
    assert (fam.name, got, fam.filename(size)) == ("swinir", size, f"LibreSwinIR{size}")


def test_probe_error_is_small(swinir_model, swinir_dir, compat_fill):
    """The measured error is far below the bar (float32 noise, ~1e-5 or less)."""
    s = schema(swinir_dir)
    recorded = np.load(swinir_dir / "probes.npz")
    x = compat_fill.probes(s["probe_size"], s["seed"])["uniform"]
    with torch.no_grad():
        err = float(np.abs(swinir_model.net(x).numpy() - recorded["output.uniform"]).max())
    assert err < RAW_ATOL / 5, err
