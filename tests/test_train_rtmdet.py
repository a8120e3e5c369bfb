"""RTMDet training: the dynamic soft-label assigner on hand-built cases, quality focal loss and
GIoU, the loss (zero targets, perfect and mutated predictions, optimisation on a fixed batch), the
head's fresh init, the training input, and ``model.train()`` end to end. CPU, 64 px, rtmdet-t."""
from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from libreyolo.errors import ArgumentError
from libreyolo.models.registry import get_family
from libreyolo.models.rtmdet.network import RTMDet, RTMDetSepBNHead, decode, decode_boxes, level_points, level_strides
from libreyolo.ops.boxes import bbox_giou
from libreyolo.train.loss import loss_for
from libreyolo.train.loss.rtmdet import (
    RTMDetLoss,
    dynamic_soft_label_assign,
    inside_boxes,
    quality_focal_loss,
)

NC = 3
IMGSZ = 64
FAR = torch.tensor([1000.0, 1000.0, 1004.0, 1004.0])  # a predicted box that overlaps nothing


def _maps(imgsz: int = IMGSZ, channels: int = 4) -> tuple[torch.Tensor, ...]:
    return tuple(torch.zeros(1, channels, imgsz // s, imgsz // s) for s in (8, 16, 32))


def _points() -> tuple[torch.Tensor, torch.Tensor]:
    """Points (N, 2) and strides (N,) of a 64-pixel input, in the loss's order."""
    maps = _maps()
    return level_points(maps).T, level_strides(maps)


def _assign(pred: torch.Tensor, gts: torch.Tensor, labels: torch.Tensor | None = None,
            logits: torch.Tensor | None = None):
    """The assignment of one image: ``pred`` (N, 4), ``gts`` (G, 4); zero logits unless given."""
    points, strides = _points()
    n, g = points.shape[0], gts.shape[0]
    labels = torch.zeros(g, dtype=torch.long) if labels is None else labels
    logits = torch.zeros(n, NC) if logits is None else logits
    a = dynamic_soft_label_assign(pred[None], logits[None], points, strides, gts[None], labels[None],
                                  torch.ones(1, g, dtype=torch.bool))
    return a.fg[0], a.gt[0], a.iou[0]


def _inside(gts: torch.Tensor) -> torch.Tensor:
    """(G, N) which points lie strictly inside each box."""
    return inside_boxes(_points()[0], gts[None])[0].T


def _far() -> torch.Tensor:
    return FAR.repeat(_points()[0].shape[0], 1)


# --- the assigner ------------------------------------------------------------------------------
def test_points_are_cell_corners_and_strides_follow_the_levels():
    points, strides = _points()
    assert points.shape == (64 + 16 + 4, 2)
    assert points[:3].tolist() == [[0.0, 0.0], [8.0, 0.0], [16.0, 0.0]]
    assert points[8].tolist() == [0.0, 8.0] and points[64].tolist() == [0.0, 0.0]
    assert strides[:64].eq(8).all() and strides[64:80].eq(16).all() and strides[80:].eq(32).all()


def test_a_point_inside_a_box_that_predicts_it_gets_it():
    gt = torch.tensor([[20.0, 20.0, 44.0, 44.0]])
    pred = _far()
    point = int((_points()[0] == torch.tensor([32.0, 32.0])).all(1).nonzero()[0])  # stride 8, inside
    pred[point] = gt[0]
    fg, gtix, iou = _assign(pred, gt)
    # one IoU of 1, the rest 0: k = 1, and the perfect point is by far the cheapest
    assert fg.nonzero().squeeze(1).tolist() == [point]
    assert int(gtix[point]) == 0 and float(iou[point]) == pytest.approx(1.0)


def test_points_outside_every_box_are_negative_even_when_they_predict_it():
    gt = torch.tensor([[20.0, 20.0, 44.0, 44.0]])
    outside = ~_inside(gt)[0]
    pred = _far()
    pred[outside] = gt[0]  # every outside point predicts the box exactly, the inside ones nothing
    fg, _, iou = _assign(pred, gt)
    assert not bool(fg[outside].any())
    assert int(fg.sum()) == 1 and float(iou[fg]) == 0.0  # k clamps to 1: one inside point, at IoU 0


def test_dynamic_k_is_the_floor_of_the_summed_top_ious():
    gt = torch.tensor([[4.0, 4.0, 60.0, 60.0]])
    inside = _inside(gt)[0].nonzero().squeeze(1)  # 7 x 7 stride-8 points, 2 x 2 stride-16, 1 stride-32
    pred = _far()
    pred[inside[:7]] = torch.tensor([4.0, 4.0, 32.0, 60.0])  # the left half: IoU 0.5 each
    fg, _, iou = _assign(pred, gt)
    assert int(fg.sum()) == 3  # floor(7 * 0.5)
    assert set(fg.nonzero().squeeze(1).tolist()) <= set(inside[:7].tolist())
    assert torch.allclose(iou[fg], torch.full((3,), 0.5))


def test_dynamic_k_sums_at_most_13_ious():
    gt = torch.tensor([[4.0, 4.0, 60.0, 60.0]])
    inside = _inside(gt)[0]
    assert int(inside.sum()) > 13
    pred = _far()
    pred[inside] = gt[0]  # every candidate is perfect
    fg, _, _ = _assign(pred, gt)
    assert int(fg.sum()) == 13


def test_the_centre_prior_breaks_ties_towards_the_box_centre():
    gt = torch.tensor([[4.0, 4.0, 60.0, 60.0]])  # centre (32, 32)
    points, _ = _points()
    inside = _inside(gt)[0].nonzero().squeeze(1)
    pred = _far()
    pred[inside] = gt[0]
    fg, _, _ = _assign(pred, gt)
    # all equally good: the 13 taken are the closest in strides (10 ** (d - 3) grows with d)
    taken = points[fg]
    assert float((taken - 32).norm(dim=1).max()) <= 16.0 + 1e-4
    assert [32.0, 32.0] in taken.tolist()


def test_a_point_two_boxes_take_goes_to_the_one_it_is_cheaper_for():
    gts = torch.tensor([[8.0, 8.0, 40.0, 40.0], [16.0, 16.0, 48.0, 48.0]])
    inside = _inside(gts)
    shared = int((inside[0] & inside[1]).nonzero()[0])
    pred = _far()
    pred[shared] = gts[1]  # IoU 1 with box 1 and 0.39 with box 0: both take it (k = 1 each)
    fg, gtix, _ = _assign(pred, gts)
    assert fg.nonzero().squeeze(1).tolist() == [shared] and gtix[shared].tolist() == 1


def test_random_boxes_each_point_has_one_box_and_positives_lie_inside_some_box():
    g = torch.Generator().manual_seed(0)
    points, _ = _points()
    n = points.shape[0]
    gts = torch.tensor([[8.0, 8.0, 40.0, 40.0], [16.0, 16.0, 48.0, 48.0], [30.0, 2.0, 62.0, 34.0]])
    xy = torch.rand(n, 2, generator=g) * 48
    pred = torch.cat((xy, xy + 8 + torch.rand(n, 2, generator=g) * 24), 1)
    fg, gtix, iou = _assign(pred, gts, torch.tensor([0, 1, 2]), torch.randn(n, NC, generator=g))
    assert bool(_inside(gts).any(0)[fg].all())
    assert set(gtix[fg].tolist()) == {0, 1, 2}  # every box got positives
    # the quality target is the IoU with the one assigned box
    expected = torch.stack([bbox_giou(pred[i], gts[gtix[i]]) for i in fg.nonzero().squeeze(1)])
    assert bool((iou[fg] >= expected - 1e-5).all())  # IoU >= GIoU
    assert bool((gtix[~fg] == 0).all() and (iou[~fg] == 0).all())


def test_the_batched_assignment_is_each_image_assigned_alone():
    g = torch.Generator().manual_seed(1)
    points, strides = _points()
    n = points.shape[0]
    xy = torch.rand(2, n, 2, generator=g) * 48
    pred = torch.cat((xy, xy + 8 + torch.rand(2, n, 2, generator=g) * 24), -1)
    logits = torch.randn(2, n, NC, generator=g)
    gts = torch.tensor([[[8.0, 8.0, 40.0, 40.0], [30.0, 2.0, 62.0, 34.0]], [[16.0, 16.0, 48.0, 48.0], [0, 0, 0, 0]]])
    labels = torch.tensor([[0, 2], [1, 0]])
    mask = torch.tensor([[True, True], [True, False]])  # image 1 has one box and a padding row
    batched = dynamic_soft_label_assign(pred, logits, points, strides, gts, labels, mask)
    for i, count in enumerate((2, 1)):
        alone = dynamic_soft_label_assign(pred[i:i + 1], logits[i:i + 1], points, strides, gts[i:i + 1, :count],
                                          labels[i:i + 1, :count], mask[i:i + 1, :count])
        assert torch.equal(batched.fg[i], alone.fg[0]) and torch.equal(batched.gt[i], alone.gt[0])
        assert torch.allclose(batched.iou[i], alone.iou[0])


# --- QFL and GIoU ------------------------------------------------------------------------------
def test_quality_focal_loss_is_bce_times_the_squared_gap_to_the_target():
    logits = torch.tensor([[2.0, -1.0], [0.0, 3.0]])
    target = torch.tensor([[0.7, 0.0], [0.0, 0.0]])
    p = 1 / (1 + np.exp(-logits.double().numpy()))
    t = target.double().numpy()
    expected = -(t * np.log(p) + (1 - t) * np.log(1 - p)) * np.abs(t - p) ** 2
    assert np.allclose(quality_focal_loss(logits, target).numpy(), expected, rtol=1e-6)
    # a score that equals its target costs nothing; a negative is BCE(x, 0) * p ** 2
    assert float(quality_focal_loss(torch.tensor([0.0]), torch.tensor([0.5]))) == 0.0
    assert float(quality_focal_loss(torch.tensor([0.0]), torch.tensor([0.0]))) == pytest.approx(math.log(2) / 4)


def test_giou_of_identical_boxes_is_one_and_of_far_boxes_below_zero():
    a = torch.tensor([[10.0, 20.0, 30.0, 50.0]])
    assert float(1 - bbox_giou(a, a.clone())) == pytest.approx(0.0, abs=1e-6)
    # disjoint: IoU 0, enclosing box 0..40 x 0..10 = 400 of which 200 union: GIoU -0.5
    assert float(bbox_giou(torch.tensor([0.0, 0, 10, 10]), torch.tensor([30.0, 0, 40, 10]))) == pytest.approx(-0.5)
    # half overlap: IoU 0.5, enclosing box the union
    assert float(bbox_giou(torch.tensor([0.0, 0, 20, 10]), torch.tensor([0.0, 0, 10, 10]))) == pytest.approx(0.5)


# --- the loss ----------------------------------------------------------------------------------
def _net(seed: int = 0) -> RTMDet:
    torch.manual_seed(seed)
    return RTMDet("t", NC).train()


def _targets() -> torch.Tensor:
    return torch.tensor([[0, 1, 8, 10, 40, 50], [1, 0, 20, 5, 60, 30], [1, 2, 2, 2, 20, 20]], dtype=torch.float32)


def _perfect(targets: torch.Tensor, b: int = 2, confident: float = 8.0):
    """Level outputs in which, for each box, the point inside it nearest its centre predicts it
    exactly with its class at ``confident`` logits; every other point predicts a one-pixel box
    with every class at ``-confident``. Each box then has k = 1 and that point as its positive."""
    points, _ = _points()
    n = points.shape[0]
    dist = torch.full((b, n, 4), 0.5)
    logits = torch.full((b, n, NC), -confident)
    for img, cls, *box in targets.tolist():
        box = torch.tensor(box)
        inside = _inside(box[None])[0].nonzero().squeeze(1)
        best = inside[(points[inside] - (box[:2] + box[2:]) / 2).norm(dim=1).argmin()]
        dist[int(img), best] = torch.cat((points[best] - box[:2], box[2:] - points[best]))
        logits[int(img), best, int(cls)] = confident
    sizes = [(IMGSZ // s) ** 2 for s in (8, 16, 32)]
    shapes = [(IMGSZ // s, IMGSZ // s) for s in (8, 16, 32)]

    def levels(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(x.transpose(1, 2).reshape(b, -1, *hw) for x, hw in zip(t.split(sizes, 1), shapes, strict=True))

    return levels(logits), levels(dist)


def test_the_family_declares_the_loss_and_trains_on_the_inference_outputs():
    fam = get_family("rtmdet")
    assert fam.training_items == ("box_loss", "cls_loss") and fam.train_capture == "network"
    loss = loss_for("rtmdet", "detect", NC, lr0=0.01)
    assert isinstance(loss, RTMDetLoss) and loss.nc == NC
    net = _net()
    x = torch.randn(1, 3, IMGSZ, IMGSZ)
    train_out = net(x)
    with torch.no_grad():
        eval_out = net.eval()(x)
    assert [t.shape for t in train_out[0]] == [t.shape for t in eval_out[0]]
    assert [t.shape for t in train_out[1]] == [t.shape for t in eval_out[1]]
    assert torch.equal(decode_boxes(eval_out[1]), decode(eval_out)[:, :4])  # the loss decodes as inference does


def test_a_fresh_head_starts_at_mmdetection_init_and_a_state_dict_still_overrides_it():
    net = RTMDet("t", NC)
    prior_bias = -math.log(99)
    for conv in net.head.rtm_cls:
        assert torch.allclose(conv.bias, torch.full((NC,), prior_bias))
    for conv in net.head.rtm_reg:
        assert conv.bias.abs().max() == 0 and 0.005 < float(conv.weight.detach().std()) < 0.015
    other = RTMDet("t", NC)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    net.load_state_dict(other.state_dict())
    assert torch.equal(net.head.rtm_cls[0].bias, other.head.rtm_cls[0].bias)


def test_perfect_predictions_cost_almost_nothing_and_wrong_classes_cost_more():
    targets = _targets()
    crit = RTMDetLoss(nc=NC)
    loss, items = crit(_perfect(targets), targets)
    assert float(items[0]) == pytest.approx(0.0, abs=1e-5)  # every positive's box is exact: 1 - GIoU = 0
    assert float(items[1]) < 1e-3
    wrong = targets.clone()
    wrong[:, 1] = (wrong[:, 1] + 1) % NC  # a mutation: every box labelled with another class
    _, wrong_items = crit(_perfect(targets), wrong)
    assert float(wrong_items[1]) > 100 * float(items[1]) and float(wrong_items[1]) > 1.0
    shifted = targets.clone()
    shifted[:, 2:6] += 6.0  # boxes moved: the predictions no longer match
    _, shifted_items = crit(_perfect(targets), shifted)
    assert float(shifted_items[0]) > 0.1


def test_zero_targets_leave_only_negatives_and_gradients_reach_every_parameter():
    net = _net()
    out = net(torch.randn(2, 3, IMGSZ, IMGSZ))
    loss, items = RTMDetLoss(nc=NC)(out, torch.zeros(0, 6))
    logits = torch.cat([x.detach().flatten() for x in out[0]])
    expected = (F.binary_cross_entropy_with_logits(logits, torch.zeros_like(logits), reduction="none")
                * logits.sigmoid().square()).sum()  # / max(0, 1)
    assert torch.isfinite(loss) and float(items[0]) == 0.0
    assert float(items[1]) == pytest.approx(float(expected), rel=1e-5)
    assert float(loss.detach()) == pytest.approx(2 * float(items.sum()), rel=1e-5)  # scaled by the batch
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())


def test_bad_inputs_say_what_was_expected():
    out = (_maps(channels=NC), _maps())
    crit = RTMDetLoss(nc=NC)
    with pytest.raises(ArgumentError, match="expected \\(B, 4, H, W\\) for nc=4"):
        RTMDetLoss(nc=4)(out, torch.zeros(0, 6))
    with pytest.raises(ArgumentError, match="outside 0..2"):
        crit(out, torch.tensor([[0, 3, 1, 1, 9, 9]], dtype=torch.float32))
    with pytest.raises(ArgumentError, match="image index 1 in a batch of 1"):
        crit(out, torch.tensor([[1, 0, 1, 1, 9, 9]], dtype=torch.float32))
    with pytest.raises(ArgumentError, match="cls_logits, distances"):
        crit(out[0], torch.zeros(0, 6))


def test_a_few_steps_on_a_fixed_batch_lower_the_loss_and_raise_the_quality():
    # the head alone on fixed random features (the whole network trains end to end below): fast
    torch.manual_seed(0)
    head = RTMDetSepBNHead(NC, 32, exp_distances=False).train()
    g = torch.Generator().manual_seed(0)
    feats = tuple(torch.randn(2, 32, IMGSZ // s, IMGSZ // s, generator=g) for s in (8, 16, 32))
    targets = _targets()
    crit = RTMDetLoss(nc=NC)
    opt = torch.optim.AdamW(head.parameters(), lr=1e-2)
    losses, quality = [], []
    for _ in range(40):
        out = head(feats)
        loss, _ = crit(out, targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        quality.append(_mean_iou(out, targets))
    # the loss is normalised by the positives' IoUs, ~0 for a fresh head's near-empty boxes: it
    # first rises with them, then falls as boxes and scores improve
    assert all(np.isfinite(losses))
    assert np.mean(losses[-3:]) < 0.5 * max(losses), losses
    assert np.mean(quality[-3:]) > 0.5 > 0.1 > quality[0], quality


def _mean_iou(out, targets: torch.Tensor) -> float:
    """Mean IoU of the positives the loss's assignment picks for ``out``."""
    boxes = decode_boxes(out[1]).transpose(1, 2).detach()
    cls = torch.cat([x.flatten(2) for x in out[0]], 2).transpose(1, 2).detach()
    points, strides = level_points(out[1]).T, level_strides(out[1])
    from libreyolo.train.loss.assign import pad_targets

    labels, gts, mask = pad_targets(targets, boxes.shape[0])
    a = dynamic_soft_label_assign(boxes, cls, points, strides, gts, labels[..., 0].long(), mask[..., 0])
    return float(a.iou[a.fg].mean())


# --- the training input and end to end ---------------------------------------------------------
def test_the_training_input_is_the_prediction_preprocessing():
    fam = get_family("rtmdet")
    rgb = torch.randint(0, 256, (3, IMGSZ, IMGSZ), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    predicted, _ = fam.letterbox(IMGSZ)([rgb])  # already the right size: no resize, no padding
    assert torch.allclose(fam.network_input(rgb[None]), predicted, atol=1e-5)


def test_a_few_epochs_end_to_end_lower_the_box_loss_and_write_a_checkpoint_that_predicts(tmp_path):
    pytest.importorskip("faster_coco_eval", reason="training metrics need libreyolo[train] (faster-coco-eval)")
    from libreyolo import LibreYOLO
    from libreyolo.train.shapes import make_shapes_dataset

    data = make_shapes_dataset(tmp_path / "shapes", n_train=4, n_val=2, imgsz=IMGSZ, seed=0)
    model = LibreYOLO("LibreRTMDett.yaml")
    # one optimizer step per epoch, no augmentation but flips: six steps of the full network
    summary = model.train(data=str(data), epochs=6, imgsz=IMGSZ, batch=4, nbs=4, workers=0, val=False,
                          mosaic=0.0, scale=0.0, translate=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0,
                          warmup_epochs=0.0, lr0=0.004, project=str(tmp_path), name="rtmdet", plots=False)
    run = Path(summary["save_dir"])
    with open(run / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    box = [float(r["train/box_loss"]) for r in rows]
    cls = [float(r["train/cls_loss"]) for r in rows]
    assert len(rows) == 6 and all(np.isfinite(box + cls)) and all(c > 0 for c in cls), rows
    # a fresh head's near-empty boxes score ~0 (the loss is normalised by the positives' IoUs); once
    # they overlap their boxes the IoU-weighted box loss falls
    assert box[-1] < max(box), box
    back = LibreYOLO(str(run / "weights" / "last.pt"))
    assert back.family.name == "rtmdet" and back.size == "t" and back.nc == 3
    assert back.names == {0: "square", 1: "circle", 2: "triangle"}
    image = sorted((Path(data).parent / "images" / "val").glob("*.jpg"))[0]
    result = back(str(image), conf=0.0001)
    with Image.open(image) as im:
        assert result.orig_shape == (im.height, im.width)
    assert len(result) > 0
