"""Training losses: CIoU, task-aligned assignment, DFL, the YOLOv9 detection loss, classification
loss and the loss registry. CPU-only and small (imgsz 64, yolo9-t)."""
from __future__ import annotations

import math
import time

import pytest
import torch

from libreyolo.errors import ArgumentError, LibreYOLOError
from libreyolo.models.yolo9.network import YOLOv9, decode_dfl
from libreyolo.ops.boxes import bbox_ciou
from libreyolo.train.loss import loss_for
from libreyolo.train.loss.assign import TaskAlignedAssigner
from libreyolo.train.loss.classify import ClassificationLoss
from libreyolo.train.loss.yolo9 import DetectionLoss, bbox_to_ltrb, distribution_focal_loss, make_anchors

NC = 3
CH = 4 * 16 + NC


def _raw(b: int = 2, imgsz: int = 64, seed: int = 0, requires_grad: bool = False) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, CH, imgsz // s, imgsz // s, generator=g).requires_grad_(requires_grad) for s in (8, 16, 32)]


def _targets() -> torch.Tensor:
    return torch.tensor([[0, 1, 8, 10, 40, 50], [1, 0, 20, 5, 60, 30], [1, 2, 2, 2, 20, 20]], dtype=torch.float32)


# --- CIoU ---------------------------------------------------------------------------------------
def test_ciou_of_identical_boxes_is_one():
    box = torch.tensor([[3.0, 4.0, 30.0, 12.0], [0.0, 0.0, 1.0, 5.0]])
    assert torch.allclose(bbox_ciou(box, box), torch.ones(2), atol=1e-5)


def test_ciou_of_disjoint_boxes_is_the_negative_centre_distance_term():
    # no overlap, same shape: CIoU = -rho^2/c^2 = -(2^2) / (3^2 + 1^2)
    ciou = bbox_ciou(torch.tensor([0.0, 0.0, 1.0, 1.0]), torch.tensor([2.0, 0.0, 3.0, 1.0]))
    assert ciou < 0
    assert ciou.item() == pytest.approx(-0.4, abs=1e-5)


def test_ciou_matches_a_hand_computed_value_with_the_aspect_term():
    # IoU 2/4; centres (1, 1) and (1, 0.5); enclosing box 2x2; aspect angles atan(1) and atan(2)
    v = 4 / math.pi**2 * (math.atan(2.0) - math.atan(1.0)) ** 2
    expected = 0.5 - 0.25 / 8 - v * v / (v - 0.5 + 1)
    ciou = bbox_ciou(torch.tensor([0.0, 0.0, 2.0, 2.0]), torch.tensor([0.0, 0.0, 2.0, 1.0]))
    assert ciou.item() == pytest.approx(expected, abs=1e-5)


def test_ciou_broadcasts_elementwise():
    a = torch.tensor([[0.0, 0.0, 2.0, 2.0], [5.0, 5.0, 6.0, 6.0]])
    b = torch.tensor([0.0, 0.0, 2.0, 2.0])
    out = bbox_ciou(a, b)
    assert out.shape == (2,)
    assert out[0].item() == pytest.approx(1.0, abs=1e-5) and out[1] < 0


# --- assigner -----------------------------------------------------------------------------------
def _assign(assigner, scores, preds, anchors, labels, gts, mask):
    return assigner(scores, preds, anchors, labels, gts, mask)


def test_assigner_takes_only_anchors_whose_centre_is_inside_the_box():
    anchors = torch.tensor([[5.0, 5.0], [15.0, 5.0], [25.0, 5.0], [50.0, 50.0], [35.0, 5.0]])
    gt = torch.tensor([[[0.0, 0.0, 30.0, 10.0]]])
    preds = gt.expand(1, 5, 4).clone()  # every prediction equals the box: IoU 1
    scores = torch.full((1, 5, 2), 0.5)
    labels, boxes, tscores, fg, idx = TaskAlignedAssigner(topk=10, num_classes=2)(
        scores, preds, anchors, torch.tensor([[[1.0]]]), gt, torch.ones(1, 1, 1))
    assert fg.tolist() == [[True, True, True, False, False]]
    assert labels.tolist() == [[1, 1, 1, 2, 2]]  # background -> num_classes
    assert torch.equal(boxes[0, :3], gt[0].expand(3, 4)) and not boxes[0, 3:].any()
    assert idx.tolist() == [[0, 0, 0, 0, 0]]
    assert not tscores[0, :, 0].any() and torch.allclose(tscores[0, :3, 1], torch.ones(3))


def test_assigner_keeps_the_topk_best_aligned_anchors_and_normalises_their_scores():
    xs = torch.arange(20, dtype=torch.float32) * 2 + 1
    anchors = torch.stack((xs, torch.full_like(xs, 5.0)), -1)  # 20 anchors, all inside the box
    gt = torch.tensor([[[0.0, 0.0, 40.0, 10.0]]])
    preds = gt.expand(1, 20, 4).clone()
    prob = torch.linspace(0.05, 0.9, 20)[torch.randperm(20, generator=torch.Generator().manual_seed(1))]
    scores = prob.view(1, 20, 1)
    _, _, tscores, fg, _ = TaskAlignedAssigner(topk=3, num_classes=1)(
        scores, preds, anchors, torch.zeros(1, 1, 1), gt, torch.ones(1, 1, 1))
    best = prob.topk(3).indices
    assert fg.sum() == 3 and fg[0, best].all()
    # metric = sqrt(score) * IoU^6 with IoU 1; normalised so the best anchor gets the max IoU (1)
    expected = prob[best].sqrt() / prob[best].sqrt().max()
    assert torch.allclose(tscores[0, best, 0], expected, atol=1e-5)
    assert not tscores[0, ~fg[0], 0].any()


def test_assigner_scales_targets_by_the_best_iou_of_the_box():
    anchors = torch.tensor([[5.0, 5.0], [15.0, 5.0]])
    gt = torch.tensor([[[0.0, 0.0, 20.0, 10.0]]])
    preds = torch.tensor([[[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 20.0, 5.0]]])  # IoU 0.5 each
    _, _, tscores, fg, _ = TaskAlignedAssigner(topk=10, num_classes=1)(
        torch.full((1, 2, 1), 0.3), preds, anchors, torch.zeros(1, 1, 1), gt, torch.ones(1, 1, 1))
    assert fg.all()
    assert torch.allclose(tscores[0, :, 0], torch.full((2,), 0.5), atol=1e-5)


def test_assigner_resolves_an_anchor_claimed_by_two_boxes_to_the_higher_iou():
    anchors = torch.tensor([[10.0, 10.0], [2.0, 2.0], [18.0, 18.0]])
    gts = torch.tensor([[[0.0, 0.0, 16.0, 16.0], [4.0, 4.0, 20.0, 20.0]]])  # both hold anchor 0
    preds = torch.tensor([[[4.0, 4.0, 19.0, 19.0], [0.0, 0.0, 15.0, 15.0], [5.0, 5.0, 20.0, 20.0]]])
    labels, boxes, _, fg, idx = TaskAlignedAssigner(topk=10, num_classes=4)(
        torch.full((1, 3, 4), 0.5), preds, anchors, torch.tensor([[[0.0], [3.0]]]), gts, torch.ones(1, 2, 1))
    assert fg.all()
    assert idx.tolist() == [[1, 0, 1]]  # anchor 0's prediction overlaps the second box more
    assert labels.tolist() == [[3, 0, 3]]
    assert torch.equal(boxes[0, 0], gts[0, 1])


def test_assigner_gives_no_foreground_without_boxes_or_for_padded_boxes():
    anchors = torch.tensor([[5.0, 5.0], [15.0, 5.0]])
    scores, preds = torch.full((2, 2, 2), 0.5), torch.tensor([[0.0, 0.0, 20.0, 10.0]]).expand(2, 2, 4)
    a = TaskAlignedAssigner(topk=10, num_classes=2)
    labels, boxes, tscores, fg, idx = a(scores, preds, anchors, torch.zeros(2, 0, 1), torch.zeros(2, 0, 4),
                                        torch.zeros(2, 0, 1))
    assert not fg.any() and not tscores.any() and not boxes.any() and (labels == 2).all() and not idx.any()
    # image 0 has one real box; image 1 only a padded row whose box covers every anchor
    gts = torch.tensor([[[0.0, 0.0, 20.0, 10.0]], [[0.0, 0.0, 20.0, 10.0]]])
    mask = torch.tensor([[[1.0]], [[0.0]]])
    labels, _, tscores, fg, _ = a(scores, preds, anchors, torch.tensor([[[1.0]], [[-1.0]]]), gts, mask)
    assert fg[0].all() and not fg[1].any() and not tscores[1].any() and (labels[1] == 2).all()


# --- DFL ----------------------------------------------------------------------------------------
def test_ltrb_targets_are_distances_in_stride_units_clamped_below_the_last_bin():
    anchors = torch.tensor([[12.0, 20.0], [12.0, 20.0]])
    boxes = torch.tensor([[4.0, 4.0, 36.0, 100.0], [-500.0, 20.0, 12.0, 600.0]])
    ltrb = bbox_to_ltrb(anchors, boxes, torch.tensor([[8.0], [8.0]]), reg_max=16)
    assert torch.allclose(ltrb[0], torch.tensor([1.0, 2.0, 3.0, 10.0]))
    assert torch.allclose(ltrb[1], torch.tensor([14.99, 0.0, 0.0, 14.99]))


def test_dfl_is_the_weighted_cross_entropy_of_the_two_neighbouring_bins():
    logits = torch.randn(1, 4, 16, generator=torch.Generator().manual_seed(0))
    target = torch.tensor([[3.3, 0.0, 7.5, 14.99]])
    logp = logits.log_softmax(-1)[0]
    per_side = [-(0.7 * logp[0, 3] + 0.3 * logp[0, 4]), -logp[1, 0],
                -(0.5 * logp[2, 7] + 0.5 * logp[2, 8]), -(0.01 * logp[3, 14] + 0.99 * logp[3, 15])]
    assert distribution_focal_loss(logits, target).item() == pytest.approx(float(sum(per_side) / 4), abs=1e-4)


def test_dfl_is_smallest_when_the_distribution_expects_the_target():
    probs = torch.full((16,), 1e-6)
    probs[3], probs[4] = 0.7, 0.3
    best = probs.log().view(1, 1, 16).expand(1, 4, 16)
    target = torch.full((1, 4), 3.3)
    shifted = best.clone()
    shifted[..., 3], shifted[..., 4] = math.log(0.5), math.log(0.5)
    assert distribution_focal_loss(best, target) < distribution_focal_loss(shifted, target)
    assert ((best.softmax(-1) * torch.arange(16.0)).sum(-1) - target).abs().max() < 1e-3


def test_anchors_match_the_inference_decoder():
    raw = [torch.zeros(1, CH, 64 // s, 64 // s) for s in (8, 16, 32)]
    for r in raw:
        r[:, 0:64:16] = 50.0  # all mass on bin 0 of every side: the box collapses to its anchor
    boxes = decode_dfl(raw, NC)[0, :4].T  # (N, 4)
    points, strides = make_anchors([r.shape[2:] for r in raw], (8, 16, 32))
    assert torch.allclose(boxes[:, :2], points, atol=1e-4) and torch.allclose(boxes[:, 2:], points, atol=1e-4)
    assert strides[0].item() == 8 and strides[-1].item() == 32 and points.shape == (64 + 16 + 4, 2)


# --- detection loss -----------------------------------------------------------------------------
def test_detection_loss_is_finite_positive_and_the_batch_scaled_sum_of_its_items():
    loss, items = DetectionLoss(NC)(_raw(), _targets())
    assert loss.ndim == 0 and torch.isfinite(loss) and loss > 0
    assert items.shape == (3,) and not items.requires_grad and (items > 0).all()
    assert loss.item() == pytest.approx(items.sum().item() * 2, rel=1e-6)


def test_detection_loss_does_not_depend_on_the_order_of_target_rows():
    t = _targets()
    a, _ = DetectionLoss(NC)(_raw(), t)
    b, _ = DetectionLoss(NC)(_raw(), t[[2, 0, 1]])
    assert a.item() == pytest.approx(b.item(), rel=1e-6)


def test_detection_loss_without_boxes_has_only_the_class_term():
    raw = _raw(requires_grad=True)
    loss, items = DetectionLoss(NC)(raw, torch.zeros(0, 6))
    assert torch.isfinite(loss) and items[1] > 0 and items[0] == 0 and items[2] == 0
    assert loss.item() == pytest.approx(items[1].item() * 2, rel=1e-6)
    loss.backward()
    assert all(r.grad is not None and r.grad[:, 64:].abs().sum() > 0 for r in raw)


def test_detection_loss_gradients_reach_every_level_and_both_branches():
    raw = _raw(requires_grad=True)
    targets = torch.tensor([[0, 1, 0, 0, 64, 64], [1, 2, 4, 4, 60, 48]], dtype=torch.float32)
    loss, _ = DetectionLoss(NC, tal_topk=1000)(raw, targets)  # every anchor inside a box is positive
    loss.backward()
    for r in raw:
        assert torch.isfinite(r.grad).all()
        assert r.grad[:, :64].abs().sum() > 0, "box logits get no gradient"
        assert r.grad[:, 64:].abs().sum() > 0, "class logits get no gradient"


def test_detection_loss_is_computed_in_float32_under_autocast():
    raw = [r.bfloat16() for r in _raw()]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, items = DetectionLoss(NC)(raw, _targets())
    ref, _ = DetectionLoss(NC)([r.float() for r in raw], _targets())
    assert loss.dtype == torch.float32 and items.dtype == torch.float32
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)


def test_detection_loss_rejects_outputs_of_another_class_count_and_bad_targets():
    with pytest.raises(ArgumentError, match="nc=5"):
        DetectionLoss(5)(_raw(), _targets())
    with pytest.raises(ArgumentError, match=r"\(M, 6\)"):
        DetectionLoss(NC)(_raw(), _targets()[:, :5])
    with pytest.raises(ArgumentError, match="image index 3"):
        DetectionLoss(NC)(_raw(), torch.tensor([[3, 0, 0, 0, 10, 10.0]]))
    with pytest.raises(ArgumentError, match=rf"DetectionLoss: target classes span 0..{NC}, outside 0..{NC - 1}"):
        DetectionLoss(NC)(_raw(), torch.tensor([[0, 0, 0, 0, 10, 10.0], [1, NC, 4, 4, 20, 20]]))
    with pytest.raises(ArgumentError, match="target classes span -1..0"):
        DetectionLoss(NC)(_raw(), torch.tensor([[0, -1, 0, 0, 10, 10.0], [1, 0, 4, 4, 20, 20]]))


def test_training_yolo9t_on_one_batch_lowers_the_loss():
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a busy 2-core machine two threads contend and run ~20x slower
    try:
        net = YOLOv9("t", nc=NC).train()
        x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
        criterion = DetectionLoss(NC)
        optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
        losses, start = [], time.perf_counter()
        for _ in range(30):
            loss, _ = criterion(net(x)["raw_outputs"], _targets())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        elapsed = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)
    print(f"yolo9-t one-batch fit: loss {losses[0]:.3f} -> {losses[-1]:.3f} in {len(losses)} steps, {elapsed:.1f} s")
    assert all(math.isfinite(v) for v in losses)
    assert min(losses[-3:]) < 0.6 * losses[0], losses


# --- classification loss and registry -----------------------------------------------------------
def test_classification_loss_is_mean_label_smoothed_cross_entropy():
    logits = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([0, 3, 4, 1])
    loss, items = ClassificationLoss(label_smoothing=0.1)(logits, labels)
    logp = logits.log_softmax(-1)
    expected = (0.9 * -logp[torch.arange(4), labels] + 0.1 * -logp.mean(-1)).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert items.shape == (1,) and not items.requires_grad


def test_loss_registry_builds_the_family_loss_with_its_hyperparameters():
    det = loss_for("yolo9", "detect", 7, box=2.0, label_smoothing=0.3, lr0=0.01)
    assert isinstance(det, DetectionLoss) and det.nc == 7 and det.gains == (2.0, 0.5, 1.5)
    cls = loss_for("vit", "classify", 10, label_smoothing=0.0, box=2.0)
    assert isinstance(cls, ClassificationLoss) and cls.label_smoothing == 0.0


def test_loss_registry_says_when_a_family_cannot_be_trained_yet(monkeypatch):
    from libreyolo.models.registry import get_family

    monkeypatch.setattr(type(get_family("rtdetr")), "training", None)
    with pytest.raises(LibreYOLOError, match="training for family 'rtdetr'.*not available yet.*trainable now: .*yolo9"):
        loss_for("rtdetr", "detect", 80)
