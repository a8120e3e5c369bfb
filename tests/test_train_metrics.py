"""Validation metrics, per-epoch records, optimizer groups, LR schedule, EMA and gradient clipping."""
from __future__ import annotations

import csv
import importlib.util
import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from libreyolo.errors import ArgumentError
from libreyolo.train.metrics import ClassifyMetrics, DetectionMetrics
from libreyolo.train.optim import LRSchedule, ModelEMA, build_optimizer, clip_gradients
from libreyolo.train.records import MetricsLog, flatten_row
from tests.numerics import assert_within_float32_noise

NAMES = {0: "cat", 1: "dog", 2: "bird"}
HAS_PYCOCOTOOLS = importlib.util.find_spec("pycocotools") is not None
HAS_FASTER_COCO_EVAL = importlib.util.find_spec("faster_coco_eval") is not None
needs_coco = pytest.mark.skipif(not HAS_FASTER_COCO_EVAL,
                                reason="COCO evaluation needs faster-coco-eval (pip install 'libreyolo[train]')")


def gt(boxes, classes):
    return {"xyxy": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4), "cls": torch.tensor(classes)}


def pred(boxes, confs, classes):
    return {"xyxy": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4), "conf": torch.tensor(confs),
            "cls": torch.tensor(classes)}


def shifted_iou(shift: float) -> float:
    """IoU of a 100x100 box and the same box moved right by ``shift`` pixels."""
    return (100 - shift) / (100 + shift)


# ----------------------------------------------------------------------------------------------- detection


@needs_coco
def test_perfect_predictions_give_map_one():
    metrics = DetectionMetrics(NAMES)
    boxes = [[10, 10, 110, 90], [200, 50, 260, 180]]
    metrics.update([pred(boxes, [0.9, 0.8], [0, 2])], [gt(boxes, [0, 2])])
    metrics.update([pred([[5, 5, 50, 60]], [0.7], [1])], [gt([[5, 5, 50, 60]], [1])])
    out = metrics.compute()
    assert out["mAP50-95"] == pytest.approx(1.0, abs=1e-6)
    assert out["mAP50"] == pytest.approx(1.0, abs=1e-6)
    assert out["precision"] == pytest.approx(1.0) and out["recall"] == pytest.approx(1.0)
    assert out["images"] == 2 and out["instances"] == 3
    assert metrics.ap_per_class == pytest.approx({"cat": 1.0, "dog": 1.0, "bird": 1.0})


@needs_coco
def test_iou_between_060_and_065_passes_three_of_ten_thresholds():
    shift = 23.0  # IoU 77/123 = 0.626: a true positive at 0.50, 0.55, 0.60 only
    assert 0.6 < shifted_iou(shift) < 0.65
    metrics = DetectionMetrics(NAMES)
    metrics.update([pred([[shift, 0, 100 + shift, 100]], [0.9], [0])], [gt([[0, 0, 100, 100]], [0])])
    out = metrics.compute()
    assert out["mAP50"] == pytest.approx(1.0, abs=1e-6)
    assert out["mAP50-95"] == pytest.approx(0.3, abs=1e-6)  # AP 1 at 3 of COCO's 10 thresholds, 0 at the rest


@needs_coco
def test_wrong_class_gives_zero():
    metrics = DetectionMetrics(NAMES)
    metrics.update([pred([[0, 0, 100, 100]], [0.9], [1])], [gt([[0, 0, 100, 100]], [0])])
    out = metrics.compute()
    assert out["mAP50-95"] == 0.0 and out["mAP50"] == 0.0
    assert out["precision"] == 0.0 and out["recall"] == 0.0


@needs_coco
def test_empty_predictions_give_zeros():
    metrics = DetectionMetrics(NAMES)
    empty = {"xyxy": torch.zeros(0, 4), "conf": torch.zeros(0), "cls": torch.zeros(0, dtype=torch.long)}
    metrics.update([empty, empty], [gt([[0, 0, 10, 10]], [0]), gt([], [])])
    out = metrics.compute()
    assert out == {"mAP50-95": 0.0, "mAP50": 0.0, "precision": 0.0, "recall": 0.0, "images": 2, "instances": 1}
    assert DetectionMetrics(NAMES).compute()["images"] == 0  # nothing at all: zeros too


@needs_coco
def test_images_without_ground_truth_count_and_add_false_positives():
    base = [([[0, 0, 100, 100]], [0.5], [0]), ([[0, 0, 100, 100]], [0])]
    clean = DetectionMetrics(NAMES)
    clean.update([pred(*base[0])], [gt(*base[1])])
    clean.update([pred([], [], [])], [gt([], [])])  # an empty image: counted, changes nothing
    noisy = DetectionMetrics(NAMES)
    noisy.update([pred(*base[0])], [gt(*base[1])])
    noisy.update([pred([[0, 0, 50, 50]], [0.9], [0])], [gt([], [])])  # a confident false positive elsewhere
    clean_out, noisy_out = clean.compute(), noisy.compute()
    assert clean_out["images"] == noisy_out["images"] == 2
    assert clean_out["mAP50"] == pytest.approx(1.0)
    assert noisy_out["mAP50"] < 0.6  # ranked first, the false positive halves precision at full recall


def test_mismatched_batch_is_a_clear_error():
    with pytest.raises(ArgumentError, match="one prediction dict per ground-truth"):
        DetectionMetrics(NAMES).update([pred([], [], [])], [])
    with pytest.raises(ArgumentError, match=r"\(n, 4\)"):
        DetectionMetrics(NAMES).update([{"xyxy": torch.zeros(2, 3), "conf": torch.zeros(2), "cls": torch.zeros(2)}],
                                       [gt([], [])])


def random_dataset(seed: int, n_images: int = 12):
    """Ground truth and noisy predictions (jittered boxes, some misses, some false positives, some wrong classes)."""
    rng = np.random.default_rng(seed)
    preds, gts = [], []
    for _ in range(n_images):
        m = int(rng.integers(0, 6))
        xy = rng.uniform(0, 400, (m, 2))
        wh = rng.uniform(8, 150, (m, 2))
        boxes = np.concatenate([xy, xy + wh], 1)
        classes = rng.integers(0, 3, m)
        keep = rng.random(m) > 0.2
        jitter = rng.normal(0, 6, (m, 4))
        p_boxes = (boxes + jitter)[keep]
        p_cls = np.where(rng.random(m) < 0.1, (classes + 1) % 3, classes)[keep]
        n_fp = int(rng.integers(0, 3))
        fp_xy = rng.uniform(0, 400, (n_fp, 2))
        p_boxes = np.concatenate([p_boxes, np.concatenate([fp_xy, fp_xy + rng.uniform(8, 100, (n_fp, 2))], 1)])
        p_cls = np.concatenate([p_cls, rng.integers(0, 3, n_fp)])
        p_conf = rng.uniform(0.05, 1.0, len(p_cls))
        preds.append(pred(p_boxes.tolist(), p_conf.tolist(), p_cls.tolist()))
        gts.append(gt(boxes.tolist(), classes.tolist()))
    return preds, gts


def direct_coco_dicts(preds, gts):
    """The same data in COCO's format, written independently of libreyolo (category ids = class + 1)."""
    images, anns, dets = [], [], []
    for i, (p, g) in enumerate(zip(preds, gts, strict=True)):
        images.append({"id": i + 1})
        for (x1, y1, x2, y2), c in zip(g["xyxy"].tolist(), g["cls"].tolist(), strict=True):
            anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": c + 1, "iscrowd": 0,
                         "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1)})
        for (x1, y1, x2, y2), s, c in zip(p["xyxy"].tolist(), p["conf"].tolist(), p["cls"].tolist(), strict=True):
            dets.append({"image_id": i + 1, "category_id": c + 1, "bbox": [x1, y1, x2 - x1, y2 - y1], "score": s})
    cats = [{"id": k + 1, "name": v} for k, v in NAMES.items()]
    return {"images": images, "annotations": anns, "categories": cats}, dets


def stats_faster_coco_eval(dataset, dets):
    from faster_coco_eval import COCO, COCOeval_faster

    coco_gt = COCO(dataset)
    evaluator = COCOeval_faster(coco_gt, coco_gt.loadRes(dets), iouType="bbox")
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    return evaluator.stats[:2]


def stats_pycocotools(dataset, dets, capsys):
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    coco_gt = COCO()
    coco_gt.dataset = dataset
    coco_gt.createIndex()
    evaluator = COCOeval(coco_gt, coco_gt.loadRes(dets), "bbox")
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    capsys.readouterr()
    return evaluator.stats[:2]


@needs_coco
def test_noisy_case_matches_coco_libraries_called_directly(capsys):
    preds, gts = random_dataset(seed=3)
    metrics = DetectionMetrics(NAMES)
    metrics.update(preds[:5], gts[:5])  # in two batches
    metrics.update(preds[5:], gts[5:])
    out = metrics.compute()
    assert capsys.readouterr().out == ""  # the evaluator's progress text does not reach stdout
    assert 0.1 < out["mAP50-95"] < out["mAP50"] < 1.0  # a non-trivial case
    assert 0 < out["precision"] < 1 and 0 < out["recall"] < 1
    reference = stats_faster_coco_eval(*direct_coco_dicts(preds, gts))
    assert out["mAP50-95"] == pytest.approx(reference[0], abs=1e-9)
    assert out["mAP50"] == pytest.approx(reference[1], abs=1e-9)
    if HAS_PYCOCOTOOLS:
        other = stats_pycocotools(*direct_coco_dicts(preds, gts), capsys)
        assert other == pytest.approx(reference, abs=1e-6)


@needs_coco
@pytest.mark.skipif(not HAS_PYCOCOTOOLS, reason="pycocotools is not installed (the fallback evaluator)")
def test_pycocotools_fallback_gives_the_same_numbers(monkeypatch, capsys):
    import sys

    preds, gts = random_dataset(seed=5)
    metrics = DetectionMetrics(NAMES)
    metrics.update(preds, gts)
    first = metrics.compute()
    monkeypatch.setitem(sys.modules, "faster_coco_eval", None)  # import now fails: the fallback is used
    second = metrics.compute()
    assert capsys.readouterr().out == ""
    assert second == pytest.approx(first, abs=1e-6)


def test_missing_evaluators_name_the_extra(monkeypatch):
    import sys

    from libreyolo.errors import MissingDependencyError

    for module in ("faster_coco_eval", "pycocotools", "pycocotools.coco", "pycocotools.cocoeval"):
        monkeypatch.setitem(sys.modules, module, None)
    metrics = DetectionMetrics(NAMES)
    metrics.update([pred([[0, 0, 9, 9]], [0.5], [0])], [gt([[0, 0, 9, 9]], [0])])
    with pytest.raises(MissingDependencyError, match=r"pip install 'libreyolo\[train\]'"):
        metrics.compute()


@needs_coco
def test_precision_recall_at_best_f1():
    # 4 ground truths of one class; detections: TP 0.9, TP 0.8, FP 0.7, TP 0.3 (and one GT missed)
    boxes = [[0, 0, 10, 10], [20, 0, 30, 10], [40, 0, 50, 10], [60, 0, 70, 10]]
    p_boxes = [boxes[0], boxes[1], [100, 100, 110, 110], boxes[2]]
    metrics = DetectionMetrics(NAMES)
    metrics.update([pred(p_boxes, [0.9, 0.8, 0.7, 0.3], [0, 0, 0, 0])], [gt(boxes, [0] * 4)])
    out = metrics.compute()
    # F1 at conf > 0.7: P 1, R 0.5 -> 0.667; at conf <= 0.3: P 0.75, R 0.75 -> 0.75 (the best)
    assert out["precision"] == pytest.approx(0.75) and out["recall"] == pytest.approx(0.75)


# ----------------------------------------------------------------------------------------------- classify


def test_classify_top1_top5():
    logits = torch.tensor([
        [9.0, 1, 2, 3, 4, 5, 6],  # label 0: top-1 hit
        [1.0, 9, 2, 3, 4, 5, 6],  # label 4: top-5 hit (rank 4)
        [6.0, 5, 4, 3, 2, 1, 9],  # label 5: rank 6, miss
        [0.0, 0, 0, 9, 0, 0, 0],  # label 3: top-1 hit
    ])
    metrics = ClassifyMetrics()
    metrics.update(logits[:2], torch.tensor([0, 4]))
    metrics.update(logits[2:], torch.tensor([5, 3]))
    assert metrics.compute() == {"top1": pytest.approx(0.5), "top5": pytest.approx(0.75)}


def test_classify_fewer_than_five_classes_and_empty():
    metrics = ClassifyMetrics()
    assert metrics.compute() == {"top1": 0.0, "top5": 0.0}
    metrics.update(torch.tensor([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1]]), torch.tensor([0, 0]))
    assert metrics.compute() == {"top1": pytest.approx(0.5), "top5": pytest.approx(1.0)}


# ----------------------------------------------------------------------------------------------- records


def epoch_row(epoch: int) -> dict:
    return {"epoch": epoch, "losses": {"box": 2.0 / epoch, "cls": torch.tensor(1.5 / epoch)},
            "lr": [0.01 * epoch, 0.02], "metrics": {"mAP50-95": 0.1 * epoch, "mAP50": np.float32(0.2 * epoch)},
            "seconds": 3.5}


def test_metrics_log_round_trips_csv_and_json_without_leftovers(tmp_path):
    log = MetricsLog(tmp_path / "run")
    rows = [epoch_row(e) for e in (1, 2, 3)]
    for row in rows:
        log.append(row)
        assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["results.csv", "results.json"]
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved[2]["losses"]["cls"] == pytest.approx(0.5) and saved[1]["lr"] == [0.02, 0.02]
    assert saved[0]["metrics"]["mAP50"] == pytest.approx(0.2, abs=1e-6)
    with open(tmp_path / "run" / "results.csv", newline="") as handle:
        table = list(csv.DictReader(handle))
    assert list(table[0]) == ["epoch", "losses/box", "losses/cls", "lr/0", "lr/1", "metrics/mAP50-95",
                              "metrics/mAP50", "seconds"]
    for written, epoch in zip(table, (1, 2, 3), strict=True):
        expected = {"epoch": epoch, "losses/box": 2.0 / epoch, "losses/cls": 1.5 / epoch, "lr/0": 0.01 * epoch,
                    "lr/1": 0.02, "metrics/mAP50-95": 0.1 * epoch, "metrics/mAP50": 0.2 * epoch, "seconds": 3.5}
        assert {k: float(v) for k, v in written.items()} == pytest.approx(expected, rel=1e-6)
    assert flatten_row(rows[0])["losses/cls"] is rows[0]["losses"]["cls"]


def test_metrics_log_new_columns_and_resume(tmp_path):
    log = MetricsLog(tmp_path)
    log.append({"epoch": 1, "loss": 1.0})
    log.append({"epoch": 2, "loss": 0.5, "fitness": 0.3})
    with open(tmp_path / "results.csv", newline="") as handle:
        table = list(csv.DictReader(handle))
    assert table == [{"epoch": "1", "loss": "1.0", "fitness": ""}, {"epoch": "2", "loss": "0.5", "fitness": "0.3"}]
    resumed = MetricsLog(tmp_path, resume=True)
    resumed.append({"epoch": 3, "loss": 0.25})
    assert [row["epoch"] for row in json.loads((tmp_path / "results.json").read_text())] == [1, 2, 3]


def test_metrics_log_plot(tmp_path):
    pytest.importorskip("matplotlib", reason="plots need matplotlib")
    log = MetricsLog(tmp_path)
    assert log.plot() is None  # nothing to plot yet
    for epoch in (1, 2, 3):
        log.append(epoch_row(epoch))
    path = log.plot()
    assert path == tmp_path / "results.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.csv", "results.json", "results.png"]


def test_metrics_log_plot_without_matplotlib(tmp_path, monkeypatch, caplog):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    log = MetricsLog(tmp_path)
    log.append({"epoch": 1, "loss": 1.0})
    with caplog.at_level("INFO", logger="libreyolo"):
        assert log.plot() is None
    assert "libreyolo[train]" in caplog.text
    assert not (tmp_path / "results.png").exists()


# ----------------------------------------------------------------------------------------------- optim


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.norm = nn.LayerNorm(4)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        x = self.bn(self.conv(x)).mean((2, 3))
        return self.head(self.norm(x))


def test_optimizer_groups_decay_only_weights():
    model = TinyNet()
    optimizer = build_optimizer(model, "SGD", lr=0.02, momentum=0.9, weight_decay=1e-3)
    groups = {g["name"]: g for g in optimizer.param_groups}
    ids = {name: {id(p) for p in g["params"]} for name, g in groups.items()}
    assert ids["weight"] == {id(model.conv.weight), id(model.head.weight)}
    assert ids["norm"] == {id(model.bn.weight), id(model.norm.weight)}
    assert ids["bias"] == {id(model.bn.bias), id(model.norm.bias), id(model.head.bias)}
    assert groups["weight"]["weight_decay"] == 1e-3
    assert groups["norm"]["weight_decay"] == 0.0 and groups["bias"]["weight_decay"] == 0.0
    assert all(g["lr"] == 0.02 and g["momentum"] == 0.9 and g["nesterov"] for g in optimizer.param_groups)
    assert isinstance(build_optimizer(model), torch.optim.SGD)  # "auto"
    adamw = build_optimizer(model, "adamw", momentum=0.9)
    assert isinstance(adamw, torch.optim.AdamW) and adamw.param_groups[0]["betas"] == (0.9, 0.999)
    with pytest.raises(ArgumentError, match="auto, SGD, AdamW"):
        build_optimizer(model, "lion")


def test_lr_schedule_key_values():
    model = TinyNet()
    optimizer = build_optimizer(model, "SGD", lr=0.01, momentum=0.937)
    epochs, steps = 10, 50
    schedule = LRSchedule(optimizer, epochs, steps, lrf=0.01, warmup_epochs=3, warmup_bias_lr=0.1,
                          warmup_momentum=0.8, momentum=0.937)
    assert schedule.warmup_steps == 150
    total = epochs * steps

    def lrs(step):
        schedule.step(step)
        return {g["name"]: g["lr"] for g in optimizer.param_groups}, optimizer.param_groups[0]["momentum"]

    def cosine(step):
        return 0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * step / (total - 1)))

    start, momentum = lrs(0)
    assert start["bias"] == pytest.approx(0.1) and start["weight"] == 0.0 and start["norm"] == 0.0
    assert momentum == pytest.approx(0.8)
    mid_warmup, momentum = lrs(75)
    assert mid_warmup["weight"] == pytest.approx(0.5 * 0.01 * cosine(75))
    assert mid_warmup["bias"] == pytest.approx(0.1 + (0.01 * cosine(75) - 0.1) * 0.5)
    assert momentum == pytest.approx(0.8 + 0.137 * 0.5)
    end_warmup, momentum = lrs(150)
    assert all(v == pytest.approx(0.01 * cosine(150)) for v in end_warmup.values())
    assert momentum == pytest.approx(0.937)
    middle, _ = lrs((total - 1) // 2)
    assert middle["weight"] == pytest.approx(0.01 * cosine((total - 1) // 2))
    assert middle["weight"] == pytest.approx(0.01 * (0.01 + 0.99 * 0.5), rel=1e-2)  # half way down the cosine
    end, _ = lrs(total - 1)
    assert all(v == pytest.approx(0.01 * 0.01) for v in end.values())

    linear = LRSchedule(optimizer, epochs, steps, cos=False, lrf=0.1, warmup_epochs=0)
    linear.step(0)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01)
    linear.step((total - 1) / 2)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * (1 - 0.9 * ((total - 1) // 2) / (total - 1)))
    linear.step(total - 1)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.001)


def test_lr_schedule_minimum_warmup_state_and_adamw_betas():
    model = TinyNet()
    optimizer = build_optimizer(model, "AdamW", lr=0.001)
    schedule = LRSchedule(optimizer, 2, 5, warmup_epochs=1)  # 5 warm-up steps requested: 100 is the minimum
    assert schedule.warmup_steps == 100
    schedule.step(3)
    assert optimizer.param_groups[0]["betas"][0] == pytest.approx(0.8 + 0.137 * 3 / 100)
    state = schedule.state_dict()
    lrs = [g["lr"] for g in optimizer.param_groups]
    fresh_optimizer = build_optimizer(model, "AdamW", lr=0.001)
    restored = LRSchedule(fresh_optimizer, 99, 99)
    restored.load_state_dict(state)
    assert restored.state_dict() == state
    assert [g["lr"] for g in fresh_optimizer.param_groups] == pytest.approx(lrs)


def test_ema_converges_to_fixed_weights_and_keeps_buffers():
    torch.manual_seed(0)
    model = TinyNet()
    ema = ModelEMA(model, decay=0.9, tau=1)
    assert not ema.module.training and not any(p.requires_grad for p in ema.module.parameters())
    model.train()
    model(torch.randn(8, 3, 6, 6))  # updates BatchNorm running stats (buffers)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    first = ema.module.conv.weight.clone()
    ema.update(model)
    d = 0.9 * (1 - math.exp(-1))
    w = model.conv.weight.detach()
    exact = d * first.double() + (1 - d) * w.double()
    assert_within_float32_noise(ema.module.conv.weight, d * first + (1 - d) * w, exact)
    for _ in range(200):
        ema.update(model)
    for (name, ours), theirs in zip(ema.module.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.allclose(ours, theirs.to(ours.dtype), atol=1e-6), name
    assert ema.module.bn.num_batches_tracked.item() == 1
    assert ema.module.bn.running_mean.abs().sum() > 0
    state = ema.state_dict()
    assert state["updates"] == 201
    other = ModelEMA(TinyNet())
    other.load_state_dict(state)
    assert other.updates == 201 and torch.equal(other.module.head.weight, ema.module.head.weight)


def test_ema_keeps_fp32_master_weights_for_a_half_model():
    model = TinyNet().half()
    ema = ModelEMA(model)
    assert all(v.dtype == torch.float32 for v in ema.module.state_dict().values() if v.is_floating_point())
    ema.update(model)
    assert model.conv.weight.dtype == torch.float16  # the trained model is not touched


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_ema_under_autocast_on_cuda():
    model = TinyNet().cuda()
    optimizer = build_optimizer(model, "SGD", lr=0.1)
    ema = ModelEMA(model, tau=1)
    for _ in range(3):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(torch.randn(4, 3, 8, 8, device="cuda")).float().square().mean()
        loss.backward()
        assert math.isfinite(clip_gradients(model, 10.0))
        optimizer.step()
        optimizer.zero_grad()
        ema.update(model)
    assert ema.module.conv.weight.device.type == "cuda" and ema.module.conv.weight.dtype == torch.float32


def test_clip_gradients_total_norm_and_non_finite():
    model = nn.Linear(3, 1, bias=True)
    assert clip_gradients(model) == 0.0  # no gradients yet
    model.weight.grad = torch.tensor([[3.0, 0.0, 0.0]])
    model.bias.grad = torch.tensor([4.0])
    assert clip_gradients(model, max_norm=1.0) == pytest.approx(5.0)
    total = torch.cat([model.weight.grad.flatten(), model.bias.grad]).norm()
    assert total.item() == pytest.approx(1.0, rel=1e-4)
    assert clip_gradients(model, max_norm=10.0) == pytest.approx(1.0, rel=1e-4)  # under the limit: unchanged
    model.bias.grad = torch.tensor([float("inf")])
    assert not math.isfinite(clip_gradients(model, max_norm=1.0))
    assert model.weight.grad[0, 0].item() == pytest.approx(0.6, rel=1e-4)  # left untouched
