"""The letterbox inside the whole-pipeline graph (program ``letterbox+pipeline``) on the CPU.

The CUDA capture layer is replaced by :class:`EmulatedGraphBackend` (as in tests/test_graphs.py),
so the real program, keys and sightings run here; tests/test_stream_pipeline.py checks it on a GPU.
"""
from __future__ import annotations

import pytest
import torch

from libreyolo.errors import ArgumentError
from tests import test_graphs

# the same fixtures as tests/test_graphs.py: one intra-op thread, an emulated backend, a seeded YOLOv9-t on it
one_thread, backend, model = test_graphs.one_thread, test_graphs.backend, test_graphs.model

IMGSZ = 64


@pytest.mark.parametrize("n", [1, 3])
def test_same_size_frames_are_letterboxed_inside_the_pipeline_graph_with_the_same_results(model, backend, n):
    """From the second staged batch of same-size 8-bit frames on, one program runs from the frames
    (letterbox, network, postprocessing): its results equal the letterbox run outside, bit for bit."""
    import numpy as np

    from libreyolo.data.sources import array_source
    from libreyolo.engine.stream import StagedBatch

    rng = np.random.default_rng(n)
    arrays = [rng.integers(0, 256, (48, 80, 3), dtype=np.uint8) for _ in range(n)]  # BGR frames, resized to 64
    chunk = [array_source(a, "bgr", "frame") for a in arrays]
    frames = torch.stack([img.pixels for img in chunk])
    cpu = torch.device("cpu")
    plan = model.plan(imgsz=IMGSZ, half=False, cuda_graph=True, device=cpu, conf=0.01)

    def run(uniform=None):
        staged = StagedBatch([img.to_device(cpu) for img in chunk], uniform=uniform)
        return model._predict_chunk(chunk, 0.0, plan, staged=staged)

    def programs():
        return [g["program"] for g in model.graph_info()["graphs"]]

    outside = run()
    first = run((frames, True))  # the first batch of this frame size: letterboxed outside, as before
    assert programs() == ["pipeline"]
    inside = run((frames, True))
    assert programs() == ["pipeline", "letterbox+pipeline"]
    assert all(len(r.boxes) for r in outside)
    for a, b, c in zip(outside, first, inside, strict=True):
        assert all(torch.equal(getattr(a.boxes, k), getattr(b.boxes, k)) for k in ("xyxy", "conf", "cls"))
        assert all(torch.equal(getattr(a.boxes, k), getattr(c.boxes, k)) for k in ("xyxy", "conf", "cls"))
    # the frames' channel order is part of the program: frames read as RGB give other results
    run((frames, False))
    rgb = run((frames, False))
    assert len(model.graph_info()["graphs"]) == 3
    assert any(not torch.equal(a.boxes.conf, b.boxes.conf) if a.boxes.conf.shape == b.boxes.conf.shape else True
               for a, b in zip(outside, rgb, strict=True))


def test_capture_graph_of_a_frame_size_serves_the_first_batch_of_it(model, backend):
    import numpy as np

    from libreyolo.data.sources import array_source
    from libreyolo.engine.stream import StagedBatch

    info = model.capture_graph(IMGSZ, batch=2, frame_size=(48, 80), color_format="bgr")
    assert info["program"] == "letterbox+pipeline" and info["shape"] == [2, 48, 80, 3]
    chunk = [array_source(np.full((48, 80, 3), v, np.uint8), "bgr", "frame") for v in (30, 200)]
    staged = StagedBatch([img.to_device(torch.device("cpu")) for img in chunk],
                         uniform=(torch.stack([img.pixels for img in chunk]), True))
    model._predict_chunk(chunk, 0.0, model.plan(imgsz=IMGSZ, half=False, cuda_graph=True, device=torch.device("cpu")),
                         staged=staged)
    graphs = model.graph_info()["graphs"]
    assert len(graphs) == 1 and graphs[0]["replays"] == 1  # no second capture: the first batch replayed it
    with pytest.raises(ArgumentError, match=r"frame_size must be \(height, width\)"):
        model.capture_graph(IMGSZ, frame_size=(48, 0))
    with pytest.raises(ArgumentError, match="color_format"):
        model.capture_graph(IMGSZ, frame_size=(48, 80), color_format="yuv")
