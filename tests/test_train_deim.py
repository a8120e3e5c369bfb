"""DEIM training: the matchability-aware class term (MAL) and train() on the shapes dataset.

DEIM (and RT-DETRv4, which the reference fine-tunes with DEIM's trainer) train D-FINE's network
with D-FINE's recipe here except for the class term: MAL instead of the varifocal loss."""
from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch

from libreyolo.models.registry import get_family
from libreyolo.train.loss import loss_for
from libreyolo.train.loss.detr import DetrLoss, MalLoss

pytest.importorskip("scipy", reason="DETR training needs libreyolo[train] (scipy)")


def test_mal_class_term_follows_its_definition():
    """MAL, written out per element in float64: positives (query, class) pulled to IoU ** 1.5 with
    weight 1, every other element pushed to 0 with weight p ** 1.5; summed."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 3, generator=g, dtype=torch.float64) * 2
    target = torch.zeros_like(logits)
    positive = torch.zeros_like(logits, dtype=torch.bool)
    for b, q, c, iou in ((0, 1, 2, 0.8), (0, 3, 0, 0.3), (1, 4, 1, 0.55)):
        target[b, q, c], positive[b, q, c] = iou, True
    got = MalLoss(3)._class_term(logits, target, positive)
    want = 0.0
    for b in range(2):
        for q in range(5):
            for c in range(3):
                x = float(logits[b, q, c])
                p = 1 / (1 + math.exp(-x))
                t, w = (float(target[b, q, c]) ** 1.5, 1.0) if positive[b, q, c] else (0.0, p ** 1.5)
                want += -w * (t * math.log(p) + (1 - t) * math.log(1 - p))
    assert float(got) == pytest.approx(want, rel=1e-12)
    # not the varifocal term (which weights positives by their IoU and negatives by 0.75 p ** 2)
    assert abs(float(DetrLoss(3)._class_term(logits, target, positive)) - want) > 0.1


def test_deim_and_rtdetrv4_train_with_mal():
    for name in ("deim", "rtdetrv4"):
        fam = get_family(name)
        assert isinstance(loss_for(name, "detect", 3), MalLoss)
        assert fam.training_items[0] == "mal_loss"
    assert type(loss_for("dfine", "detect", 3)) is DetrLoss


@pytest.mark.parametrize("name,size", [("deim", "n")])
def test_a_few_steps_on_a_fixed_batch_make_the_mal_loss_fall(name, size):
    """As for D-FINE in tests/test_train_detr.py (14 AdamW steps at 1e-3 on one batch of two 64 px
    images, the same denoising noise each step), with DEIM's criterion."""
    from tests.test_train_detr import NC, TARGETS, _images, _net

    family, net = _net(name, size)
    criterion = loss_for(name, "detect", NC)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x = _images()
    losses = []
    for _ in range(14):
        torch.manual_seed(0)
        loss, items = criterion(family.train_decode(net, family.train_encode(net, x), TARGETS), TARGETS)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert items.shape == (4,) and bool(torch.isfinite(items).all())
    assert losses[-1] < 0.85 * losses[0], losses


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """deim-n trained from its YAML on a tiny shapes dataset at 64 px."""
    pytest.importorskip("faster_coco_eval", reason="training metrics need libreyolo[train] (faster-coco-eval)")
    from libreyolo import LibreYOLO
    from libreyolo.train.shapes import make_shapes_dataset

    tmp = tmp_path_factory.mktemp("deim-train")
    data = make_shapes_dataset(tmp / "shapes", n_train=4, n_val=2, imgsz=IMGSZ, seed=0)
    model = LibreYOLO("LibreDEIMn.yaml")
    summary = model.train(data=str(data), epochs=EPOCHS, imgsz=IMGSZ, batch=2, nbs=2, workers=0, mosaic=0.0,
                          lr0=1e-3, warmup_epochs=0.0, project=str(tmp), name="deim", plots=False, seed=0)
    return data, Path(summary["save_dir"])


IMGSZ = 64
EPOCHS = 2


def test_deim_trains_on_shapes_with_finite_mal_terms(trained):
    """Two epochs end to end (the falling loss is checked on a fixed batch above: over two epochs of
    two steps the total is dominated by the matching's reshuffles)."""
    _, run = trained
    with open(run / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == EPOCHS
    items = ("mal_loss", "l1_loss", "giou_loss", "fgl_loss")
    values = [float(r[f"train/{k}"]) for r in rows for k in items]
    assert all(math.isfinite(v) and v > 0 for v in values), rows


def test_deim_best_checkpoint_loads_predicts_and_exports(trained, tmp_path):
    pytest.importorskip("onnxruntime")
    from libreyolo import LibreYOLO

    data, run = trained
    best = run / "weights" / "best.pt"
    back = LibreYOLO(str(best))
    assert (back.family.name, back.size, back.nc) == ("deim", "n", 3)
    image = str(next((data.parent / "images" / "val").iterdir()))
    assert back(image, imgsz=IMGSZ, conf=0.0) is not None
    report = back.export(format="onnx", imgsz=IMGSZ, output=str(tmp_path / "deim.onnx"), verbose=False)
    assert report.validation.status == "passed", report.validation.text()
    assert LibreYOLO(report.path).family.name == "deim"
