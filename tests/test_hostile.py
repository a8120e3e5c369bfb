"""Hostile input, round two (issue 22): one test per reported case, named after the behaviour.

Each option is checked by one declared schema at every entry point; loaders cannot be made to
allocate or recurse; training never writes a non-finite checkpoint. Cheap: untrained tiny models,
64-pixel images, no export.
"""
from __future__ import annotations

import io
import json
import math
import os
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from libreyolo import LibreYOLO
from libreyolo.cli import COMMANDS, UsageError, main, parse_args
from libreyolo.errors import ArgumentError, CheckpointError, ImageError, MissingDependencyError, TrainingDiverged
from libreyolo.options import MAX_DET

IMG = 64


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _one_line_error(argv: list[str], needle: str, code: int = 2) -> None:
    rc, _, err = _cli(argv)
    lines = err.strip().splitlines()
    assert rc == code and len(lines) == 1 and needle in lines[0] and "Traceback" not in err, (rc, err)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny") / "LibreYOLO9t.pt"
    torch.manual_seed(0)
    LibreYOLO("LibreYOLO9t.yaml", nc=3, names=["a", "b", "c"]).save(path)
    return path


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("img") / "a.png"
    Image.fromarray((np.random.RandomState(0).rand(48, 64, 3) * 255).astype(np.uint8)).save(path)
    return path


# --- 1. resource bounds ------------------------------------------------------------------------
def test_case1_max_det_has_an_upper_bound_on_the_command_line():
    with pytest.raises(UsageError, match=f"max_det must be an integer from 1 to {MAX_DET}"):
        parse_args(["max_det=1000000000"], COMMANDS["predict"][1], "predict")


def test_case1_max_det_has_the_same_bound_in_the_python_api(tiny, image):
    model = LibreYOLO(tiny)
    with pytest.raises(ArgumentError, match="max_det"):
        model.predict(image, imgsz=IMG, max_det=MAX_DET + 1)
    assert model.predict(image, imgsz=IMG, max_det=MAX_DET) is not None


def test_case1_batch_times_imgsz_is_bounded_by_the_input_budget(tiny, image):
    with pytest.raises(ArgumentError, match="input pixels, over the limit"):
        LibreYOLO(tiny).predict(image, imgsz=8192, batch=8)


# --- 2. decompression bombs at 1x the PIL limit ------------------------------------------------------
def test_case2_an_image_between_1x_and_2x_max_image_pixels_is_refused(tmp_path, monkeypatch):
    from libreyolo.data.sources import read_image_file

    path = tmp_path / "bomb.png"
    Image.new("RGB", (40, 40)).save(path)  # 1600 pixels: 1.6x the limit below, where PIL only warns
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(ImageError, match="over the limit of 1,000"):
        read_image_file(path)


# --- 3. training never writes a non-finite checkpoint ----------------------------------------------
@pytest.mark.parametrize("key", ["lr0", "lrf", "warmup_epochs", "momentum", "mosaic"])
@pytest.mark.parametrize("value", [math.nan, math.inf, "nan"])
def test_case3_non_finite_hyperparameters_are_refused(key, value):
    from libreyolo.train.trainer import TrainArgs

    with pytest.raises(ArgumentError, match=f"{key} must be a finite number"):
        TrainArgs.from_kwargs({"data": "d.yaml", key: value})


def test_case3_a_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    pytest.importorskip("cv2", reason="detection training needs libreyolo[train]")
    from libreyolo.train import loss as loss_module
    from libreyolo.train.shapes import make_shapes_dataset

    data = make_shapes_dataset(tmp_path / "shapes", n_train=4, n_val=2, imgsz=IMG, seed=0)
    real = loss_module.loss_for
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        criterion = real(*args, **kwargs)

        def wrapped(out, targets):
            loss, items = criterion(out, targets)
            calls["n"] += 1
            return (loss * math.nan, items) if calls["n"] > 2 else (loss, items)  # epoch 2 goes NaN

        return wrapped

    monkeypatch.setattr(loss_module, "loss_for", poisoned)
    model = LibreYOLO("LibreYOLO9t.yaml")
    with pytest.raises(TrainingDiverged, match=r"epoch 2 batch 0 \(step 2\): the loss is nan") as info:
        model.train(data=str(data), epochs=3, imgsz=IMG, batch=2, nbs=2, workers=0, val=False, plots=False,
                    mosaic=0.0, warmup_epochs=0.0, project=str(tmp_path), name="run")
    assert info.value.exit_code == 1 and "still holds the last good epoch" in str(info.value)
    last = tmp_path / "run" / "weights" / "last.pt"
    saved = torch.load(last, weights_only=True)
    assert saved["train_state"]["epoch"] == 0  # epoch 1's checkpoint, untouched
    assert all(torch.isfinite(v).all() for v in saved["model"].values() if v.is_floating_point())


# --- 4. val refuses what predict refuses -------------------------------------------------------------
@pytest.mark.parametrize("opts, needle", [({"imgsz": 33}, "imgsz must be a positive multiple of the model stride 32"),
                                          ({"iou": 5}, "iou must be a number from 0 to 1"),
                                          ({"conf": 2}, "conf must be a number from 0 to 1"),
                                          ({"conf": math.nan}, "conf must be a finite number")])
def test_case4_val_checks_its_options_like_predict(tiny, tmp_path, opts, needle):
    with pytest.raises(ArgumentError, match=needle):
        LibreYOLO(tiny).val(data=str(tmp_path / "missing.yaml"), **opts)  # refused before the data is read


# --- 5. a folder named like an image ----------------------------------------------------------------
def test_case5_a_subfolder_named_sub_jpg_does_not_abort_the_run(tiny, image, tmp_path):
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "sub.jpg").mkdir()
    (folder / "a.png").write_bytes(image.read_bytes())
    results = LibreYOLO(tiny).predict(str(folder), imgsz=IMG)
    assert [Path(r.path).name for r in results] == ["a.png"]


# --- 6. one line, never a traceback --------------------------------------------------------------
@pytest.mark.parametrize("argv, needle", [
    (["benchmark", "model=LibreYOLO9t.yaml", "n=0"], "n must be an integer from 1"),
    (["benchmark", "model=LibreYOLO9t.yaml", "n=-5"], "n must be an integer from 1"),
    (["train", "model=LibreYOLO9t.yaml", "data=d.yaml", "mosaic=2"], "mosaic must be a number from 0 to 1"),
    (["train", "model=LibreYOLO9t.yaml", "data=d.yaml", "warmup_epochs=nan"], "warmup_epochs must be a finite"),
    (["train", "model=LibreYOLO9t.yaml", "data=d.yaml", "warmup_epochs=inf"], "warmup_epochs must be a finite"),
])
def test_case6_user_mistakes_are_one_line(argv, needle):
    _one_line_error(argv, needle)


def test_case6_train_without_the_train_extra_says_so_before_any_work(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "cv2", None)  # import cv2 now fails, as without libreyolo[train]
    with pytest.raises(MissingDependencyError, match=r"libreyolo\[train\]"):
        LibreYOLO("LibreYOLO9t.yaml").train(data=str(tmp_path / "missing.yaml"), workers=2)


# --- 7. hostile files ---------------------------------------------------------------------------------
def _with_tensor(tiny: Path, dst: Path, key: str, tensor: torch.Tensor) -> Path:
    raw = torch.load(tiny, weights_only=True)
    raw["model"][key] = tensor
    torch.save(raw, dst)
    return dst


def test_case7_a_zero_stride_giant_tensor_is_checked_by_its_storage(tiny, tmp_path):
    huge = torch.full((1,), math.nan).expand(10**7, 10**7)  # 10**14 elements declared, 4 bytes stored
    path = _with_tensor(tiny, tmp_path / "huge.pt", "extra.weight", huge)
    with pytest.raises(CheckpointError, match="hold NaN or Inf"):
        LibreYOLO(path)


@pytest.mark.parametrize("tensor, needle", [
    (torch.empty(3, device="meta"), "meta tensor"),
    (torch.eye(3).to_sparse(), "sparse_coo tensor"),
    (torch.zeros(3).to(torch.float8_e4m3fn), "dtype float8_e4m3fn"),
    (torch.zeros(3, dtype=torch.complex64), "dtype complex64"),
])
def test_case7_tensors_that_cannot_be_weights_are_named(tiny, tmp_path, tensor, needle):
    path = _with_tensor(tiny, tmp_path / "odd.pt", "extra.weight", tensor)
    with pytest.raises(CheckpointError, match=needle) as info:
        LibreYOLO(path)
    assert len(str(info.value).splitlines()) == 1


@pytest.mark.parametrize("payload, what", [
    (b"\x89PNG\r\n\x1a\n" + bytes(64), "a PNG image"),
    (b"\xff\xd8\xff\xe0" + bytes(64), "a JPEG image"),
    (b"\x01\x00" + bytes(np.random.RandomState(0).randint(0, 256, 512, dtype=np.uint8)), "unknown binary data"),
    (b"# LibreYOLO\n\nA README, not weights.\n", "a text file"),
])
def test_case7_a_picture_or_text_passed_as_a_model_says_what_it_is(tmp_path, payload, what):
    path = tmp_path / "model.pt"
    path.write_bytes(payload)
    with pytest.raises(CheckpointError, match=f"it is {what}") as info:
        LibreYOLO(path)
    assert "could run code" not in str(info.value)


def test_case7_deep_json_in_a_sidecar_is_refused_without_recursion(tmp_path):
    from libreyolo.export.metadata import read_sidecar, sidecar_path

    artifact = tmp_path / "m.pte"
    artifact.write_bytes(b"not really a program")
    sidecar_path(artifact).write_text("[" * 200_000)
    with pytest.raises(CheckpointError, match="nested more than"):
        read_sidecar(artifact)


def test_case7_deep_json_in_metadata_entries_is_refused_without_recursion():
    from libreyolo.export.metadata import REQUIRED, decode

    props = {k: "x" for k in REQUIRED} | {"names": "[" * 200_000}
    with pytest.raises(CheckpointError, match="metadata key 'names' is JSON nested more than"):
        decode(props, "m.onnx")


def test_case7_dynamic_axes_that_are_not_mappings_are_a_metadata_error():
    from libreyolo.runtimes.base import check_metadata

    meta = {"family": "yolo9", "size": "t", "task": "detect", "names": {0: "a"}, "nc": 1, "stride": 32,
            "imgsz": 64, "batch": 1, "input_name": "images", "output_names": ["predictions"],
            "input_dtype": "float32", "letterbox": {}, "dynamic_axes": {"images": 5}}
    with pytest.raises(CheckpointError, match="'dynamic_axes' of 'images' must map axis numbers"):
        check_metadata(meta, "m.onnx")


# --- 8. minor ------------------------------------------------------------------------------------------
def test_case8_a_zero_byte_onnx_is_called_empty(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(b"")
    pytest.importorskip("onnxruntime")
    with pytest.raises(CheckpointError, match=r"is empty \(0 bytes\)"):
        LibreYOLO(path)


def test_case8_a_symlink_loop_is_called_a_loop(tmp_path):
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    os.symlink(b, a)
    os.symlink(a, b)
    with pytest.raises(CheckpointError, match="symbolic link loop"):
        LibreYOLO(a)


def test_case8_an_empty_dict_checkpoint_says_so(tmp_path):
    path = tmp_path / "empty.pt"
    torch.save({}, path)
    with pytest.raises(CheckpointError, match="holds an empty dict"):
        LibreYOLO(path)


def test_case8_integer_weights_where_floats_belong_are_refused_not_cast(tiny, tmp_path):
    raw = torch.load(tiny, weights_only=True)
    key = next(k for k, v in raw["model"].items() if v.is_floating_point() and v.ndim == 4)
    raw["model"][key] = raw["model"][key].to(torch.int64)
    torch.save(raw, tmp_path / "int.pt")
    with pytest.raises(CheckpointError, match=f"{key} int64 vs float32"):
        LibreYOLO(tmp_path / "int.pt")


def test_case8_a_repeated_key_is_refused():
    _one_line_error(["predict", "model=a.pt", "model=b.pt"], "model is given twice")


def test_case8_a_closed_stdout_pipe_exits_quietly(monkeypatch):
    import libreyolo.cli as cli

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setitem(cli.COMMANDS, "predict", (broken, cli.PREDICT_OPTS, ""))
    monkeypatch.setattr(cli, "_silence_stdout", lambda: None)
    rc, _, err = _cli(["predict", "model=a.pt"])
    assert rc == 1 and err == ""


def test_case8_a_label_path_that_is_a_folder_skips_the_image_with_a_warning(tmp_path):
    from libreyolo.train.labels import _scan_one

    images, labels = tmp_path / "images", tmp_path / "labels"
    images.mkdir()
    labels.mkdir()
    Image.new("RGB", (16, 16)).save(images / "a.png")
    (labels / "a.txt").mkdir()
    result = _scan_one(images / "a.png", nc=1)
    assert result.shape is None and any("not a label file" in w for w in result.warnings)


def test_case8_export_refuses_an_unwritable_output_folder_before_loading_the_model(tmp_path):
    from libreyolo.export.cli import normalise

    with pytest.raises(ArgumentError, match="does not exist"):
        normalise({"model": "no-such-model.pt", "output": str(tmp_path / "nowhere" / "m.onnx")})


# --- the schema itself -------------------------------------------------------------------------------
def test_every_cli_option_prints_its_bounds_in_help():
    rc, out, _ = _cli(["predict", "--help"])
    assert rc == 0 and "max_det" in out and f"from 1 to {MAX_DET}" in out


def test_the_same_declaration_serves_the_cli_and_the_python_api():
    from libreyolo.engine.options import PREDICT_OPTIONS
    from libreyolo.train.options import TRAIN_OPTIONS, VAL_OPTIONS

    assert COMMANDS["predict"][1]["conf"] is PREDICT_OPTIONS["conf"]
    assert COMMANDS["val"][1]["conf"] is VAL_OPTIONS["conf"] is TRAIN_OPTIONS["conf"]
    assert COMMANDS["train"][1]["lr0"] is TRAIN_OPTIONS["lr0"]
    assert json.dumps(PREDICT_OPTIONS["conf"].check("conf", "0.5")) == "0.5"
