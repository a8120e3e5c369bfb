"""The streaming pipeline of predict() (libreyolo/engine/stream.py): decode threads, pinned
staging, side-stream upload and deferred read-back give exactly the plain path's results.

    PYTHONPATH=. python3 -m pytest tests/test_stream_pipeline.py          # CPU
    PYTHONPATH=. python3 -m pytest -m gpu tests/test_stream_pipeline.py   # the CUDA half

On the CPU the pipeline runs with ``workers`` > 0 (its CPU default is the plain path), and the
staging path is forced with pinning off (``staging_wanted`` patched), so everything but the
page-locked memory and the side stream is exercised here.
"""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import libreyolo.data.sources as sources_mod
import libreyolo.engine.batches as batches_mod
import libreyolo.engine.predictor as predictor_mod
from libreyolo import LibreYOLO
from libreyolo.data.sources import open_sources
from libreyolo.engine.stream import BATCHES_IN_FLIGHT, StagingPool, stage
from libreyolo.errors import ImageError

IMGSZ = 64
KW = {"imgsz": IMGSZ, "conf": 0.01, "color_format": "rgb"}  # arrays as RGB: equal to their PNG files
FAST = {"imgsz": 32}  # for tests about order, bounds and errors rather than detections
N = 7                  # images per source: batch 3 does not divide it


@pytest.fixture(scope="module")
def model():
    return LibreYOLO("LibreYOLO9t-shapes.pt")


def _array(seed: int) -> np.ndarray:
    rng = np.random.RandomState(seed)
    h, w = rng.randint(30, 100), rng.randint(30, 100)  # mixed sizes
    return (rng.rand(h, w, 3) * 255).astype(np.uint8)


ARRAYS = [_array(i) for i in range(N)]


@pytest.fixture(scope="module")
def plain(model):
    """The plain path's results for ARRAYS (and for their PNG files: the same pixels), batch 3."""
    return model.predict(ARRAYS, batch=3, workers=0, **KW)


def _folder(root: Path, n: int = N, bad: tuple[int, ...] = ()) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        path = root / f"im{i:02d}.png"
        if i in bad:
            path.write_bytes(b"not an image at all")
        else:
            Image.fromarray(_array(i)).save(path)
    return root


def _same(a: list, b: list) -> None:
    """The same detections, bit for bit, in the same order (paths are compared by the callers)."""
    assert [r.orig_shape for r in a] == [r.orig_shape for r in b]
    assert sum(len(r) for r in a) > 0  # something to compare
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x.boxes.xyxy, y.boxes.xyxy) and torch.equal(x.boxes.conf, y.boxes.conf)
        assert torch.equal(x.boxes.cls, y.boxes.cls)


@pytest.fixture
def forced_staging(model, monkeypatch):
    """The staging path on the CPU (no pinning, no side stream): pack, one copy, views; a new pool."""
    monkeypatch.setattr(predictor_mod, "staging_wanted", lambda device: True)
    monkeypatch.setattr(batches_mod, "staging_wanted", lambda device: True)
    model._calls = type(model._calls)()  # a new CallState: its staging pool is made on first use


# --- same results -------------------------------------------------------------------------------------
def test_pipeline_returns_the_plain_paths_results_for_a_folder_a_list_and_a_generator(model, plain, tmp_path):
    folder = _folder(tmp_path / "in")
    files = sorted(str(p) for p in folder.iterdir())
    streamed = list(model.predict(str(folder), batch=3, workers=2, stream=True, **KW))
    _same(streamed, plain)
    assert [r.path for r in streamed] == files
    listed = model.predict(files, batch=3, workers=3, **KW)
    _same(listed, plain)
    assert [r.path for r in listed] == files
    _same(model.predict((a for a in ARRAYS), batch=3, workers=2, **KW), plain)


def test_staged_batches_equal_per_image_uploads_bit_for_bit(model, plain, forced_staging):
    arrays = ARRAYS + [ARRAYS[3]] * 3  # a run of one size, as a camera gives
    images = next(open_sources(arrays).batches(len(arrays), skip_unreadable=False))
    staged = stage(images, torch.device("cpu"), StagingPool(pin=False))
    uploaded = [img.to_device(torch.device("cpu")) for img in images]
    assert all(torch.equal(s, p) for s, p in zip(staged.ready(torch.device("cpu")), uploaded, strict=True))
    letterbox = model.family.letterbox(IMGSZ)
    assert torch.equal(letterbox(staged.tensors)[0], letterbox(uploaded)[0])
    _same(model.predict(ARRAYS, batch=3, workers=2, **KW), plain)
    assert model._staging_pool().allocations == 1


def test_a_batch_of_same_size_frames_is_letterboxed_whole_without_per_image_reorders(forced_staging, monkeypatch):
    """Same-size BGR frames (54x33: their bytes no multiple of the 256-byte alignment) are staged back to
    back as one (B, H, W, 3) view and letterboxed whole (Letterbox.place_batch), eagerly and inside the
    letterbox+pipeline graph: the per-image CHW RGB copies (a flip each, on the device) are never made,
    and the detections equal the plain per-image path's bit for bit."""
    from libreyolo.engine.pipeline import FRAMES_AFTER
    from libreyolo.graphs.backend import EmulatedGraphBackend

    graphed = LibreYOLO("LibreYOLO9t-shapes.pt")
    graphed.set_graph_backend(EmulatedGraphBackend())
    monkeypatch.setattr(predictor_mod, "side_stream", lambda device: None)
    monkeypatch.setattr(batches_mod, "side_stream", lambda device: None)
    staged, real = [], predictor_mod.stage
    monkeypatch.setattr(predictor_mod, "stage", lambda *a, **k: staged.append(real(*a, **k)) or staged[-1])
    monkeypatch.setattr(batches_mod, "stage", lambda *a, **k: staged.append(real(*a, **k)) or staged[-1])
    frames = [ARRAYS[3]] * 3  # BGR (the default color_format), one size
    kw = {"batch": 3, "workers": 0, "imgsz": IMGSZ, "conf": 0.01}
    eager = graphed.predict(frames, **kw)
    for _ in range(FRAMES_AFTER + 1):
        got = graphed.predict(frames, cuda_graph=True, **kw)
    assert "letterbox+pipeline" in {g["program"] for g in graphed.graph_info()["graphs"]}
    assert len(staged) == FRAMES_AFTER + 2 and all(b.uniform is not None and b._tensors is None for b in staged)
    monkeypatch.setattr(predictor_mod, "staging_wanted", lambda device: False)
    monkeypatch.setattr(batches_mod, "staging_wanted", lambda device: False)
    plain = graphed.predict(frames, **kw)  # per-image uploads, reorders and letterbox
    assert len(staged) == FRAMES_AFTER + 2
    _same(eager, plain)
    _same(got, plain)


@pytest.mark.parametrize("arch", ["LibreRTDETRr18.yaml", "LibreDFINEn.yaml"])
def test_detr_frames_are_stretched_whole_inside_the_graph_with_the_per_image_numbers(forced_staging, monkeypatch,
                                                                                    arch):
    """DETR's stretch preprocessing has a batched form too (Stretch.place_batch): same-size frames are
    resized as one batch, eagerly and inside the stretch+pipeline graph, with the per-image path's
    detections bit for bit."""
    from libreyolo.engine.pipeline import FRAMES_AFTER
    from libreyolo.graphs.backend import EmulatedGraphBackend

    detr = LibreYOLO(arch)
    torch.manual_seed(0)
    detr.set_graph_backend(EmulatedGraphBackend())
    monkeypatch.setattr(predictor_mod, "side_stream", lambda device: None)
    monkeypatch.setattr(batches_mod, "side_stream", lambda device: None)
    frames = [ARRAYS[3], np.ascontiguousarray(ARRAYS[3][::-1])]  # BGR, one size, two different frames
    kw = {"batch": 2, "workers": 0, "imgsz": IMGSZ, "conf": 0.01}
    eager = detr.predict(frames, **kw)
    for _ in range(FRAMES_AFTER + 1):
        got = detr.predict(frames, cuda_graph=True, **kw)
    assert "letterbox+pipeline" in {g["program"] for g in detr.graph_info()["graphs"]}
    monkeypatch.setattr(predictor_mod, "staging_wanted", lambda device: False)
    monkeypatch.setattr(batches_mod, "staging_wanted", lambda device: False)
    plain = detr.predict(frames, **kw)  # per-image uploads, reorders and stretch
    _same(eager, plain)
    _same(got, plain)


def test_tensor_and_float_inputs_skip_staging_and_still_agree(model, plain, forced_staging):
    mixed = [ARRAYS[0], torch.from_numpy(ARRAYS[1]).permute(2, 0, 1).float() / 255, ARRAYS[2],
             torch.from_numpy(ARRAYS[3]).permute(2, 0, 1), *ARRAYS[4:]]  # float, CHW (a strided view)
    got = model.predict(mixed, batch=3, workers=2, **KW)
    _same([got[i] for i in (0, 2, 3, 4, 5, 6)], [plain[i] for i in (0, 2, 3, 4, 5, 6)])
    assert got[1].orig_shape == plain[1].orig_shape  # float input: its own (rounded) pixels


# --- staging buffers ------------------------------------------------------------------------------------
def test_staging_buffers_do_not_grow_over_1000_frames(model, forced_staging):
    frame = _array(7)
    run = model.predict((frame for _ in range(1000)), batch=32, workers=2, stream=True, **FAST)
    first = [next(run) for _ in range(64)]
    pool = model._staging_pool()
    allocations, held = pool.allocations, pool.nbytes
    rest = list(run)
    assert len(first) + len(rest) == 1000
    assert 1 <= pool.allocations == allocations <= pool.max_slots
    assert pool.nbytes == held <= pool.max_slots * 2 * 32 * (frame.nbytes + 256)  # powers of two: < 2x


class _Fence:
    """A copy that has not finished until someone waits for it."""

    def __init__(self) -> None:
        self.waited = False

    def query(self) -> bool:
        return self.waited

    def synchronize(self) -> None:
        self.waited = True


def test_a_staging_buffer_is_never_rewritten_while_a_copy_may_still_read_it():
    pool = StagingPool(pin=False, max_slots=1)
    slot = pool.acquire(1000)
    fence = _Fence()
    pool.release(slot, fence)
    again = pool.acquire(1000)  # the only slot: it must wait for the copy first
    assert again is slot and fence.waited
    pool.release(again, None)

    pool = StagingPool(pin=False, max_slots=2)
    first = pool.acquire(1000)
    busy = _Fence()
    pool.release(first, busy)
    second = pool.acquire(1000)  # room for another: no wait, a second buffer
    assert second is not first and not busy.waited and pool.allocations == 2
    pool.release(second, None)
    assert pool.acquire(1000) is second  # the ready one is preferred over the busy one


def test_pack_writes_every_image_at_its_offset_alone_and_split_over_threads(monkeypatch):
    import libreyolo.engine.stream as stream

    rng = np.random.default_rng(0)
    images = [torch.from_numpy(rng.integers(0, 256, (9 + i, 13, 3), dtype=np.uint8)) for i in range(7)]
    offsets, total = [], 0
    for img in images:
        offsets.append(total)
        total += -(-img.numel() // 256) * 256  # aligned as stage() aligns them: gaps in between
    parts = list(zip(images, offsets, strict=True))
    threads, copy_into = [], stream._copy_into
    monkeypatch.setattr(stream, "_copy_into", lambda *a: threads.append(threading.current_thread().name) or
                        copy_into(*a))
    for part_bytes in (stream.PACK_PART_BYTES, 1000):  # one thread; then split (1000 B per part)
        monkeypatch.setattr(stream, "PACK_PART_BYTES", part_bytes)
        monkeypatch.setattr(stream, "_CPUS", 4)
        buffer = torch.full((total,), 7, dtype=torch.uint8)
        stream.pack(buffer, parts)
        written = torch.zeros(total, dtype=torch.bool)
        for img, off in parts:
            assert torch.equal(buffer[off:off + img.numel()], img.reshape(-1))
            written[off:off + img.numel()] = True
        assert bool((buffer[~written] == 7).all())  # nothing outside the images was touched
    assert threads[0] == threading.current_thread().name  # small: copied by the caller alone
    ways = sum(img.numel() for img in images) // 1000  # parts of at least 1000 B (3 here)
    assert ways >= 2 and len(threads) == 1 + ways  # split: the caller and ways - 1 pool threads
    assert sum(t.startswith("libreyolo-pack") for t in threads) == ways - 1


def test_a_batch_too_big_for_staging_goes_image_by_image(model, plain, forced_staging):
    model._staging_pool().max_bytes = 1000
    _same(model.predict(ARRAYS, batch=3, workers=1, **KW), plain)
    assert model._staging_pool().allocations == 0


# --- order, skipping, errors, bounds ----------------------------------------------------------------------
def test_decode_threads_keep_the_order_when_files_finish_out_of_order(model, plain, tmp_path, monkeypatch):
    folder = _folder(tmp_path / "in")
    done = {str(p): threading.Event() for p in folder.iterdir()}
    finished: list[str] = []
    real = sources_mod.read_image_file

    def reversed_pairs(path):  # in each batch of 3, the first file waits for the second: finished backwards
        index = int(Path(path).stem[2:])
        partner = str(folder / f"im{index + 1:02d}.png")
        if index % 3 == 0 and partner in done:
            assert done[partner].wait(timeout=60), "partner never decoded: the pool is not parallel"
        out = real(path)
        finished.append(Path(path).name)
        done[str(path)].set()
        return out

    monkeypatch.setattr(sources_mod, "read_image_file", reversed_pairs)
    piped = model.predict(str(folder), batch=3, workers=2, **KW)
    assert finished.index("im01.png") < finished.index("im00.png")  # really out of order
    assert [Path(r.path).name for r in piped] == [f"im{i:02d}.png" for i in range(N)]
    _same(piped, plain)


def test_unreadable_files_in_the_middle_are_skipped_as_on_the_plain_path(model, plain, tmp_path, caplog):
    folder = _folder(tmp_path / "in", bad=(2, 3))
    caplog.clear()
    piped = model.predict(str(folder), batch=2, workers=2, **KW)
    assert [Path(r.path).name for r in piped] == [f"im{i:02d}.png" for i in (0, 1, 4, 5, 6)]
    _same(piped, [plain[i] for i in (0, 1, 4, 5, 6)])
    assert caplog.text.count("skipping") == 2 and "skipped 2 of 7" in caplog.text
    with pytest.raises(ImageError, match="none of the 2 images"):
        model.predict(str(_folder(tmp_path / "bad", 2, bad=(0, 1))), workers=2, **FAST)


def test_progress_bar_counts_skipped_files_with_workers(model, tmp_path, capsys):
    folder = _folder(tmp_path / "in", 5, bad=(1,))
    model.predict(str(folder), batch=2, workers=2, progress=True, **FAST)
    assert "5/5" in capsys.readouterr().err


def test_an_error_mid_generator_comes_after_the_batches_before_it(model):
    def frames():
        yield from ARRAYS[:5]
        yield "no/such/file.png"

    for workers in (0, 2):
        got = []
        with pytest.raises(ImageError, match="not found"):
            for r in model.predict(frames(), batch=2, workers=workers, stream=True, **FAST):
                got.append(r)
        assert len(got) == 4, workers


def test_decoding_runs_at_most_a_bounded_number_of_batches_ahead(model, tmp_path, monkeypatch):
    folder = _folder(tmp_path / "in", 16)
    decoded = []
    real = sources_mod.read_image_file
    monkeypatch.setattr(sources_mod, "read_image_file", lambda p: decoded.append(p) or real(p))
    run = model.predict(str(folder), batch=2, workers=2, stream=True, **FAST)
    assert decoded == []  # nothing before the caller asks
    seen = 0
    for _ in run:
        seen += 1  # batches handed out before this one, plus at most BATCHES_IN_FLIGHT (this one's included)
        assert len(decoded) <= 2 * ((seen - 1) // 2) + BATCHES_IN_FLIGHT * 2
    assert seen == 16


def test_closing_a_stream_early_stops_the_feeder_and_decode_threads(model, tmp_path):
    folder = _folder(tmp_path / "in", 12)
    run = model.predict(str(folder), batch=2, workers=2, stream=True, **FAST)
    # (the process-wide packing pool, libreyolo-pack_*, is idle between calls and outlives them by design)
    def ours() -> list[str]:
        return [t.name for t in threading.enumerate()
                if t.name.startswith("libreyolo-") and not t.name.startswith("libreyolo-pack")]

    next(run)
    assert ours()
    run.close()
    assert not ours()


# --- CUDA: pinned memory, the side stream ---------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("half,cuda_graph", [(False, False), (True, False), (True, True)])
def test_gpu_side_stream_pipeline_equals_the_plain_path_bit_for_bit(tmp_path, half, cuda_graph):
    model = LibreYOLO("LibreYOLO9t-shapes.pt", device="cuda")
    folder = _folder(tmp_path / "in", 70)
    arrays = [_array(i) for i in range(70)] + [_array(5)] * 30
    kw = {"imgsz": 320, "conf": 0.01, "batch": 32, "half": half, "cuda_graph": cuda_graph}
    for source in (str(folder), arrays):
        plain = model.predict(source, workers=0, **kw)
        for _ in range(3):  # again: buffers reused, graphs replayed
            _same(model.predict(source, **kw), plain)  # the CUDA default: 4 workers, staging, side stream
    pool = model._staging_pool()
    assert pool.allocations <= pool.max_slots and pool._idle
    assert all(slot.buffer.is_pinned() for slot in pool._idle)
    model.release_graphs()


@pytest.mark.gpu
def test_gpu_staging_survives_a_slow_compute_stream(tmp_path):
    """The compute stream is held up so that uploads run far ahead: a buffer reused without waiting
    for its copy, or device memory freed without ``record_stream``, would corrupt later batches."""
    model = LibreYOLO("LibreYOLO9t-shapes.pt", device="cuda")
    arrays = [_array(i) for i in range(96)]
    kw = {"imgsz": 160, "conf": 0.01, "batch": 8}
    plain = model.predict(arrays, workers=0, **kw)
    real = model._preprocessor

    def slow(imgsz):
        pre = real(imgsz)

        def run(tensors, **k):
            torch.cuda._sleep(20_000_000)  # device-side spin on the compute stream (~10 ms), not a host sleep
            return pre(tensors, **k)
        return run

    model._preprocessor = slow
    try:
        _same(model.predict(arrays, workers=4, **kw), plain)
    finally:
        del model._preprocessor


@pytest.mark.gpu
@pytest.mark.parametrize("half", [False, True], ids=["fp32", "fp16"])
def test_gpu_frames_letterboxed_inside_the_graph_equal_the_letterbox_outside(monkeypatch, half):
    """Same-size frames staged together run as one graph from the uploaded bytes (letterbox,
    network, postprocessing): bit for bit what the letterbox outside the graph gives, for one
    frame and a batch, BGR and RGB, a frame that is resized and one that is only padded."""
    import libreyolo.engine.pipeline as pipeline_mod

    model = LibreYOLO("LibreYOLO9t-shapes.pt", device="cuda")
    base = np.asarray(Image.open(Path(sources_mod.__file__).parents[1] / "assets" / "shapes.jpg").convert("RGB"))
    for hw in ((480, 640), (360, 500)):
        frames = [np.ascontiguousarray(np.roll(np.asarray(Image.fromarray(base).resize(hw[::-1])), 7 * i, axis=1))
                  for i in range(4)]
        for batch, color in ((1, "bgr"), (4, "bgr"), (4, "rgb")):
            kw = {"imgsz": 320, "conf": 0.05, "half": half, "cuda_graph": True, "batch": batch, "workers": 0,
                  "color_format": color}
            first = model.predict(frames[:batch], **kw)  # a frame size's first batch: letterboxed outside
            inside = model.predict(frames[:batch], **kw)
            programs = {g["program"] for g in model.graph_info()["graphs"]}
            monkeypatch.setattr(pipeline_mod, "FRAMES_IN_GRAPH", False)
            outside = model.predict(frames[:batch], **kw)
            monkeypatch.setattr(pipeline_mod, "FRAMES_IN_GRAPH", True)
            assert "letterbox+pipeline" in programs
            _same(inside, outside)
            _same(first, outside)
