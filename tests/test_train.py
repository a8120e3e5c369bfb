"""Training end to end on generated shapes datasets (CPU, tiny sizes): detect and classify, resume,
the CLI, a 2-process gloo DDP run, and the cuda_graph flag that never stops a run."""
from __future__ import annotations

import csv
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.cli import main as cli_main
from libreyolo.train.shapes import make_shapes_dataset

pytest.importorskip("faster_coco_eval", reason="training metrics need libreyolo[train] (faster-coco-eval)")

IMGSZ = 64
# no mosaic, zoom, shift or colour jitter: on 8 tiny images those make the epoch loss too noisy to compare
FAST = {"imgsz": IMGSZ, "batch": 4, "nbs": 4, "workers": 0, "mosaic": 0.0, "scale": 0.0, "translate": 0.0,
        "hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0, "warmup_epochs": 0.0, "plots": False}


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    return make_shapes_dataset(tmp_path_factory.mktemp("shapes"), n_train=8, n_val=4, imgsz=IMGSZ, seed=0)


def _rows(run: Path) -> list[dict[str, str]]:
    with open(run / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


def _loss(row: dict[str, str]) -> float:
    return sum(float(v) for k, v in row.items() if k.startswith("train/"))


def test_yolo9_trains_the_loss_falls_and_the_checkpoint_loads_and_exports(shapes, tmp_path):
    model = LibreYOLO("LibreYOLO9t.yaml")
    summary = model.train(data=str(shapes), epochs=5, lr0=0.02, project=str(tmp_path), name="det", **FAST)
    run = Path(summary["save_dir"])
    rows = _rows(run)
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3, 4, 5]
    assert _loss(rows[-1]) < _loss(rows[0]), [_loss(r) for r in rows]
    assert {"metrics/mAP50-95", "metrics/mAP50"} <= set(rows[-1])
    assert all(0.0 <= float(r["metrics/mAP50-95"]) <= float(r["metrics/mAP50"]) <= 1.0 for r in rows)
    assert model.nc == 3 and model.names == {0: "square", 1: "circle", 2: "triangle"}
    for name in ("last.pt", "best.pt"):
        back = LibreYOLO(str(run / "weights" / name))
        assert back.nc == 3 and back.names == model.names
    assert not [p for p in run.rglob("*") if p.name.startswith(".")]  # atomic writes leave no temp files
    back = LibreYOLO(str(run / "weights" / "best.pt"))
    report = back.export(format="onnx", imgsz=IMGSZ, output=tmp_path / "trained.onnx", verbose=False)
    assert report.validation.status == "passed", report.validation.text()
    metrics = back.val(data=str(shapes), imgsz=IMGSZ, batch=4, workers=0)
    assert set(metrics) >= {"mAP50-95", "mAP50"}


def test_resume_continues_from_the_saved_epoch(shapes, tmp_path):
    model = LibreYOLO("LibreYOLO9t.yaml")
    first = model.train(data=str(shapes), epochs=1, project=str(tmp_path), name="r", **FAST)
    last = Path(first["save_dir"]) / "weights" / "last.pt"
    again = LibreYOLO(str(last)).train(resume=True, epochs=2, workers=0)
    assert again["save_dir"] == first["save_dir"]
    assert [int(r["epoch"]) for r in _rows(Path(first["save_dir"]))] == [1, 2]
    with pytest.raises(Exception, match="already finished"):
        LibreYOLO(str(last)).train(resume=True, epochs=2, workers=0)


def test_classifier_trains_and_reports_top1_top5(tmp_path):
    root = make_shapes_dataset(tmp_path / "cls", n_train=12, n_val=6, imgsz=224, seed=1, task="classify")
    model = LibreYOLO("LibreViTti-cls.yaml")
    summary = model.train(data=str(root), epochs=3, imgsz=224, batch=6, nbs=6, workers=0, optimizer="AdamW", lr0=1e-3,
                          warmup_epochs=0.0, project=str(tmp_path), name="cls", plots=False)
    rows = _rows(Path(summary["save_dir"]))
    assert _loss(rows[-1]) < _loss(rows[0]), [_loss(r) for r in rows]
    assert 0.0 <= float(rows[-1]["metrics/top1"]) <= float(rows[-1]["metrics/top5"]) <= 1.0
    assert LibreYOLO(summary["best"]).nc == 3


def test_cuda_graph_flag_never_stops_a_run_and_says_why_once(shapes, tmp_path, caplog):
    model = LibreYOLO("LibreYOLO9t.yaml")
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        summary = model.train(data=str(shapes), epochs=1, cuda_graph=True, project=str(tmp_path), val=False, **FAST)
    lines = [r.message for r in caplog.records if "cuda_graph" in r.message]
    assert len(lines) == 1 and "training eagerly" in lines[0]
    assert summary["graph"]["eager_batches"] == 2 and summary["graph"]["replays"] == 0


def test_cli_train_and_val_and_clean_errors(shapes, tmp_path, capsys):
    rc = cli_main(["train", "model=LibreYOLO9t.yaml", f"data={shapes}", "epochs=1", f"imgsz={IMGSZ}", "batch=4",
                   "workers=0", "mosaic=0", f"project={tmp_path}", "name=cli"])
    assert rc == 0
    best = tmp_path / "cli" / "weights" / "best.pt"
    assert best.is_file()
    assert cli_main(["val", f"model={best}", f"data={shapes}", f"imgsz={IMGSZ}", "workers=0"]) == 0
    assert "mAP50-95" in capsys.readouterr().out
    rc = cli_main(["train", "model=LibreYOLO9t.yaml", f"data={tmp_path / 'missing.yaml'}", "epochs=1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "missing.yaml" in err[0] and "Traceback" not in err[0]
    assert cli_main(["train", "model=LibreYOLO9t.yaml", f"data={shapes}", "epochs=0"]) == 2
    assert "epochs must be an integer from 1" in capsys.readouterr().err


def test_a_dataset_with_bad_files_trains_with_one_warning_each(shapes, tmp_path, caplog):
    import shutil

    root = tmp_path / "bad"
    shutil.copytree(shapes.parent, root)
    yaml_path = root / shapes.name
    yaml_path.write_text(yaml_path.read_text().replace(str(shapes.parent), str(root)))
    images = sorted((root / "images" / "train").iterdir())
    labels = root / "labels" / "train"
    images[0].write_bytes(b"not an image at all")  # corrupt image: skipped
    (labels / f"{images[1].stem}.txt").write_text("0 0.5 0.5 0.2\n")  # malformed line: dropped
    (labels / f"{images[2].stem}.txt").write_text("7 0.5 0.5 0.2 0.2\n")  # class id out of range: dropped
    (labels / f"{images[3].stem}.txt").write_text("1 1.5 1.5 0.2 0.2\n0 0.95 0.5 0.3 0.3\n")  # outside / clipped
    (labels / f"{images[4].stem}.txt").write_text("")  # empty: a background image
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        summary = LibreYOLO("LibreYOLO9t.yaml").train(data=str(yaml_path), epochs=1, project=str(tmp_path),
                                                      val=False, **FAST)
    text = "\n".join(r.getMessage() for r in caplog.records)
    for name in (images[0].name, images[1].stem, images[2].stem, images[3].stem):
        assert name in text, text
    assert Path(summary["last"]).is_file()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_gloo_ddp_run_finishes_and_only_rank0_writes(shapes, tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), "-m", "libreyolo.cli", "train", "model=LibreYOLO9t.yaml",
           f"data={shapes}", "epochs=1", f"imgsz={IMGSZ}", "batch=4", "workers=0", "mosaic=0", "device=cpu",
           f"project={tmp_path}", "name=ddp", "--cuda-graph"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [p for p in tmp_path.iterdir() if p.name.startswith("ddp")]
    assert len(runs) == 1, runs  # rank 1 made no run folder of its own
    assert (runs[0] / "weights" / "last.pt").is_file() and len(_rows(runs[0])) == 1
    assert torch.load(runs[0] / "weights" / "last.pt", weights_only=True)["train_state"]["epoch"] == 0
    logs = proc.stdout + proc.stderr
    assert "all 2 ranks hold bit-identical final weights" in logs, logs[-3000:]
    assert proc.stderr.count("cuda_graph=True") == 1, logs[-3000:]  # one reason line, from rank 0 only


def test_default_training_device_is_the_gpu_when_there_is_one(monkeypatch):
    from libreyolo.train import trainer as T

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert T._default_device(torch.device("cpu")) == torch.device("cuda", 0)
    assert T._default_device(torch.device("cuda", 1)) == torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert T._default_device(torch.device("cpu")) == torch.device("cpu")
