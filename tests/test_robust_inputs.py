"""Bad, big and hostile inputs: predict streams in bounded batches, skips unreadable files in a
folder, refuses what is not an image file with one clear error, never overwrites its own
outputs, and writes files with ordinary permissions."""
from __future__ import annotations

import ast
import logging
import os
import stat
import threading
import types
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from libreyolo.checkpoint import atomic_write
from libreyolo.cli import main
from libreyolo.errors import ArgumentError, ImageError
from libreyolo.results import OutputNames, Results

from .conftest import seeded_model

IMGSZ = 64
PACKAGE = Path(__file__).resolve().parents[1] / "libreyolo"


@pytest.fixture(scope="module")
def model():
    return seeded_model("t", seed=0)


def _image(seed: int, w: int = 48, h: int = 40) -> Image.Image:
    return Image.fromarray((np.random.RandomState(seed).rand(h, w, 3) * 255).astype(np.uint8))


def _folder(root: Path, n: int, suffix: str = ".png") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        _image(i).save(root / f"im{i:02d}{suffix}")
    return root


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield 0o022
    os.umask(old)


# --- streaming and bounded batches ----------------------------------------------------------------
def test_stream_true_returns_a_generator_of_the_same_results(model, tmp_path):
    folder = _folder(tmp_path / "in", 3)
    gen = model.predict(str(folder), imgsz=IMGSZ, conf=0.01, stream=True)
    assert isinstance(gen, types.GeneratorType)
    streamed = list(gen)
    listed = model.predict(str(folder), imgsz=IMGSZ, conf=0.01)
    assert [r.path for r in streamed] == [r.path for r in listed] == sorted(str(p) for p in folder.iterdir())
    for a, b in zip(streamed, listed, strict=True):
        assert a.boxes.data.tolist() == b.boxes.data.tolist()


def test_images_are_decoded_one_batch_at_a_time(model, tmp_path, monkeypatch):
    import libreyolo.data.sources as sources

    folder = _folder(tmp_path / "in", 7)
    decoded = []
    real = sources.read_image_file
    monkeypatch.setattr(sources, "read_image_file", lambda p: decoded.append(p) or real(p))
    gen = model.predict(str(folder), imgsz=IMGSZ, batch=3, stream=True)
    assert decoded == []  # nothing decoded before the caller asks
    next(gen)
    assert len(decoded) == 3
    rest = list(gen)
    assert len(rest) == 6 and len(decoded) == 7


def test_default_batch_bounds_each_forward(model, tmp_path, monkeypatch):
    folder = _folder(tmp_path / "in", 5)
    sizes = []
    real = model._execute  # every batch's network call goes through the call plan's executor
    monkeypatch.setattr(model, "_execute", lambda x, plan: sizes.append(int(x.shape[0])) or real(x, plan))
    monkeypatch.setattr(model, "default_batch", 2)
    out = model.predict(str(folder), imgsz=IMGSZ)
    assert sizes == [2, 2, 1] and len(out) == 5
    sizes.clear()
    model.predict([np.zeros((40, 48, 3), np.uint8)] * 5, imgsz=IMGSZ, batch=4)
    assert sizes == [4, 1]


def test_a_list_of_file_results_keeps_paths_not_pixels(model, tmp_path):
    folder = _folder(tmp_path / "in", 2)
    out = model.predict(str(folder), imgsz=IMGSZ, conf=0.01)
    assert all(r._orig_img is None for r in out)  # read again from r.path when needed
    assert np.array_equal(out[1].orig_rgb(), np.asarray(Image.open(folder / "im01.png").convert("RGB")))
    assert out[0].plot().size == (48, 40)
    streamed = next(model.predict(str(folder), imgsz=IMGSZ, stream=True))
    assert isinstance(streamed._orig_img, np.ndarray)  # one at a time: no need to read twice


def test_a_result_whose_file_changed_since_predict_says_so(model, tmp_path):
    folder = _folder(tmp_path / "in", 2)
    r = model.predict(str(folder), imgsz=IMGSZ)[0]
    _image(9, w=20, h=20).save(r.path)
    with pytest.raises(ImageError, match="changed since predict"):
        r.plot()


def test_stream_and_progress_flags_are_checked(model):
    with pytest.raises(ArgumentError, match="stream"):
        model.predict(np.zeros((40, 48, 3), np.uint8), stream="yes")
    with pytest.raises(ArgumentError, match="progress"):
        model.predict(np.zeros((40, 48, 3), np.uint8), progress="auto")


# --- progress and logging ------------------------------------------------------------------------
def test_progress_bar_goes_to_stderr_only_when_asked_or_long_on_a_terminal(model, tmp_path, capsys):
    folder = _folder(tmp_path / "in", 3)
    model.predict(str(folder), imgsz=IMGSZ, batch=1, progress=True)
    captured = capsys.readouterr()
    assert "predict" in captured.err and "3/3" in captured.err and captured.out == ""
    model.predict(str(folder), imgsz=IMGSZ, batch=1)  # automatic: not a terminal here
    model.predict(str(folder), imgsz=IMGSZ, batch=1, progress=False)
    assert capsys.readouterr().err == ""


def test_verbose_logs_one_line_per_image_through_the_libreyolo_logger(model, tmp_path, caplog, capsys):
    folder = _folder(tmp_path / "in", 2)
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        model.predict(str(folder), imgsz=IMGSZ, verbose=True)
    lines = [r.getMessage() for r in caplog.records if r.name == "libreyolo" and r.levelno == logging.INFO]
    assert len(lines) == 2 and "im00.png" in lines[0] and "detections" in lines[0]
    assert capsys.readouterr().out == ""  # nothing printed by the library


def test_the_library_never_prints_only_command_line_entry_points_do():
    allowed = {PACKAGE / "cli.py", PACKAGE / "export" / "cli.py", PACKAGE / "serve" / "cli.py",
               PACKAGE / "graphs" / "parity.py"}
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert offenders == []


def test_export_validation_and_benchmark_use_tqdm_where_users_wait():
    for rel in ("export/validate.py", "engine/benchmark.py", "engine/calls.py"):  # predict()'s bar: engine/calls.py
        assert "from tqdm import tqdm" in (PACKAGE / rel).read_text(), rel


def test_benchmark_runs_all_frames_in_one_forward():
    from libreyolo.engine.benchmark import time_predict

    calls = []

    class Fake:
        device = __import__("torch").device("cpu")

        def predict(self, frames, **kw):
            calls.append(kw)
            return [Results(names={0: "a"}, orig_shape=(4, 4))] * len(frames)

    time_predict(Fake(), [np.zeros((4, 4, 3), np.uint8)] * 32, n=2, warmup=1)
    assert len(calls) == 3 and all(kw["batch"] == 32 for kw in calls)


# --- unreadable files ----------------------------------------------------------------------------
def test_a_bad_file_in_a_folder_is_skipped_with_a_warning(model, tmp_path, caplog):
    folder = _folder(tmp_path / "in", 3)
    (folder / "im01.png").write_bytes(b"\x89PNG\r\n\x1a\n but then garbage")
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        out = model.predict(str(folder), imgsz=IMGSZ, batch=2)
    assert [Path(r.path).name for r in out] == ["im00.png", "im02.png"]
    text = caplog.text
    assert "skipping" in text and "im01.png" in text and "skipped 1 of 3" in text


def test_a_single_bad_file_still_raises_and_a_folder_of_only_bad_files_too(model, tmp_path):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    with pytest.raises(ImageError, match="corrupt"):
        model.predict(str(bad), imgsz=IMGSZ)
    folder = tmp_path / "allbad"
    folder.mkdir()
    for i in range(2):
        (folder / f"x{i}.jpg").write_bytes(b"junk")
    with pytest.raises(ImageError, match="none of the 2 images could be read"):
        model.predict(str(folder), imgsz=IMGSZ)


def test_decompression_bomb_is_a_clear_image_error(model, tmp_path, monkeypatch):
    path = tmp_path / "bomb.png"
    _image(0, w=100, h=100).save(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 10,000 pixels is then a "bomb"
    with pytest.raises(ImageError, match="refusing to decode .*bomb.png.*MAX_IMAGE_PIXELS"):
        model.predict(str(path), imgsz=IMGSZ)


def test_decompression_bomb_on_the_cli_is_one_line_and_non_zero(tmp_path, monkeypatch, capsys):
    path = tmp_path / "bomb.png"
    _image(0, w=100, h=100).save(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    code = main(["predict", "model=LibreYOLO9t.yaml", f"source={path}", f"imgsz={IMGSZ}", f"save_dir={tmp_path}/o"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1 and "refusing to decode" in err and "Traceback" not in err


@pytest.mark.parametrize("path, needle", [
    ("/proc/self/status", "operating-system files"),
    ("/proc/self/mem", "operating-system files"),
    ("/dev/null", "character device"),
])
def test_proc_and_device_files_are_refused_clearly(model, path, needle):
    if not os.path.exists(path):
        pytest.skip(f"{path} does not exist on this OS")
    with pytest.raises(ImageError, match=needle):
        model.predict(path, imgsz=IMGSZ)


def test_proc_source_on_the_cli_is_one_line_and_non_zero(tmp_path, capsys):
    code = main(["predict", "model=LibreYOLO9t.yaml", "source=/proc/self/status", f"save_dir={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1 and "/proc" in err and "Traceback" not in err


def test_permission_denied_is_a_clear_error(model, tmp_path, monkeypatch):
    target = tmp_path / "secret.jpg"
    real_stat = Path.stat

    def stat_denied(self, *args, **kwargs):
        if self == target:
            raise PermissionError(13, "Permission denied", str(self))
        return real_stat(self, *args, **kwargs)

    monkeypatch.setattr(Path, "stat", stat_denied)
    with pytest.raises(ImageError, match="permission denied"):
        model.predict(str(target), imgsz=IMGSZ)


def test_empty_file_is_refused(model, tmp_path):
    (tmp_path / "empty.png").write_bytes(b"")
    with pytest.raises(ImageError, match="empty"):
        model.predict(str(tmp_path / "empty.png"), imgsz=IMGSZ)


def _finishes(fn, seconds: float = 20.0):
    outcome = {}

    def target():
        try:
            outcome["value"] = fn()
        except Exception as exc:  # noqa: BLE001 - handed to the test
            outcome["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "predict() hung on a FIFO"
    return outcome


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this OS")
def test_a_fifo_is_refused_instead_of_hanging(model, tmp_path):
    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    outcome = _finishes(lambda: model.predict(str(fifo), imgsz=IMGSZ))
    assert isinstance(outcome.get("error"), ImageError) and "named pipe" in str(outcome["error"])


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this OS")
def test_a_fifo_in_a_folder_is_skipped_instead_of_hanging(model, tmp_path, caplog):
    folder = _folder(tmp_path / "in", 1)
    os.mkfifo(folder / "zz.png")
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        outcome = _finishes(lambda: model.predict(str(folder), imgsz=IMGSZ))
    assert [Path(r.path).name for r in outcome["value"]] == ["im00.png"]
    assert "named pipe" in caplog.text


@pytest.mark.parametrize("url", ["https://example.com/bus.jpg", Path("http://example.com/bus.jpg")])
def test_urls_are_refused_with_a_plain_message(model, url):
    with pytest.raises(ImageError, match="looks like a URL.*does not fetch URLs.*download the file first"):
        model.predict(url, imgsz=IMGSZ)


# --- EXIF orientation ----------------------------------------------------------------------------
def _exif_rotated(path: Path) -> Image.Image:
    """A 48x40 image stored sideways (40x48 pixels) with EXIF orientation 6 ("rotate 90 CW")."""
    upright = _image(3)
    stored = upright.transpose(Image.Transpose.ROTATE_90)
    exif = Image.Exif()
    exif[0x0112] = 6
    stored.save(path, exif=exif)
    return upright


def test_exif_orientation_is_applied_to_files_and_pil_images(model, tmp_path):
    path = tmp_path / "sideways.png"
    upright = _exif_rotated(path)
    r = model.predict(str(path), imgsz=IMGSZ, conf=0.01)
    assert r.orig_shape == (40, 48)  # (h, w) of the upright image, not of the stored pixels
    assert np.array_equal(r.orig_rgb(), np.asarray(upright))
    assert (r.boxes.xyxy[:, 2] <= 48).all() and (r.boxes.xyxy[:, 3] <= 40).all()
    direct = model.predict(np.asarray(upright), imgsz=IMGSZ, conf=0.01, color_format="rgb")
    assert r.boxes.data.tolist() == direct.boxes.data.tolist()
    with Image.open(path) as img:
        assert model.predict(img, imgsz=IMGSZ).orig_shape == (40, 48)


# --- outputs: unique names, permissions ----------------------------------------------------------
def test_output_names_are_unique_per_run():
    names = OutputNames()
    got = [names.stem(p) for p in ["d/a.jpg", "d/a.png", "e/a.png", "d/A.jpg", "d/b.tif", None, None]]
    assert got == ["a", "a_png", "a_png_2", "A_jpg", "b", "image", "image_2"]


def test_cli_never_overwrites_its_own_outputs(tmp_path, capsys, umask_022):
    src = tmp_path / "in"
    src.mkdir()
    _image(0).save(src / "a.jpg")
    _image(1).save(src / "a.png")
    out = tmp_path / "out"
    assert main(["predict", "model=LibreYOLO9t.yaml", f"source={src}", f"imgsz={IMGSZ}", f"save_dir={out}",
                 "json=true"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["a.jpg", "a.json", "a_png.json", "a_png.png"]
    assert Image.open(out / "a_png.png").format == "PNG" and Image.open(out / "a.jpg").format == "JPEG"
    for p in out.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p
    text = capsys.readouterr().out
    assert "a.jpg" in text and "a_png.png" in text


def test_cli_skips_a_bad_file_in_a_folder_with_a_one_line_warning(tmp_path, capsys):
    src = _folder(tmp_path / "in", 2)
    (src / "broken.png").write_bytes(b"nope")
    assert main(["predict", "model=LibreYOLO9t.yaml", f"source={src}", f"imgsz={IMGSZ}",
                 f"save_dir={tmp_path / 'o'}"]) == 0
    captured = capsys.readouterr()
    assert "WARNING: skipping" in captured.err and "broken.png" in captured.err
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["im00.png", "im01.png"]


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077])
def test_atomic_write_gives_ordinary_permissions(tmp_path, mask):
    old = os.umask(mask)
    try:
        path = atomic_write(tmp_path / "f.bin", lambda tmp: tmp.write_bytes(b"x"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_atomic_write_keeps_the_permissions_of_a_file_it_replaces(tmp_path, umask_022):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")
    path.chmod(0o600)
    atomic_write(path, lambda tmp: tmp.write_bytes(b"new"))
    assert path.read_bytes() == b"new" and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_checkpoints_and_saved_images_get_ordinary_permissions(model, tmp_path, umask_022):
    ckpt = Path(model.save(tmp_path / "LibreYOLO9t.pt"))
    image = Path(model.predict(_image(0), imgsz=IMGSZ).save(tmp_path / "x.png"))
    for p in (ckpt, image):
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p
