"""Issue 49, nothing silently wrong: inputs and data that used to give a wrong answer without a word.

Another task's dataset is an error naming both tasks (val, benchmark, train, INT8 data all read it
through ``train.val.load_dataset``); float pixels outside [0, 1], NaN and Inf are refused (not
clipped) by the one input module every entry point uses (predict, the Batcher; the server
decodes files); the pixel limit holds for arrays and tensors; a meta tensor says what it is.
Each test fails on the code before this change (there: exit 0 with mAP 0.0, clipped pixels,
torch's own error). Cheap: an untrained tiny model, 64-pixel images.
"""
from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest
import torch
from PIL import Image

from libreyolo import LibreYOLO
from libreyolo.errors import ArgumentError, ImageError

IMG = 64


@pytest.fixture(scope="module")
def detector():
    torch.manual_seed(0)
    return LibreYOLO("LibreYOLO9t.yaml", nc=3, names=["a", "b", "c"])


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    from libreyolo.train.shapes import make_segmentation_dataset, make_shapes_dataset

    root = tmp_path_factory.mktemp("data")
    detect = make_shapes_dataset(root / "detect", n_train=2, n_val=2, imgsz=IMG)
    semantic = make_segmentation_dataset(root / "semantic", n_train=2, n_val=2, imgsz=IMG)
    return {"detect": detect, "semantic": semantic}


def _cli(argv: list[str]) -> tuple[int, str]:
    from libreyolo.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue().strip()


# --- another task's dataset ---------------------------------------------------------------------
def test_val_of_a_detector_on_a_semantic_dataset_names_both_tasks(detector, datasets):
    with pytest.raises(ArgumentError, match=r"is a semantic dataset \(.*masks.*\), but the model is a detect model"):
        detector.val(data=str(datasets["semantic"]), imgsz=IMG, batch=2, workers=0)


def test_the_cli_val_and_benchmark_exit_2_with_one_line_before_any_work(datasets, monkeypatch):
    from libreyolo.engine import benchmark_formats

    def no_work(*a, **k):
        raise AssertionError("benchmark started working on another task's dataset")

    monkeypatch.setattr(benchmark_formats, "_time", no_work)
    for argv in (["val", "model=LibreYOLO9t.yaml", f"data={datasets['semantic']}", "imgsz=64"],
                 ["benchmark", "model=LibreYOLO9t.yaml", f"data={datasets['semantic']}", "imgsz=64", "formats=eager"]):
        code, err = _cli(argv)
        assert code == 2 and len(err.splitlines()) == 1 and "semantic dataset" in err and "detect model" in err, err


@pytest.mark.parametrize("task, data, other", [("semantic", "detect", "detect"), ("classify", "semantic", "semantic"),
                                               ("restore", "detect", "detect")])
def test_every_task_refuses_the_dataset_of_another(datasets, task, data, other):
    from libreyolo.tasks import check_data_task

    with pytest.raises(ArgumentError, match=f"is a {other} dataset .* but the model is a {task} model"):
        check_data_task(task, datasets[data])


@pytest.mark.parametrize("task", ["detect", "semantic"])
def test_a_dataset_of_the_models_own_task_passes(datasets, task):
    from libreyolo.tasks import check_data_task

    check_data_task(task, datasets[task])  # a semantic YAML is also a detection YAML's shape: its own claim wins


def test_data_no_task_recognises_is_left_to_the_tasks_loader(tmp_path):
    from libreyolo.tasks import check_data_task

    check_data_task("detect", tmp_path / "missing.yaml")  # the loader says "not found", as before


# --- float pixels ------------------------------------------------------------------------------
BAD_FLOATS = [
    (np.full((48, 64, 3), 200.0, np.float32), "looks like 0..255 values: divide by 255"),
    (np.full((48, 64, 3), np.nan, np.float32), "NaN or Inf"),
    (torch.full((3, 48, 64), float("inf")), "NaN or Inf"),
    (torch.full((1, 3, 48, 64), -0.25), "float pixels must be in \\[0, 1\\], got values from -0.25"),
    (torch.full((3, 48, 64), 255.0, dtype=torch.float16), "divide by 255"),
]


@pytest.mark.parametrize("image, needle", BAD_FLOATS)
def test_float_pixels_outside_0_1_are_refused_by_predict(detector, image, needle):
    with pytest.raises(ImageError, match=needle):
        detector.predict(image, imgsz=IMG)


@pytest.mark.parametrize("image, needle", BAD_FLOATS[:2])
def test_the_batcher_refuses_them_with_the_same_rule(detector, image, needle):
    from libreyolo.serve.batcher import Batcher

    with Batcher(detector, max_batch=2) as batcher, pytest.raises(ImageError, match=needle):
        batcher.predict(image, timeout=60)


def test_a_float_tiff_file_is_held_to_the_rule_too(detector, tmp_path):
    path = tmp_path / "f.tif"
    Image.fromarray(np.full((48, 64), -3.0, np.float32), mode="F").save(path)
    with pytest.raises(ImageError, match="float pixels must be in"):
        detector.predict(str(path), imgsz=IMG)


def test_float_pixels_in_0_1_still_match_their_uint8_image(detector):
    rng = np.random.default_rng(0)
    u8 = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
    a = detector.predict(u8, imgsz=IMG, conf=0.0)
    b = detector.predict(u8.astype(np.float32) / 255.0, imgsz=IMG, conf=0.0)
    assert torch.equal(a.boxes.data, b.boxes.data)


# --- the pixel limit and meta tensors ------------------------------------------------------------
@pytest.mark.parametrize("image", [np.zeros((48, 64, 3), np.uint8), torch.zeros(3, 48, 64, dtype=torch.uint8),
                                   np.zeros((48, 64), np.float32)])
def test_the_pixel_limit_holds_for_arrays_and_tensors(detector, monkeypatch, image):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(ImageError, match=r"64x48 is 3,072 pixels, over the limit of 1,000"):
        detector.predict(image, imgsz=IMG)


def test_a_meta_tensor_says_it_holds_no_pixels(detector):
    with pytest.raises(ImageError, match="a meta tensor has a shape but no pixels") as err:
        detector.predict(torch.empty(3, 48, 64, device="meta"), imgsz=IMG)
    assert len(str(err.value).splitlines()) == 1


# --- SwinIR: what a forward costs, and tile_pad against tile --------------------------------------
@pytest.fixture(scope="module")
def swinir():
    return LibreYOLO("LibreSwinIRs.yaml")


def test_an_untiled_image_too_large_for_free_memory_is_refused_before_the_forward(swinir, monkeypatch):
    from libreyolo.engine import predictor
    from libreyolo.utils import checks

    def no_forward(*a, **k):
        raise AssertionError("the forward ran")

    monkeypatch.setattr(checks, "free_memory", lambda device: 1 << 30)  # 1 GiB free, whatever the machine has
    monkeypatch.setattr(predictor.Predictor, "_forward", no_forward)
    with pytest.raises(ArgumentError, match=r"1x3x512x512 batch needs about 3\.3 GiB \(estimated\), more than the "
                                            r"1\.0 GiB free on cpu; pass tile=256") as err:
        swinir.predict(np.zeros((512, 512, 3), np.uint8))
    assert len(str(err.value).splitlines()) == 1


def test_a_tiled_forward_is_estimated_per_tile(swinir):
    family, per_pixel = swinir.family, swinir.family.bytes_per_pixel["s"]
    shape = (1, 3, 3000, 3000)
    assert family.forward_bytes("s", shape, {"tile": 256, "tile_pad": 32}) == 320 * 320 * per_pixel
    assert family.forward_bytes("s", shape, {"tile": None}) == 3000 * 3000 * per_pixel
    assert LibreYOLO("LibreYOLO9t.yaml").family.forward_bytes("t", shape) is None  # fixed-size input: its budget


@pytest.mark.parametrize("tile, pad", [(16, 32), (64, 64), (8, 8)])
def test_tile_pad_not_smaller_than_tile_is_refused_where_declared(swinir, tile, pad):
    with pytest.raises(ArgumentError, match=f"tile_pad={pad} must be smaller than tile={tile}"):
        swinir.predict_options(tile=tile, tile_pad=pad)
    code, err = _cli(["predict", "model=LibreSwinIRs.yaml", f"tile={tile}", f"tile_pad={pad}"])
    assert code == 2 and len(err.splitlines()) == 1 and "must be smaller than tile" in err, err


def test_tile_pad_smaller_than_tile_is_accepted(swinir):
    assert swinir.predict_options(tile=64, tile_pad=56) == {"tile": 64, "tile_pad": 56}


# --- the Triton client on a port that accepts and never answers -----------------------------------
@pytest.fixture
def silent_port():
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held, stop = [], threading.Event()

    def accept():  # accept every connection, read nothing, answer nothing
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


@pytest.mark.parametrize("scheme, kw, limit", [("grpc", {"timeout": 1}, 8), ("http", {"timeout": 1}, 8),
                                               ("http", {}, 15)])
def test_a_port_that_never_answers_fails_in_seconds_with_one_line(silent_port, scheme, kw, limit):
    import time

    pytest.importorskip(f"tritonclient.{scheme}")
    from libreyolo.runtimes.base import RuntimeUnavailableError

    start = time.monotonic()
    with pytest.raises(RuntimeUnavailableError, match="no answer from 127.0.0.1") as err:
        LibreYOLO(f"{scheme}://127.0.0.1:{silent_port}/yolo", **kw)
    assert time.monotonic() - start < limit  # before: 20 s (grpc) and 60 s (http)
    assert len(str(err.value).splitlines()) == 1


def test_bad_timeouts_are_refused():
    with pytest.raises(ArgumentError, match="timeout must be a number in \\(0, 3600\\]"):
        LibreYOLO("grpc://127.0.0.1:1/yolo", timeout=0)


# --- a quantized checkpoint is complete or refused ----------------------------------------------
@pytest.fixture(scope="module")
def quantized(detector, datasets, tmp_path_factory):
    import copy

    path = tmp_path_factory.mktemp("quant") / "q.pt"
    model = copy.deepcopy(detector)
    model.imgsz = IMG  # calibrate at 64 pixels: cheap
    model.quantize(data=str(datasets["detect"]), samples=2).save(path)
    return path


@pytest.mark.parametrize("cut", ["half", "empty"])
def test_a_quantized_checkpoint_whose_layers_were_cut_is_refused_in_one_line(quantized, tmp_path, cut):
    from libreyolo.errors import CheckpointError

    ckpt = torch.load(quantized, weights_only=True)
    layers = ckpt["quantization"]["layers"]
    keep = list(layers)[: len(layers) // 2] if cut == "half" else []
    ckpt["quantization"]["layers"] = {k: layers[k] for k in keep}
    path = tmp_path / "cut.pt"
    torch.save(ckpt, path)
    with pytest.raises(CheckpointError, match=r"'quantization' entry is incomplete: \d+ Conv2d/Linear") as err:
        LibreYOLO(path)
    assert len(str(err.value).splitlines()) == 1


def test_a_complete_quantized_checkpoint_still_loads(quantized):
    assert LibreYOLO(quantized).is_quantized
