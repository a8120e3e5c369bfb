"""model.quantize(): calibration, simulated INT8/FP8 predict, dequantize, quantized checkpoints, CLI."""
from __future__ import annotations

import fnmatch

import numpy as np
import pytest
import torch
from torch import nn

from libreyolo import LibreYOLO
from libreyolo.errors import ArgumentError, DatasetError
from libreyolo.ops.boxes import box_iou
from libreyolo.quant.calibrate import entropy_threshold
from libreyolo.quant.simulate import QuantConv2d, QuantLinear
from libreyolo.train.shapes import make_shapes_dataset, sample_image

IMGSZ = 128
DEMO = "LibreYOLO9t-shapes.pt"


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """One intra-op thread: on shared, busy cores two spinning threads made each forward ~30x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    return str(make_shapes_dataset(tmp_path_factory.mktemp("calib"), n_train=4, n_val=2, imgsz=IMGSZ, seed=3))


@pytest.fixture(scope="module")
def images() -> list:
    return [sample_image(seed=s, imgsz=IMGSZ) for s in range(3)]


def _detector() -> object:
    model = LibreYOLO(DEMO)
    model.imgsz = IMGSZ
    return model


def _raw(model, images) -> dict[str, torch.Tensor]:
    """The network's named outputs for the images, preprocessed as predict() does."""
    tensors = [torch.from_numpy(np.array(im)).permute(2, 0, 1) for im in images]
    batch, _ = model.family.letterbox(model.imgsz)(tensors, dtype=torch.float32)
    return model._forward(batch)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _kept(before, after) -> float:
    """Share of the float detections found again (same class, IoU > 0.5) after quantization."""
    total = found = 0
    for a, b in zip(before, after, strict=True):
        total += len(a.boxes)
        if len(a.boxes) and len(b.boxes):
            iou = box_iou(a.boxes.xyxy, b.boxes.xyxy)
            same = a.boxes.cls[:, None] == b.boxes.cls[None, :]
            found += int(((iou > 0.5) & same).any(1).sum())
    return found / max(total, 1)


# --- the entropy threshold on known distributions ---------------------------------------------
def _literal_entropy_threshold(h: np.ndarray, w: float, levels: int = 128) -> float:
    """TensorRT's calibrator written out candidate by candidate (the definition the fast one must meet)."""
    best = (np.inf, None)
    for i in range(levels, len(h) + 1):
        p = h[:i].astype(np.float64)
        p[i - 1] += h[i:].sum()
        group = np.digitize(np.arange(i), np.linspace(0, i, levels + 1)) - 1
        group[h[:i] == 0] = -1
        q = np.zeros(i)
        for g in range(levels):
            sel = group == g
            if sel.any():
                q[sel] = h[:i][sel].sum() / sel.sum()
        p, q = p / p.sum(), q / q.sum()
        m = p > 0
        kl = np.inf if (q[m] == 0).any() else float((p[m] * np.log(p[m] / q[m])).sum())
        if kl <= best[0]:
            best = (kl, i)
    return best[1] * w


def test_entropy_threshold_equals_the_literal_tensorrt_calibrator():
    x = np.abs(np.random.default_rng(0).laplace(size=100_000))
    h, _ = np.histogram(x, 384, (0, x.max()))
    w = x.max() / 384
    assert entropy_threshold(h, w) == pytest.approx(_literal_entropy_threshold(h, w), rel=1e-12)


def test_entropy_threshold_clips_the_laplace_tail_only():
    x = np.abs(np.random.default_rng(0).laplace(size=200_000))
    h, _ = np.histogram(x, 2048, (0, x.max()))
    t = entropy_threshold(h, x.max() / 2048)
    # measured 0.74-0.83 of the largest sample over seeds 0-4; the 99.9th percentile is ~0.52 of it
    assert np.quantile(x, 0.999) < t < 0.95 * x.max()


def test_entropy_threshold_keeps_a_uniform_range_whole():
    x = np.random.default_rng(2).uniform(0, 3, 200_000)
    h, _ = np.histogram(x, 2048, (0, 3))
    assert entropy_threshold(h, 3 / 2048) == pytest.approx(3.0)


# --- quantize / predict / dequantize --------------------------------------------------------------
@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy"])
def test_quantized_predict_differs_from_float_but_keeps_detections(data, images, method):
    model = _detector()
    float_raw, float_res = _raw(model, images), model.predict(images, imgsz=IMGSZ)
    model.quantize(data=data, samples=4, method=method)
    quant_raw = _raw(model, images)
    assert not torch.equal(float_raw["predictions"], quant_raw["predictions"])
    assert sum(len(r.boxes) for r in float_res) >= 3
    assert _kept(float_res, model.predict(images, imgsz=IMGSZ)) >= 0.75
    info = model.quant_info()
    assert (info["recipe"], info["method"], info["samples"]) == ("int8", method, 4)


def test_dequantize_restores_bit_exact_float_outputs(data, images):
    model = _detector()
    before = _raw(model, images)
    model.quantize(data=data, samples=2)
    assert not _same(before, _raw(model, images))
    model.dequantize()
    assert _same(before, _raw(model, images))
    assert model.quant_info() is None
    assert not any(isinstance(m, (QuantConv2d, QuantLinear)) for m in model.net.modules())


def test_fp8_recipe_simulates_and_differs_from_int8(data, images):
    model = _detector()
    int8 = _raw(model.quantize(data=data, samples=2), images)
    fp8 = _raw(model.quantize(recipe="fp8", data=data, samples=2), images)
    assert model.quant_info()["recipe"] == "fp8"
    assert not torch.equal(int8["predictions"], fp8["predictions"])


def test_excluded_layers_are_the_family_declared_ones(data):
    model = _detector().quantize(data=data, samples=2)
    info = model.quant_info()
    layers = [n for n, m in model.net.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    declared = sorted(n for n in layers if any(fnmatch.fnmatchcase(n, p) for p in model.family.quant_exclude))
    assert sorted(info["excluded"]) == declared == sorted(f"head.cv{b}.{i}.2" for b in (2, 3) for i in range(3))
    assert info["count"] == len(info["layers"]) == len(layers) - len(declared)
    assert all(isinstance(model.net.get_submodule(n), QuantConv2d) for n in info["layers"])


def test_exclude_patterns_add_to_the_family_defaults(data):
    model = _detector().quantize(data=data, samples=2, exclude=["neck.*"])
    excluded = model.quant_info()["excluded"]
    assert any(n.startswith("neck.") for n in excluded)
    assert all(excluded[n] == "exclude= pattern 'neck.*'" for n in excluded if n.startswith("neck."))
    assert not any(n.startswith("neck.") for n in model.quant_info()["layers"])


def test_quantize_retires_the_inference_copies(data, images):
    model = _detector()
    _raw(model, images)
    old = model.inference_copy()
    model.quantize(data=data, samples=2)
    new = model.inference_copy()
    assert new is not old
    assert any(isinstance(m, QuantConv2d) for m in new.module.modules())
    model.dequantize()
    assert not any(isinstance(m, QuantConv2d) for m in model.inference_copy().module.modules())


@pytest.mark.parametrize(("arch", "recipe"), [("LibreYOLOXn.yaml", "int8"), ("LibreDeiTt-cls.yaml", "fp8")])
def test_untrained_yolox_and_classifier_quantize_and_predict(data, images, arch, recipe):
    model = LibreYOLO(arch)
    if model.family.fixed_imgsz is None:
        model.imgsz = 64
    before = _raw(model, images[:1])
    model.quantize(recipe=recipe, data=data, samples=2)
    after = _raw(model, images[:1])
    assert not _same(before, after)
    assert model.predict(images[0], imgsz=model.imgsz) is not None
    excluded = model.quant_info()["excluded"]
    assert excluded and all(r.startswith("family default") for r in excluded.values())


# --- checkpoints ------------------------------------------------------------------------------------
def test_quantized_checkpoint_round_trip_is_bit_exact_and_float_readable(data, images, tmp_path):
    model = _detector().quantize(data=data, samples=2, method="percentile")
    expected = _raw(model, images)
    path = model.save(tmp_path / "q.pt")
    ckpt = torch.load(path, weights_only=True)
    entry = ckpt["quantization"]
    assert entry["schema"] == 1 and entry["recipe"] == "int8" and entry["method"] == "percentile"
    assert set(entry["layers"]) == set(model.quant_info()["layers"])
    assert ckpt["model"].keys() == model.net.state_dict().keys()
    assert all(torch.equal(ckpt["model"][k], v) for k, v in model.net.state_dict().items())  # float weights
    loaded = LibreYOLO(path)
    loaded.imgsz = IMGSZ
    assert loaded.quant_info()["layers"] == model.quant_info()["layers"]
    assert _same(expected, _raw(loaded, images))
    assert _same(_raw(model.dequantize(), images), _raw(loaded.dequantize(), images))


def test_quantized_model_export_without_data_names_data_or_dequantize(data):
    model = _detector().quantize(data=data, samples=2)
    with pytest.raises(ArgumentError, match=r"needs data=.*dequantize\(\)"):
        model.export("onnx")


# --- mistakes ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "error", "says"), [
    ({"recipe": "int4"}, ArgumentError, "int4"),
    ({"method": "mse"}, ArgumentError, "mse"),
    ({"samples": 0}, ArgumentError, "samples"),
    ({"samples": 2.5}, ArgumentError, "2.5"),
    ({"samples": True}, ArgumentError, "samples"),
    ({"data": None}, ArgumentError, "data="),
    ({"data": "/nonexistent/calib"}, DatasetError, "/nonexistent/calib"),
    ({"exclude": ["nothing.matches.*"]}, ArgumentError, "nothing.matches"),
])
def test_bad_quantize_arguments_say_what_to_fix(data, kwargs, error, says):
    model = _detector()
    args = {"data": data, "samples": 2, **kwargs}
    with pytest.raises(error, match=says.replace(".", r"\.").replace("*", r"\*")):
        model.quantize(**args)
    assert model.quant_info() is None


def test_calibration_folder_without_images_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("no images here")
    with pytest.raises(DatasetError, match="holds no images"):
        _detector().quantize(data=str(tmp_path), samples=2)


def test_data_yaml_without_a_split_is_refused(tmp_path):
    yaml_path = tmp_path / "data.yaml"
    yaml_path.write_text("path: .\nnames: [a, b]\n")
    with pytest.raises(DatasetError, match="neither a 'train' nor a 'val'"):
        _detector().quantize(data=str(yaml_path), samples=2)


def test_data_yaml_with_only_val_calibrates_on_val(data, tmp_path):
    from pathlib import Path

    root = Path(data).parent
    (tmp_path / "val.yaml").write_text(f"path: {root}\nval: images/val\nnames: [a, b, c]\n")
    model = _detector().quantize(data=str(tmp_path / "val.yaml"), samples=8)
    assert model.quant_info()["samples"] == 2  # the val split's two images


# --- CLI ------------------------------------------------------------------------------------------
def test_cli_quantize_writes_a_quantized_checkpoint(data, tmp_path, capsys):
    from libreyolo.cli import main

    out = tmp_path / "q.pt"
    assert main(["quantize", f"model={DEMO}", f"data={data}", "samples=2", "method=minmax", f"output={out}"]) == 0
    assert LibreYOLO(out).quant_info()["samples"] == 2
    assert main(["quantize", f"model={DEMO}", f"data={data}", "samples=-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "samples" in err[0]



def test_weight_scales_stay_float32_in_a_float16_copy(data):
    model = _detector().quantize(data=data, samples=2)
    half = model.inference_module(dtype=torch.float16)
    name = model.quant_info()["layers"][0]
    layer = half.get_submodule(name)
    assert layer.weight.dtype == torch.float16
    assert layer.quant_weight_scale.dtype == torch.float32
    assert torch.equal(layer.quant_weight_scale, model.net.get_submodule(name).quant_weight_scale)


@pytest.mark.parametrize("arch", ["LibreYOLO9t.yaml", "LibreYOLOXn.yaml", "LibreViTti-cls.yaml",
                                  "LibreDeiTt-cls.yaml", "LibreRTMDett.yaml", "LibreSwint-cls.yaml",
                                  "LibreSegformerb0-sem.yaml", "LibreRTDETRr18.yaml", "LibreDFINEn.yaml"])
def test_every_declared_exclusion_names_a_layer(arch):
    """A family's quant_exclude globs must each match a Conv2d/Linear (a renamed layer would silently
    be quantized otherwise)."""
    model = LibreYOLO(arch)
    layers = [n for n, m in model.net.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    assert model.family.quant_exclude
    for pattern in model.family.quant_exclude:
        assert any(fnmatch.fnmatchcase(n, pattern) for n in layers), pattern


@pytest.mark.parametrize(("field", "value", "says"), [
    ("schema", 2, "schema 2"), ("input_scale", float("nan"), "input scale"), ("input_zero_point", 300, "zero point"),
])
def test_a_damaged_quantization_entry_is_refused_on_load(data, tmp_path, field, value, says):
    from libreyolo.errors import CheckpointError

    path = _detector().quantize(data=data, samples=2).save(tmp_path / "q.pt")
    ckpt = torch.load(path, weights_only=True)
    if field == "schema":
        ckpt["quantization"]["schema"] = value
    else:
        next(iter(ckpt["quantization"]["layers"].values()))[field] = value
    torch.save(ckpt, path)
    with pytest.raises(CheckpointError, match=says):
        LibreYOLO(path)
