"""Video outputs and the tracking pipeline (issue 48): per-frame JSON/CSV written atomically, the
progress bar in frames/s, the tracker's thread stage (identical to tracking inline), and exported
artifacts tracking and predicting videos through the same code. One 12-frame 96x96 clip; the
session's ONNX of the demo detector (static imgsz 160, shared with test_val_artifacts.py).
"""
from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest
import torch

av = pytest.importorskip("av", reason="PyAV is not installed (libreyolo[video])")
pytest.importorskip("trackers", reason="trackers is not installed (libreyolo[track])")

from libreyolo.train.shapes import shapes_sequence  # noqa: E402
from tests.test_video import encode  # noqa: E402

IMGSZ = 96
N = 12


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    frames, _ = shapes_sequence(N, width=96, height=96, n_objects=3, size=24, speed=1.5, seed=0)
    return encode(tmp_path_factory.mktemp("outputs") / "shapes.mp4", frames, faststart=True)


@pytest.fixture(scope="module")
def tracked(demo, clip):
    return list(demo.track(clip, imgsz=IMGSZ, stream=True))


def test_per_frame_json_and_csv_are_written_atomically(demo, clip, tracked, tmp_path):
    out = list(demo.track(clip, imgsz=IMGSZ, stream=True, save_json=True, save_csv=True, save_dir=tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["shapes.csv", "shapes.json"]  # no temporary left
    doc = json.loads((tmp_path / "shapes.json").read_text())
    assert doc["fps"] == 25 and [f["frame"] for f in doc["frames"]] == list(range(N))
    for f, r in zip(doc["frames"], out, strict=True):
        assert [p["track_id"] for p in f["predictions"]] == r.boxes.id.tolist()
        assert [p["box"]["x1"] for p in f["predictions"]] == pytest.approx(r.boxes.xyxy[:, 0].tolist(), abs=1e-3)
    with open(tmp_path / "shapes.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == sum(len(r.boxes) for r in out) > 0
    assert {"frame", "timestamp", "name", "confidence", "x1", "y2", "track_id"} <= set(rows[0])
    assert [(int(row["frame"]), int(row["track_id"])) for row in rows] == \
        [(r.frame, i) for r in out for i in r.boxes.id.tolist()]
    # a run that fails mid-way (a truncated file) leaves no file and keeps the older one
    cut = tmp_path / "cut" / "shapes.mp4"
    cut.parent.mkdir()
    data = clip.read_bytes()
    cut.write_bytes(data[: len(data) * 2 // 3])
    (tmp_path / "shapes.json").write_text("older")
    from libreyolo.errors import ImageError

    with pytest.raises(ImageError, match="truncated"):
        list(demo.predict(cut, imgsz=IMGSZ, stream=True, save_json=True, save_dir=tmp_path))
    assert (tmp_path / "shapes.json").read_text() == "older"
    assert sorted(os.listdir(tmp_path)) == ["cut", "shapes.csv", "shapes.json"]
    # images: refused where declared, in the API and the CLI alike
    from libreyolo.cli import main as cli_main
    from libreyolo.errors import ArgumentError

    with pytest.raises(ArgumentError, match="save_csv=True writes the predictions of a video source"):
        demo.predict(np.zeros((32, 32, 3), np.uint8), save_csv=True)
    assert cli_main(["predict", "model=LibreYOLO9t-shapes.pt", "save_json=true"]) == 2


def test_progress_bar_counts_frames_per_second(demo, clip, capfd):
    list(demo.predict(clip, imgsz=IMGSZ, stream=True, end_frame=4, batch=2, progress=True))
    err = capfd.readouterr().err
    assert "4/4" in err and "frame/s" in err, err
    list(demo.predict(clip, imgsz=IMGSZ, stream=True, end_frame=4, batch=2))  # not a terminal: no bar
    assert "frame" not in capfd.readouterr().err


def test_tracker_thread_gives_the_inline_results(demo, clip, tracked, monkeypatch):
    """The tracker's updates run on their own thread, in order, while the next frames are predicted; the
    tracks equal those of updating inline, frame by frame (a tracker fed out of order would not: the
    mutation, four workers, fails this test)."""
    import threading

    from libreyolo.track import tracking

    inline_tracker = tracking.new_tracker("bytetrack", 25)
    inline = []
    for r in demo.predict(clip, imgsz=IMGSZ, stream=True):
        tracking.apply(inline_tracker, r)
        inline.append(r)
    assert len(tracked) == len(inline) == N and sum(len(r.boxes) for r in tracked) > 2 * N
    for a, b in zip(tracked, inline, strict=True):
        assert torch.equal(a.boxes.id, b.boxes.id) and torch.equal(a.boxes.xyxy, b.boxes.xyxy)
        assert a.speed["track"] > 0
    threads = set()
    apply = tracking.apply
    monkeypatch.setattr(tracking, "apply", lambda t, r: (threads.add(threading.current_thread().name), apply(t, r)))
    list(demo.track(clip, imgsz=IMGSZ, stream=True, end_frame=3))
    assert len(threads) == 1 and next(iter(threads)).startswith("libreyolo-track")


def test_an_onnx_artifact_tracks_and_predicts_videos_through_the_same_code(demo, demo_onnx, clip):
    """LibreYOLO("x.onnx") runs Predictor.predict/track (no code of its own for videos) and gives the eager
    model's frames, boxes and track ids. Boxes within 1e-3 px: ONNX Runtime's float32 differs from
    eager by ~1e-5 relative (test_val_artifacts.py), ~1e-4 px here at 96 px."""
    from libreyolo import LibreYOLO
    from libreyolo.engine.predictor import Predictor

    onnx = LibreYOLO(demo_onnx)
    assert type(onnx).track is Predictor.track and type(onnx)._predict_source is Predictor._predict_source
    kw = dict(imgsz=160, stream=True)
    for run in ("predict", "track"):
        a, b = list(getattr(onnx, run)(str(clip), **kw)), list(getattr(demo, run)(str(clip), **kw))
        assert [r.frame for r in a] == [r.frame for r in b] == list(range(N))
        for ra, rb in zip(a, b, strict=True):
            assert np.allclose(ra.boxes.xyxy.numpy(), rb.boxes.xyxy.numpy(), atol=1e-3)
            if run == "track":
                assert torch.equal(ra.boxes.id, rb.boxes.id)


def test_annotated_video_frames_are_the_plots_and_an_encoder_failure_keeps_the_older_video(demo, clip, tmp_path,
                                                                                          monkeypatch):
    """The writer encodes on its own thread: the video holds every plotted frame in order (decoded,
    each closer to its own plot than to any other frame's), and an
    encoder error mid-run is raised on the caller's thread as one ImageError, leaving the older
    video in place and no temporary (checked against a writer that swallowed the error: the run
    would finish and replace the video)."""
    from libreyolo.errors import ImageError

    out = list(demo.predict(clip, imgsz=IMGSZ, stream=True, save=True, save_dir=tmp_path, conf=0.01))
    plots = [np.asarray(r.plot()).astype(np.float32) for r in out]
    with av.open(str(tmp_path / "shapes.mp4")) as c:
        decoded = [f.to_ndarray(format="rgb24").astype(np.float32) for f in c.decode(c.streams.video[0])]
    assert len(decoded) == len(plots) == N
    for i, frame in enumerate(decoded):
        errors = [np.abs(frame - p).mean() for p in plots]
        assert int(np.argmin(errors)) == i, (i, errors)

    (tmp_path / "shapes.mp4").write_bytes(b"older")
    real = av.VideoFrame.from_ndarray
    calls = {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError("disk full (simulated)")
        return real(*args, **kwargs)

    monkeypatch.setattr(av.VideoFrame, "from_ndarray", failing)
    with pytest.raises(ImageError, match="writing the annotated video failed: disk full"):
        list(demo.predict(clip, imgsz=IMGSZ, stream=True, save=True, save_dir=tmp_path))
    assert (tmp_path / "shapes.mp4").read_bytes() == b"older"
    assert os.listdir(tmp_path) == ["shapes.mp4"]
