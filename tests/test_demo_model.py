"""The bundled demo detector (YOLOv9-t trained on the synthetic shapes dataset by tools/train_demo.py)
finds the shapes of the bundled held-out image, with scores spread like a trained detector's."""
from __future__ import annotations

import json

import torch
from PIL import Image

from libreyolo import SHAPES_IMAGE, LibreYOLO
from libreyolo.assets import ASSETS, DEMO_MODEL
from libreyolo.ops.boxes import box_iou
from libreyolo.train.shapes import CLASSES, sample_with_boxes

SEED = 12345  # the held-out image's seed (tools/train_demo.py draws shapes.jpg from it)


def test_the_demo_detector_finds_every_shape_of_the_held_out_image():
    model = LibreYOLO(DEMO_MODEL)  # resolved from the package's assets, not the Hub
    assert model.family.name == "yolo9" and model.size == "t"
    assert model.names == dict(enumerate(CLASSES))
    truth_image, objects = sample_with_boxes(SEED, 640)
    assert Image.open(SHAPES_IMAGE).size == truth_image.size
    result = model(SHAPES_IMAGE, conf=0.25)
    boxes, cls = result.boxes.xyxy.float(), result.boxes.cls.long()
    gt = torch.tensor([list(b) for _, b in objects], dtype=torch.float32)
    gt_cls = torch.tensor([c for c, _ in objects])
    iou = box_iou(gt, boxes) if len(boxes) else torch.zeros(len(gt), 0)
    found = [bool(((iou[i] >= 0.5) & (cls == gt_cls[i])).any()) for i in range(len(gt))]
    assert all(found), (objects, boxes.tolist(), cls.tolist())
    assert len(boxes) <= len(objects) + 1, "false positives at conf 0.25"


def test_on_twenty_more_held_out_images_it_finds_the_shapes_with_scores_spread_like_a_trained_detectors():
    """Images drawn from seeds the training set never used: the boxes are found at conf 0.25 with
    few false positives, and at conf 0.001 the scores split into confident hits and a low tail
    (a trained detector's spread, not an untrained model's wall of near-equal scores)."""
    model = LibreYOLO(DEMO_MODEL)
    found = total = false_pos = 0
    scores: list[float] = []
    for seed in range(1000, 1020):
        image, objects = sample_with_boxes(seed, 640)
        result = model(image, conf=0.25)
        boxes, cls = result.boxes.xyxy.float(), result.boxes.cls.long()
        gt = torch.tensor([list(b) for _, b in objects], dtype=torch.float32)
        gt_cls = torch.tensor([c for c, _ in objects])
        iou = box_iou(gt, boxes) if len(boxes) else torch.zeros(len(gt), 0)
        hits = sum(bool(((iou[i] >= 0.5) & (cls == gt_cls[i])).any()) for i in range(len(gt)))
        found, total, false_pos = found + hits, total + len(gt), false_pos + len(boxes) - hits
        scores += model(image, conf=0.001).boxes.conf.tolist()
    assert found >= 0.95 * total, (found, total)
    assert false_pos <= 2, false_pos
    conf = torch.tensor(scores)
    assert int((conf > 0.7).sum()) >= 0.9 * total  # confident on the real shapes
    assert int((conf < 0.1).sum()) >= 0.3 * total  # and a tail of low scores
    assert len(set(scores)) > 0.9 * len(scores)


def test_the_demo_detector_records_how_it_was_made():
    record = json.loads((ASSETS / "LibreYOLO9t-shapes.json").read_text())
    assert record["command"].startswith("python tools/train_demo.py")
    assert record["dataset"]["seed"] == 0 and record["val_metrics_best"]["mAP50"] > 0.5


def test_make_demo_export_of_the_trained_detector_validates(tmp_path):
    """What `make demo` runs: a trained model's ONNX export must pass validation (a relative
    tolerance tuned on untrained weights once failed it on the ramps probe)."""
    report = LibreYOLO(DEMO_MODEL).export(format="onnx", output=tmp_path / "shapes.onnx", verbose=False)
    assert report.validation.status == "passed", report.validation.text()
    art = LibreYOLO(tmp_path / "shapes.onnx")
    truth = sorted(c for c, _ in sample_with_boxes(SEED, 640)[1])
    assert sorted(art(SHAPES_IMAGE, conf=0.25).boxes.cls.tolist()) == truth
