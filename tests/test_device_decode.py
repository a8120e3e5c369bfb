"""JPEG files decoded on the device: ``predict(decode="cuda")`` (libreyolo/data/device_decode.py).

    PYTHONPATH=. python3 -m pytest tests/test_device_decode.py          # CPU: the plumbing
    PYTHONPATH=. python3 -m pytest -m gpu tests/test_device_decode.py   # nvJPEG itself (the H200)

On the CPU, torchvision's decoder is replaced by Pillow decoding the bytes it is given (upright as
nvJPEG leaves them: no EXIF turn), so everything around the decoder is checked: which files go to the
device and which Pillow decodes, the EXIF turn, order, skipping, the fallback for streams the decoder
refuses, the whole-batch letterbox of the decoded batch, and the option's errors.
"""
from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

import libreyolo.data.device_decode as decode_mod
import libreyolo.data.sources as sources_mod
import libreyolo.engine.batches as batches_mod
import libreyolo.engine.predictor as predictor_mod
from libreyolo import LibreYOLO
from libreyolo.data.device_decode import EncodedJPEG, read_for_device
from libreyolo.data.sources import open_sources, read_image_file
from libreyolo.engine.stream import StagingPool, stage
from libreyolo.errors import ArgumentError, ImageError, MissingDependencyError

IMGSZ = 64


def _photo(seed: int, h: int = 48, w: int = 64) -> np.ndarray:
    """A smooth picture with noise (compresses like a photo), not symmetric under any turn."""
    rng = np.random.RandomState(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([xx * 4 + seed * 9, yy * 5, (xx + 2 * yy) * 2], -1) + rng.randint(-10, 11, (h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def _jpeg(path: Path, arr: np.ndarray, orientation: int = 1, mode: str = "RGB") -> Path:
    img = Image.fromarray(arr)
    if mode != "RGB":
        img = img.convert(mode)
    exif = Image.Exif()
    if orientation != 1:
        exif[0x0112] = orientation
    img.save(path, format="JPEG", quality=92, exif=exif.tobytes())
    return path


def _pillow_decoder(datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """nvJPEG's stand-in: RGB CHW uint8, as stored (no EXIF turn); refuses what Pillow cannot decode."""
    out = []
    for d in datas:
        with Image.open(io.BytesIO(d.numpy().tobytes())) as img:
            out.append(torch.from_numpy(np.asarray(img.convert("RGB")).copy()).permute(2, 0, 1).to(device))
    return out


@pytest.fixture
def fake_nvjpeg(monkeypatch):
    calls: list[int] = []

    def decoder():
        def decode(datas, device):
            calls.append(len(datas))
            return _pillow_decoder(datas, device)
        return decode

    monkeypatch.setattr(decode_mod, "device_decoder", decoder)
    return calls


def _as_hwc(img) -> np.ndarray:
    return (img.pixels if img.hwc else img.pixels.permute(1, 2, 0)).numpy()


@pytest.mark.parametrize("orientation", range(1, 9))
def test_the_exif_turn_after_device_decoding_is_pillows(tmp_path, orientation):
    path = _jpeg(tmp_path / "o.jpg", _photo(orientation, 30, 50), orientation)
    encoded = read_for_device(path)
    assert isinstance(encoded, EncodedJPEG) and encoded.orientation == orientation
    stored = torch.from_numpy(np.asarray(Image.open(path).convert("RGB")).copy()).permute(2, 0, 1)
    turned = decode_mod._upright_chw(stored, orientation).permute(1, 2, 0).numpy()
    want = np.asarray(ImageOps.exif_transpose(Image.open(path)).convert("RGB"))
    assert turned.shape == want.shape and np.array_equal(turned, want)


def test_jpegs_go_to_the_device_in_one_call_per_batch_and_the_rest_to_pillow(tmp_path, fake_nvjpeg):
    """RGB, grayscale and EXIF-turned JPEGs are decoded by the device decoder, a batch per call; a PNG and a
    CMYK JPEG by Pillow; a truncated JPEG (its header fine) fails the batched call, is retried alone, then
    by Pillow, and is skipped with the same reason the host path gives. Order and pixels as decode='cpu'."""
    folder = tmp_path / "in"
    folder.mkdir()
    _jpeg(folder / "a.jpg", _photo(1))
    _jpeg(folder / "b.jpg", _photo(2), mode="L")
    _jpeg(folder / "c.jpg", _photo(3), orientation=6)
    Image.fromarray(_photo(4)).save(folder / "d.png")
    _jpeg(folder / "e.jpg", _photo(5), mode="CMYK")
    good = _jpeg(tmp_path / "f.jpg", _photo(6)).read_bytes()
    (folder / "f.jpg").write_bytes(good[:len(good) // 2])
    _jpeg(folder / "g.jpg", _photo(7))
    assert isinstance(read_for_device(folder / "d.png"), sources_mod.SourceImage)
    assert isinstance(read_for_device(folder / "e.jpg"), sources_mod.SourceImage)
    assert isinstance(read_for_device(folder / "f.jpg"), EncodedJPEG)

    names = ("a.jpg", "b.jpg", "c.jpg", "d.png", "e.jpg", "g.jpg")
    for workers in (0, 2):
        plan = open_sources(str(folder))
        plan.decode_on = torch.device("cpu")
        fake_nvjpeg.clear()
        got = [img for chunk in plan.batches(3, skip_unreadable=True, workers=workers) for img in chunk]
        host = open_sources(str(folder))
        want = [img for chunk in host.batches(3, skip_unreadable=True, workers=workers) for img in chunk]
        assert [g.path for g in got] == [w.path for w in want] == [str(folder / n) for n in names]
        for g, w in zip(got, want, strict=True):
            assert np.array_equal(_as_hwc(g), _as_hwc(w)), g.path
        on_device = [g.path for g in got if not g.hwc]
        assert on_device == [str(folder / n) for n in ("a.jpg", "b.jpg", "c.jpg", "g.jpg")]
        assert all(g.from_file and g.original is None for g in got if not g.hwc)
        # batches (a b c) (d e f) (g): the second's one JPEG f fails, is retried alone, then goes to Pillow
        assert fake_nvjpeg == [3, 1, 1, 1]
        assert plan.skipped == host.skipped and [p for p, _ in plan.skipped] == [str(folder / "f.jpg")]


def test_a_lone_unreadable_jpeg_raises_as_on_the_host(tmp_path, fake_nvjpeg):
    good = _jpeg(tmp_path / "g.jpg", _photo(1)).read_bytes()
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(good[:200])
    plan = open_sources(str(bad))
    plan.decode_on = torch.device("cpu")
    with pytest.raises(ImageError, match="bad.jpg"):
        list(plan.batches(1, skip_unreadable=False))


def test_the_device_decoded_batch_is_letterboxed_whole_with_the_host_paths_numbers(tmp_path, fake_nvjpeg,
                                                                                     monkeypatch):
    """Same-size JPEGs decoded on the device are stacked into one (B, H, W, 3) batch (letterboxed whole,
    like uploaded frames); predict(decode="cuda") gives decode="cpu"'s detections bit for bit."""
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(5):
        _jpeg(folder / f"{i}.jpg", _photo(i, 60, 80))
    plan = open_sources(str(folder))
    plan.decode_on = torch.device("cpu")
    chunk = next(plan.batches(5, skip_unreadable=True))
    staged = stage(chunk, torch.device("cpu"), StagingPool(pin=False))
    assert staged.uniform is not None and tuple(staged.uniform[0].shape) == (5, 60, 80, 3)
    assert stage(chunk[:1], torch.device("cpu"), StagingPool(pin=False)).uniform is None  # one image: as is

    model = LibreYOLO("LibreYOLO9t-shapes.pt")
    monkeypatch.setattr(predictor_mod, "staging_wanted", lambda device: True)
    monkeypatch.setattr(batches_mod, "staging_wanted", lambda device: True)
    monkeypatch.setattr(predictor_mod, "side_stream", lambda device: None)
    monkeypatch.setattr(batches_mod, "side_stream", lambda device: None)
    monkeypatch.setattr(predictor_mod, "_device_decoding", lambda device: device)  # the CPU as the device
    staged_batches, real = [], predictor_mod.stage

    def recorded(*a, **k):
        staged_batches.append(real(*a, **k))
        return staged_batches[-1]

    monkeypatch.setattr(predictor_mod, "stage", recorded)
    monkeypatch.setattr(batches_mod, "stage", recorded)
    kw = {"imgsz": IMGSZ, "conf": 0.01, "batch": 5}
    on_device = model.predict(str(folder), decode="cuda", workers=0, **kw)
    assert staged_batches and all(b.uniform is not None for b in staged_batches)
    monkeypatch.setattr(predictor_mod, "resolve_workers", lambda workers, device: 4 if workers is None else workers)
    monkeypatch.setattr(batches_mod, "Feeder", None)  # decode="cuda" defaults to workers=0: no feeder thread
    default = model.predict(str(folder), decode="cuda", device="cpu", **kw)
    host = model.predict(str(folder), decode="cpu", workers=0, **kw)
    assert sum(len(r) for r in host) > 0
    for a, b in zip(on_device + default, host + host, strict=True):
        assert a.path == b.path and a.orig_shape == b.orig_shape
        assert torch.equal(a.boxes.xyxy, b.boxes.xyxy) and torch.equal(a.boxes.conf, b.boxes.conf)


def test_the_pixel_limit_is_checked_from_the_header_before_the_bytes_are_read(tmp_path, monkeypatch):
    path = _jpeg(tmp_path / "big.jpg", _photo(1, 60, 80))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 60 * 80 - 1)
    with pytest.raises(ImageError, match="refusing to decode"):
        read_for_device(path)


def test_decode_option_errors_name_the_value_and_the_fix(tmp_path, monkeypatch):
    model = LibreYOLO("LibreYOLO9t-shapes.pt")
    path = _jpeg(tmp_path / "a.jpg", _photo(1))
    with pytest.raises(ArgumentError, match="decode"):
        model.predict(str(path), decode="gpu", imgsz=IMGSZ)
    with pytest.raises(ArgumentError, match='device="cuda" or decode="cpu"'):
        model.predict(str(path), decode="cuda", imgsz=IMGSZ, device="cpu")
    monkeypatch.setitem(sys.modules, "torchvision.io", None)  # import fails as when it is not installed
    with pytest.raises(MissingDependencyError, match=r"libreyolo\[gpu-decode\]"):
        decode_mod.device_decoder()


def test_cli_decode_on_the_cpu_is_one_clean_line(tmp_path):
    path = _jpeg(tmp_path / "a.jpg", _photo(1))
    proc = subprocess.run([sys.executable, "-m", "libreyolo.cli", "predict", "model=LibreYOLO9t-shapes.pt",
                           f"source={path}", "decode=cuda", "device=cpu", "imgsz=64"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and 'decode="cuda"' in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# --- CUDA: nvJPEG itself ---------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_nvjpeg_agrees_with_pillow_far_closer_than_either_with_the_source(tmp_path):
    """nvJPEG and Pillow (libjpeg-turbo) may round the IDCT and chroma upsampling differently: the bar is
    that they differ from each other far less than each differs from the picture before compression (the
    codec's own error, measured here), on 4:2:0 and 4:4:4 files; and predict(decode="cuda") returns the
    same files, in order, with the same shapes, upright."""
    pytest.importorskip("torchvision", reason="decode='cuda' needs torchvision (extra gpu-decode)")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    device = torch.device("cuda")
    folder = tmp_path / "in"
    folder.mkdir()
    sources = []
    for i, subsampling in enumerate((0, 2, 2, 0, 2, 2)):
        arr = _photo(i, 240, 320)
        sources.append(arr)
        Image.fromarray(arr).save(folder / f"{i}.jpg", quality=90, subsampling=subsampling)
    files = sorted(folder.iterdir(), key=lambda p: int(p.stem))
    gpu = [img.pixels.permute(1, 2, 0).cpu().numpy().astype(np.int16)
           for img in decode_mod.decode_on_device([read_for_device(f) for f in files], device)]
    pil = [read_image_file(f).astype(np.int16) for f in files]
    src = [a.astype(np.int16) for a in sources]
    between = np.mean([np.abs(g - p).mean() for g, p in zip(gpu, pil, strict=True)])
    codec = np.mean([np.abs(p - s).mean() for p, s in zip(pil, src, strict=True)])
    worst = max(np.abs(g - p).max() for g, p in zip(gpu, pil, strict=True))
    print(f"nvJPEG vs Pillow mean |d| {between:.4f} (max {worst}); Pillow vs source {codec:.4f}")
    assert between < 0.25 * codec

    _jpeg(folder / "9.jpg", _photo(9, 40, 70), orientation=8)
    model = LibreYOLO("LibreYOLO9t-shapes.pt", device="cuda")
    kw = {"imgsz": 160, "conf": 0.05, "batch": 4}
    a = model.predict(str(folder), decode="cuda", workers=2, **kw)
    b = model.predict(str(folder), decode="cpu", workers=2, **kw)
    assert [r.path for r in a] == [r.path for r in b] and [r.orig_shape for r in a] == [r.orig_shape for r in b]
    assert a[-1].orig_shape == (70, 40)  # upright


@pytest.mark.gpu
def test_gpu_decoding_while_the_device_is_busy_gives_the_idle_devices_pixels(tmp_path):
    """torchvision's decoder allocates its outputs on the caller's stream and writes them from its own stream
    without waiting for the caller's (pytorch/vision PR #9606): memory the caller's stream freed while its
    queued kernels still read it can be overwritten. The upstream report's setting on every stream of the
    default-priority pool (where a new stream per call, as before 2026-12-05, would land): tensors filled,
    long work queued, readers of the tensors queued, the tensors freed; then decoding. The readers' sums stay
    intact and the pixels equal an idle device's, because the call goes through this thread's own stream
    from the high-priority pool, which queues nothing else."""
    pytest.importorskip("torchvision", reason="decode='cuda' needs torchvision (extra gpu-decode)")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    device = torch.device("cuda", torch.cuda.current_device())
    files = []
    for i in range(8):
        files.append(tmp_path / f"{i}.jpg")
        Image.fromarray(_photo(i, 240, 320)).save(files[-1], quality=90)
    items = [read_for_device(f) for f in files]
    idle = [img.pixels.clone() for img in decode_mod.decode_on_device(items, device)]
    stream = decode_mod.decode_stream(device)
    assert stream is decode_mod.decode_stream(device) and stream != torch.cuda.current_stream(device)
    assert stream.priority < torch.cuda.current_stream(device).priority
    for _ in range(3):
        sums = []
        for _ in range(32):  # the pool's size: every default-priority pool stream once
            side = torch.cuda.Stream(device)
            with torch.cuda.stream(side):
                filled = [torch.full((3, 240, 320), 7, dtype=torch.uint8, device=device) for _ in range(8)]
                big = torch.randn(2048, 2048, device=device)
                for _ in range(32):  # a long queue on that stream (~0.5 s over all 32), then readers of the tensors
                    big = (big @ big).tanh_()
                sums += [t.sum(dtype=torch.int64) for t in filled]
                del filled  # freed while their readers are still queued
        busy = decode_mod.decode_on_device(items, device)
        torch.cuda.synchronize()
        assert [int(s) for s in sums] == [7 * 3 * 240 * 320] * len(sums)
        assert all(torch.equal(a, b.pixels) for a, b in zip(idle, busy, strict=True))
