"""Shared by the edge-format tests (NCNN, LiteRT): one model per family, exported once per module,
and the checks every format's artifact must pass (validates, predicts like eager, a mutated copy is
refused)."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from libreyolo import SHAPES_IMAGE, LibreYOLO
from tests.conftest import DEMO_IMGSZ

# the four families of the acceptance: a YOLO (the bundled demo detector), a DETR, a classifier, SegFormer
FAMILIES = ("yolo9", "rtdetr", "vit", "segformer")
_MODELS: dict[str, tuple[Any, int]] = {}


def family_model(family: str) -> tuple[Any, int]:
    """(eager model, imgsz): the demo detector at DEMO_IMGSZ, else the seeded model of the validation
    power suite (tests/mutations.py) at its size."""
    if family not in _MODELS:
        if family == "yolo9":
            _MODELS[family] = (LibreYOLO("LibreYOLO9t-shapes.pt"), DEMO_IMGSZ)
        else:
            from tests.mutations import CASES, seeded

            _MODELS[family] = (seeded(family, 0, high_gain=False), CASES[family][1])
    return _MODELS[family]


def assert_predicts_like_eager(eager: Any, artifact: Any, imgsz: int) -> None:
    """``LibreYOLO(artifact).predict`` gives eager's result on the sample image (task by task)."""
    task = eager.family.task
    conf = 0.05
    if task == "detect":  # untrained (seeded) detectors score low: keep their 20 best, cut halfway to the 21st
        scores = eager.predict(SHAPES_IMAGE, imgsz=imgsz, conf=0.0).boxes.conf.sort(descending=True).values
        if len(scores) > 20 and float(scores[19]) < conf:
            conf = float(scores[19] + scores[20]) / 2
    want = eager.predict(SHAPES_IMAGE, imgsz=imgsz, conf=conf)
    got = artifact.predict(SHAPES_IMAGE, conf=conf)
    if task == "detect":
        from libreyolo.export.matching import match_detections
        from tests.test_export_common import as_dets

        assert len(want.boxes) > 0, "nothing detected: the comparison would be vacuous"
        m = match_detections(as_dets(want), as_dets(got), conf=conf, max_det=300, iou_min=0.99, score_tol=1e-4)
        assert m["passed"] and m["matched"] == m["eager"] == m["artifact"], m
    elif task == "classify":
        assert got.probs.top5 == want.probs.top5
        assert torch.allclose(got.probs.data, want.probs.data, atol=1e-4)
    elif task == "semantic":
        agree = float((got.semantic_mask.data == want.semantic_mask.data).float().mean())
        assert agree > 0.999, agree
    else:  # pragma: no cover - a new task needs its comparison here
        raise AssertionError(f"no comparison for task {task}")


def scale_tail_floats(path: Path, fraction: float = 0.05, factor: float = 1.05) -> None:
    """Scale the float32 values in the last ``fraction`` of a weights file by ``factor`` (the last
    layers' weights; zero tags and padding stay zero)."""
    data = bytearray(path.read_bytes())
    start = (int(len(data) * (1 - fraction)) // 4) * 4
    end = start + ((len(data) - start) // 4) * 4
    values = np.frombuffer(bytes(data[start:end]), dtype=np.float32).copy()
    finite = np.isfinite(values) & (np.abs(values) < 1e4)
    values[finite] *= factor
    data[start:end] = values.tobytes()
    path.write_bytes(bytes(data))


def copy_artifact(path: Path, dest: Path) -> Path:
    if path.is_dir():
        shutil.copytree(path, dest)
    else:
        shutil.copy2(path, dest)
    return dest


def check_val_benchmark_batcher_serve(path: Path, fmt: str, tmp_path: Path, capsys: Any) -> None:
    """The artifact of the demo detector through val() (eager's mAP), `libreyolo benchmark` (its row
    passes), the Batcher (concurrent requests give predict()'s boxes) and the HTTP server."""
    import pytest

    pytest.importorskip("faster_coco_eval", reason="mAP needs libreyolo[train] (faster-coco-eval)")
    from libreyolo.cli import main as cli_main
    from libreyolo.serve.batcher import Batcher
    from libreyolo.train.shapes import make_shapes_dataset

    model, imgsz = family_model("yolo9")
    data = make_shapes_dataset(tmp_path / "shapes", n_train=1, n_val=4, imgsz=imgsz, seed=3)
    runtime = LibreYOLO(path)
    got = runtime.val(data=str(data), batch=3, workers=0)  # batch 3: chunks of the exported batch 1
    want = model.val(data=str(data), imgsz=imgsz, batch=3, workers=0)
    assert want["mAP50-95"] > 0.5 and abs(got["mAP50-95"] - want["mAP50-95"]) <= 1e-9, (got, want)
    assert cli_main(["benchmark", f"model={path}", f"data={data}", "n=2"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(fmt)]
    assert len(rows) == 1 and rows[0].split()[2] == "passed", rows
    alone = runtime.predict(SHAPES_IMAGE, conf=0.25)
    assert len(alone.boxes) > 0
    with Batcher(runtime, max_batch=4, max_wait_ms=50) as batcher:
        futures = [batcher.submit(SHAPES_IMAGE, conf=0.25) for _ in range(3)]
        results = [f.result(timeout=120) for f in futures]
    for r in results:
        assert r.boxes.xyxy.tolist() == alone.boxes.xyxy.tolist()
    pytest.importorskip("fastapi", reason="serve needs libreyolo[serve]")
    from fastapi.testclient import TestClient

    from libreyolo.serve import create_app

    with TestClient(create_app(runtime, max_batch=2, max_wait_ms=10, conf=0.25)) as client:
        body = client.post("/predict", content=Path(SHAPES_IMAGE).read_bytes()).json()
        info = client.get("/info").json()
    assert len(body["predictions"]) == len(alone.boxes), body
    assert info["model"]["family"] == "yolo9"


def scale_tensor_in_file(path: Path, tensor: torch.Tensor, factor: float) -> None:
    """Find ``tensor``'s float32 bytes in a model file (exactly once) and scale them by ``factor``."""
    needle = tensor.detach().float().cpu().contiguous().numpy().tobytes()
    data = bytearray(path.read_bytes())
    at = data.find(needle)
    assert at >= 0 and data.find(needle, at + 1) < 0, "the tensor is not stored once, verbatim, in the file"
    scaled = (tensor.detach().float().cpu().numpy() * np.float32(factor)).astype(np.float32).tobytes()
    data[at:at + len(needle)] = scaled
    path.write_bytes(bytes(data))
