"""Classifiers (vit, deit, and any family whose fixture says task "classify") match the reference.

Every classify fixture present under ``LIBREYOLO_COMPAT_DIR`` is a test case: raw probe outputs
within 1e-4, and ``predict()`` on ``sample.png`` with the recorded call: top-5 classes equal and
their probabilities within 1e-4. A fixture whose family is not implemented here is skipped with
that reason (never counted as a pass).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.errors import ArgumentError, CheckpointError
from libreyolo.models.registry import families
from libreyolo.ops.classify import ResizeCrop
from tests.compat_utils import assert_probe_parity, model_from_fixture

PROB_ATOL = 1e-4


def _classify_fixture_names() -> list[str]:
    root = os.environ.get("LIBREYOLO_COMPAT_DIR")
    folder = Path(root) / "fixtures" if root else None
    if folder is None or not folder.is_dir():
        return ["(no compat dir)"]
    names = [d.name for d in sorted(folder.iterdir())
             if (d / "schema.json").is_file() and json.loads((d / "schema.json").read_text())["task"] == "classify"]
    return names or ["(no classify fixtures)"]


@pytest.fixture(params=_classify_fixture_names())
def classify_fixture(request, compat_dir) -> Path:
    d = compat_dir / "fixtures" / request.param
    if not d.is_dir():
        pytest.skip(f"{request.param} under {compat_dir}")
    family = json.loads((d / "schema.json").read_text())["family"]
    if family not in families():
        pytest.skip(f"family {family!r} of fixture {d.name} is not implemented in this build")
    return d


def test_vit_and_deit_fixtures_are_present(compat_dir):
    names = _classify_fixture_names()
    assert any(n.startswith("vit-") for n in names) and any(n.startswith("deit-") for n in names), names


def test_classify_fixture_reproduces_probe_logits(classify_fixture, compat_fill):
    model = model_from_fixture(classify_fixture, compat_fill)
    assert model.family.task == "classify"
    assert_probe_parity(model, classify_fixture, compat_fill)


def test_classify_fixture_predict_gives_the_reference_top5(classify_fixture, compat_fill):
    d = classify_fixture
    ref = np.load(d / "predict.npz")
    call = str(ref["call"])
    assert re.fullmatch(r"predict\('sample\.png'\)", call), f"unexpected recorded call {call}; update the test"
    model = model_from_fixture(d, compat_fill)
    r = model(str(d.parent / "sample.png"))
    assert r.probs is not None and r.boxes is None
    assert r.probs.top5 == ref["top5"].tolist(), (d.name, r.probs.top5, ref["top5"].tolist())
    err = float(np.abs(r.probs.top5conf.numpy() - ref["top5conf"]).max())
    assert err <= PROB_ATOL, f"{d.name}: top-5 probabilities differ by {err:.3g} > {PROB_ATOL}"


# --- preprocessing: the reference's ImageNet recipe, on the device ------------------------------
def _pillow_resize_crop(arr: np.ndarray, size: int, crop_pct: float) -> np.ndarray:
    """Resize the shorter side to floor(size / crop_pct) with Pillow BICUBIC, centre-crop (torchvision rounding)."""
    from PIL import Image

    img = Image.fromarray(arr)
    w, h = img.size
    short = int(math.floor(size / crop_pct))
    nw, nh = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
    out = np.asarray(img.resize((nw, nh), Image.BICUBIC))
    top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
    return out[top:top + size, left:left + size]


@pytest.mark.parametrize("hw", [(480, 640), (640, 480), (100, 150), (224, 224), (249, 248), (37, 300)])
def test_resize_crop_is_bit_exact_against_pillow_bicubic(hw):
    arr = np.random.default_rng(hw[0] * 1000 + hw[1]).integers(0, 256, (*hw, 3), dtype=np.uint8)
    pre = ResizeCrop(224, crop_pct=0.9, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    batch, metas = pre([torch.from_numpy(arr).permute(2, 0, 1)])
    ours = (batch[0] * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    assert np.array_equal(ours, _pillow_resize_crop(arr, 224, 0.9))
    assert metas[0].orig_shape == hw


def test_resize_crop_normalises_with_the_family_mean_and_std():
    arr = np.full((300, 400, 3), 128, np.uint8)
    vit = LibreYOLO("LibreViTti-cls.yaml", nc=3).family.letterbox(224)
    deit = LibreYOLO("LibreDeiTt-cls.yaml", nc=3).family.letterbox(224)
    x = torch.from_numpy(arr).permute(2, 0, 1)
    torch.testing.assert_close(vit([x])[0][0, :, 0, 0], torch.full((3,), (128 / 255 - 0.5) / 0.5))
    expect = (torch.tensor(128 / 255) - torch.tensor([0.485, 0.456, 0.406])) / torch.tensor([0.229, 0.224, 0.225])
    torch.testing.assert_close(deit([x])[0][0, :, 0, 0], expect)


def test_fixed_position_embedding_refuses_other_sizes_with_a_clear_error():
    model = LibreYOLO("LibreViTti-cls.yaml", nc=3)
    with pytest.raises(ArgumentError, match="224x224 inputs only"):
        model.predict(np.zeros((64, 64, 3), np.uint8), imgsz=320)
    assert model.predict(np.zeros((64, 64, 3), np.uint8), imgsz=224).probs is not None


# --- state dicts of every size --------------------------------------------------------------------
# digest of "key:shape" lines of the reference's state dict (nc=1000), per family and size,
# taken from the reference library (black box: built and its state_dict listed) with
# tools/make_reference_fixture.py; ti/t also come from the shared fixtures' schema.json
REFERENCE_STATE = json.loads((Path(__file__).parent / "data" / "classify_reference_state.json").read_text())


def _state_digest(state: dict[str, torch.Tensor]) -> tuple[int, int, str]:
    lines = "\n".join(f"{k}:{list(v.shape)}" for k, v in state.items())
    return len(state), sum(v.numel() for v in state.values()), hashlib.sha256(lines.encode()).hexdigest()


@pytest.mark.parametrize("name", sorted(REFERENCE_STATE))
def test_every_size_has_the_reference_state_dict_keys_and_shapes(name):
    family, size = name.split("-")
    if family not in families():
        pytest.skip(f"family {family!r} is not implemented in this build")
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        net = families()[family].build(size, 1000)
    count, params, digest = _state_digest(net.state_dict())
    want = REFERENCE_STATE[name]
    assert (count, params) == (want["keys"], want["numel"]), (name, count, params, want)
    assert digest == want["sha256"], f"{name}: key names or order differ from the reference"


def test_fixture_schemas_list_exactly_our_keys_in_order(compat_dir):
    for d in sorted((compat_dir / "fixtures").iterdir()):
        schema_file = d / "schema.json"
        if not schema_file.is_file():
            continue
        schema = json.loads(schema_file.read_text())
        if schema["family"] not in ("vit", "deit"):
            continue
        net = families()[schema["family"]].build(schema["size"], schema["nc"])
        ours = [(k, list(v.shape)) for k, v in net.state_dict().items()]
        assert ours == [(t["key"], t["shape"]) for t in schema["tensors"]], d.name


def test_checkpoint_round_trip_keeps_weights_and_names(tmp_path):
    model = LibreYOLO("LibreDeiTt-cls.yaml", nc=4, names=["a", "b", "c", "d"])
    path = model.save(tmp_path / "LibreDeiTt-cls.pt")
    again = LibreYOLO(path)
    assert (again.family.name, again.size, again.nc, again.imgsz, again.names[3]) == ("deit", "t", 4, 224, "d")
    for (k, a), (_, b) in zip(model.net.state_dict().items(), again.net.state_dict().items(), strict=True):
        assert torch.equal(a, b), k


def test_file_names_follow_the_reference_pattern():
    from libreyolo.models.registry import family_from_filename

    assert [(f.name, s) for f, s in [family_from_filename("LibreViTti-cls"), family_from_filename("LibreDeiTb-cls")]] \
        == [("vit", "ti"), ("deit", "b")]
    assert family_from_filename("LibreViTx-cls") is None


def test_distilled_deit_state_dict_is_refused_with_what_to_do(tmp_path):
    model = LibreYOLO("LibreDeiTt-cls.yaml", nc=1000)
    state = dict(model.net.state_dict())
    state["dist_token"] = torch.zeros(1, 1, 192)
    state["head_dist.weight"], state["head_dist.bias"] = torch.zeros(1000, 192), torch.zeros(1000)
    path = tmp_path / "LibreDeiTt-cls.pt"
    torch.save({"model": state, "model_family": "deit", "size": "t", "task": "classify", "nc": 1000}, path)
    with pytest.raises(CheckpointError, match="distillation token"):
        LibreYOLO(path)



def _frames(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [torch.from_numpy(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in shapes]


@pytest.fixture(params=[True, False], ids=["runs-batched", "one-by-one"])
def batched_runs(request, monkeypatch):
    """Both ways ResizeCrop may run same-size images (batched is CUDA's default, one by one the CPU's)."""
    from libreyolo.ops import classify

    monkeypatch.setattr(classify, "_runs_batched", lambda device: request.param)
    return request.param


@pytest.mark.parametrize("floating", [False, True])
def test_resize_crop_of_runs_gives_each_image_its_own_numbers(floating, batched_runs):
    """Consecutive same-size images resized as one batch get the numbers of one image at a time."""
    pre = ResizeCrop(64, crop_pct=0.875)
    imgs = [f.permute(2, 0, 1) for f in _frames([(120, 90), (120, 90), (120, 90), (70, 130), (120, 90), (64, 64)])]
    if floating:
        imgs = [x.float() / 255 for x in imgs]
    imgs.insert(2, imgs[1].float() / 255 if not floating else (imgs[1] * 255).round().to(torch.uint8))  # other dtype
    batch, metas = pre(imgs)
    for i, img in enumerate(imgs):
        alone, meta = pre([img])
        assert torch.equal(batch[i], alone[0]), i
        assert metas[i] == meta[0]


@pytest.mark.parametrize("bgr", [False, True])
def test_resize_crop_place_batch_equals_the_per_image_path(bgr, batched_runs):
    pre = ResizeCrop(64, crop_pct=0.9, mean=(0.5, 0.4, 0.3), std=(0.2, 0.3, 0.4))
    frames = torch.stack(_frames([(96, 128)] * 3, seed=1))  # (B, H, W, 3) as uploaded
    chw = [(f.flip(-1) if bgr else f).permute(2, 0, 1) for f in frames]
    expect, metas = pre(chw)
    assert torch.equal(pre.place_batch(frames, bgr), expect)
    assert pre.metas_for(96, 128, 3) == metas
    half = pre.place_batch(frames, bgr, torch.float16)
    assert half.dtype == torch.float16 and torch.equal(half, pre(chw, dtype=torch.float16)[0])


def test_resize_crop_makes_its_device_taps_once_per_geometry(batched_runs):
    """The taps and constants reach the device once per geometry, not once per image and pass."""
    from libreyolo.ops import classify

    pre = ResizeCrop(48, crop_pct=0.8)
    imgs = [f.permute(2, 0, 1) for f in _frames([(77, 101)] * 2, seed=2)]
    pre(imgs)
    taps, consts = classify._device_taps.cache_info(), classify._mean_std.cache_info()
    pre(imgs)
    pre([imgs[0]])
    taps2, consts2 = classify._device_taps.cache_info(), classify._mean_std.cache_info()
    assert (taps2.misses, consts2.misses) == (taps.misses, consts.misses)
    runs = 2 if batched_runs else 3  # (the two images as one run, then one image) or one by one
    assert taps2.hits == taps.hits + 2 * runs and consts2.hits == consts.hits + runs  # two passes a run
