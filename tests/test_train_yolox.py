"""YOLOX training: SimOTA assignment on hand-built cases, the loss (zero targets, gradients,
optimisation on a fixed batch) and one end-to-end ``model.train()`` epoch. CPU, 64 px, yolox-n."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from libreyolo.errors import ArgumentError
from libreyolo.models.yolox.network import YOLOX, decode, decode_boxes, level_grid
from libreyolo.train.loss import loss_for
from libreyolo.train.loss.yolox import YoloxLoss, candidate_region, simota_assign

NC = 3
IMGSZ = 64
FAR = torch.tensor([1000.0, 1000.0, 1004.0, 1004.0])  # a predicted box that overlaps nothing


def _anchors(imgsz: int = IMGSZ) -> tuple[torch.Tensor, torch.Tensor]:
    """Cell centres (N, 2) and strides (N,) of a yolox input of side ``imgsz``, in the maps' order."""
    levels = [torch.zeros(1, 5 + NC, imgsz // s, imgsz // s) for s in (8, 16, 32)]
    grid, stride = level_grid(levels)
    return (grid[0].T + 0.5) * stride[0, 0].unsqueeze(1), stride[0, 0]


def _assign(pred_boxes: torch.Tensor, gt_boxes: torch.Tensor, gt_labels: torch.Tensor | None = None):
    centres, strides = _anchors()
    n = centres.shape[0]
    labels = torch.zeros(gt_boxes.shape[0], dtype=torch.long) if gt_labels is None else gt_labels
    return simota_assign(pred_boxes, torch.zeros(n), torch.zeros(n, NC), centres, strides, gt_boxes, labels)


def _central(gt: torch.Tensor) -> torch.Tensor:
    """Indices of the anchors both inside ``gt`` (1, 4) and near its centre."""
    centres, strides = _anchors()
    in_box, in_centre = candidate_region(centres, strides, gt)
    return (in_box & in_centre)[0].nonzero().squeeze(1)


# --- SimOTA ------------------------------------------------------------------------------------
def test_candidate_region_is_the_box_or_the_centre_square():
    centres, strides = _anchors()
    gt = torch.tensor([[20.0, 20.0, 44.0, 44.0]])  # centre (32, 32)
    in_box, in_centre = candidate_region(centres, strides, gt)
    p8 = slice(0, 64)  # stride-8 cells, centres 4, 12, ..., 60
    # strictly inside the box: centres 28 and 36 on each axis
    assert set(map(tuple, centres[p8][in_box[0, p8]].tolist())) == {(28.0, 28.0), (28.0, 36.0), (36.0, 28.0),
                                                                   (36.0, 36.0)}
    # within 2.5 * 8 = 20 px of (32, 32) on each axis: centres 20..44, so 4 x 4 cells
    assert int(in_centre[0, p8].sum()) == 16
    # stride 32 (centres 16 and 48): every cell is within 80 px of the centre, none inside the box
    assert bool(in_centre[0, -4:].all()) and not bool(in_box[0, -4:].any())


def test_perfect_predictions_set_dynamic_k_and_win_the_assignment():
    gt = torch.tensor([[20.0, 20.0, 44.0, 44.0]])
    central = _central(gt)
    perfect = central[:3]
    pred = FAR.repeat(_anchors()[0].shape[0], 1)
    pred[perfect] = gt[0]
    a = _assign(pred, gt)
    # three IoUs of 1 and the rest 0: k = 3, and the three perfect anchors are the cheapest
    assert sorted(a.anchors.tolist()) == sorted(perfect.tolist())
    assert a.gt.tolist() == [0, 0, 0]
    assert torch.allclose(a.iou, torch.ones(3))


def test_dynamic_k_is_the_floor_of_the_summed_top_ious():
    gt = torch.tensor([[20.0, 20.0, 44.0, 44.0]])
    central = _central(gt)
    pred = FAR.repeat(_anchors()[0].shape[0], 1)
    pred[central[:7]] = torch.tensor([20.0, 20.0, 32.0, 44.0])  # the left half: IoU 0.5 each
    a = _assign(pred, gt)
    assert len(a.anchors) == 3  # floor(7 * 0.5)
    assert set(a.anchors.tolist()) <= set(central[:7].tolist())
    assert torch.allclose(a.iou, torch.full((3,), 0.5))


def test_no_overlap_still_gives_one_positive_inside_the_candidate_region():
    gt = torch.tensor([[20.0, 20.0, 44.0, 44.0]])
    a = _assign(FAR.repeat(_anchors()[0].shape[0], 1), gt)
    assert len(a.anchors) == 1  # k is clamped to at least 1
    assert int(a.anchors) in set(_central(gt).tolist())  # penalised anchors lose to central ones


def test_an_anchor_claimed_by_two_boxes_goes_to_the_one_it_is_cheaper_for():
    gts = torch.tensor([[8.0, 8.0, 40.0, 40.0], [16.0, 16.0, 48.0, 48.0]])
    shared = sorted(set(_central(gts[:1]).tolist()) & set(_central(gts[1:]).tolist()))[0]
    pred = FAR.repeat(_anchors()[0].shape[0], 1)
    pred[shared] = gts[1]  # IoU 1 with box 1, 0.39 with box 0: both take it (k = 1 each), box 1 is cheaper
    a = _assign(pred, gts)
    assert a.anchors.tolist() == [shared] and a.gt.tolist() == [1]


def test_random_boxes_get_distinct_anchors_from_their_own_candidate_region():
    g = torch.Generator().manual_seed(0)
    centres, strides = _anchors()
    n = centres.shape[0]
    gts = torch.tensor([[8.0, 8.0, 40.0, 40.0], [16.0, 16.0, 48.0, 48.0], [30.0, 2.0, 62.0, 34.0]])
    xy = torch.rand(n, 2, generator=g) * 48
    pred = torch.cat((xy, xy + 8 + torch.rand(n, 2, generator=g) * 24), 1)
    a = _assign(pred, gts, torch.tensor([0, 1, 2]))
    assert len(set(a.anchors.tolist())) == len(a.anchors)  # each anchor has one box
    in_box, in_centre = candidate_region(centres, strides, gts)
    assert bool((in_box | in_centre)[a.gt, a.anchors].all())
    assert set(a.gt.tolist()) == {0, 1, 2}  # every box got positives


def test_a_box_never_takes_anchors_only_another_box_claims():
    # box 0 (corner, tiny) has no anchor strictly inside it; anchors of box 1's region predict box 0
    # exactly, its own candidates predict nothing: it gets k = 1, one of its own candidates
    centres, strides = _anchors()
    gts = torch.tensor([[4.0, 4.0, 12.0, 12.0], [32.0, 32.0, 64.0, 64.0]])
    in_box, in_centre = candidate_region(centres, strides, gts)
    own = in_box | in_centre
    pred = FAR.repeat(centres.shape[0], 1)
    pred[own[1] & ~own[0]] = gts[0]
    a = _assign(pred, gts)
    assert int((a.gt == 0).sum()) == 1
    assert bool(own[a.gt, a.anchors].all())


# --- the loss ----------------------------------------------------------------------------------
def _net(seed: int = 0) -> YOLOX:
    torch.manual_seed(seed)
    return YOLOX("n", NC).train()


def _targets() -> torch.Tensor:
    return torch.tensor([[0, 1, 8, 10, 40, 50], [1, 0, 20, 5, 60, 30], [1, 2, 2, 2, 20, 20]], dtype=torch.float32)


def test_the_family_declares_the_loss_and_the_training_forward_is_the_inference_one_before_sigmoid():
    loss = loss_for("yolox", "detect", NC)
    assert isinstance(loss, YoloxLoss) and loss.nc == NC
    net = _net().eval()
    x = torch.rand(1, 3, IMGSZ, IMGSZ) * 255
    with torch.no_grad():
        probs, logits = net(x), net.forward_logits(x)
    for p, lg in zip(probs, logits, strict=True):
        assert torch.equal(p[:, :4], lg[:, :4])
        assert torch.allclose(p[:, 4:], lg[:, 4:].sigmoid(), atol=1e-6)
    # the loss decodes boxes exactly as inference does
    assert torch.equal(decode_boxes(logits), decode(probs)[:, :4])


def test_zero_targets_give_an_all_negative_objectness_loss_and_gradients_reach_every_parameter():
    net = _net()
    raw = net.forward_logits(torch.rand(2, 3, IMGSZ, IMGSZ) * 255)
    loss, items = YoloxLoss(nc=NC)(raw, torch.zeros(0, 6))
    obj = torch.cat([r[:, 4].flatten() for r in raw])
    expected_obj = F.binary_cross_entropy_with_logits(obj, torch.zeros_like(obj), reduction="sum")  # / max(0, 1)
    assert torch.isfinite(loss)
    assert items[0] == 0 and items[2] == 0
    assert items[1].item() == pytest.approx(expected_obj.item(), rel=1e-5)
    assert loss.item() == pytest.approx(2 * items.sum().item(), rel=1e-5)  # scaled by the batch
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())
    assert float(net.head.obj_preds[0].weight.grad.abs().sum()) > 0


def test_an_image_without_targets_only_adds_negatives():
    net = _net()
    raw = [r.detach() for r in net.forward_logits(torch.rand(2, 3, IMGSZ, IMGSZ) * 255)]
    crit = YoloxLoss(nc=NC)
    one = _targets()[:1]  # image 0 has a box, image 1 none
    _, both = crit(raw, one)
    _, alone = crit([r[:1] for r in raw], one)
    assert torch.allclose(both[[0, 2]], alone[[0, 2]], rtol=1e-5)  # same positives, same box and class terms
    # image 1 adds its all-negative objectness BCE, over image 0's number of positives
    obj1 = torch.cat([r[1, 4].flatten() for r in raw])
    extra = F.binary_cross_entropy_with_logits(obj1, torch.zeros_like(obj1), reduction="sum")
    assert both[1].item() == pytest.approx(alone[1].item() + extra.item() / _positives(raw, one), rel=1e-4)


def _positives(raw: list[torch.Tensor], targets: torch.Tensor) -> int:
    """How many positives the loss's assignment gives image 0 of ``raw``."""
    flat = torch.cat([r[:1].flatten(2) for r in raw], 2)[0].T
    centres, strides = _anchors()
    a = simota_assign(decode_boxes([r[:1] for r in raw])[0].T, flat[:, 4], flat[:, 5:], centres, strides,
                      targets[:, 2:6], targets[:, 1].long())
    return max(1, len(a.anchors))


def test_the_l1_target_is_the_inverse_of_the_box_decoding():
    g = torch.Generator().manual_seed(1)
    levels = [torch.randn(1, 5 + NC, IMGSZ // s, IMGSZ // s, generator=g) * 0.5 for s in (8, 16, 32)]
    boxes = decode_boxes(levels)[0].T
    grid, stride = level_grid(levels)
    reg = torch.cat([lv[:, :4].flatten(2) for lv in levels], 2)[0].T
    assert torch.allclose(YoloxLoss._encode(boxes, grid[0].T, stride[0, 0]), reg, atol=1e-4)


def test_bad_inputs_say_what_was_expected():
    raw = [torch.zeros(1, 5 + NC, IMGSZ // s, IMGSZ // s) for s in (8, 16, 32)]
    crit = YoloxLoss(nc=NC)
    with pytest.raises(ArgumentError, match="expected \\(B, 9, H, W\\) for nc=4"):
        YoloxLoss(nc=4)(raw, torch.zeros(0, 6))
    with pytest.raises(ArgumentError, match="outside 0..2"):
        crit(raw, torch.tensor([[0, 3, 1, 1, 9, 9]], dtype=torch.float32))
    with pytest.raises(ArgumentError, match="image index 1 in a batch of 1"):
        crit(raw, torch.tensor([[1, 0, 1, 1, 9, 9]], dtype=torch.float32))


def test_a_few_steps_on_a_fixed_batch_lower_the_loss():
    net = _net(seed=0)
    x = torch.rand(2, 3, IMGSZ, IMGSZ, generator=torch.Generator().manual_seed(0)) * 255
    crit = YoloxLoss(nc=NC)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):  # 15 steps fell short of the bar at 2 threads; 30 reach 0.52-0.57 at 1 and 2 threads
        loss, _ = crit(net.forward_logits(x), _targets())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert np.mean(losses[-5:]) < 0.8 * losses[0], losses


# --- end to end --------------------------------------------------------------------------------
def test_one_epoch_end_to_end_writes_a_checkpoint_that_loads_and_predicts(tmp_path):
    pytest.importorskip("faster_coco_eval", reason="training metrics need libreyolo[train] (faster-coco-eval)")
    from libreyolo import LibreYOLO
    from libreyolo.train.shapes import make_shapes_dataset

    data = make_shapes_dataset(tmp_path / "shapes", n_train=4, n_val=2, imgsz=IMGSZ, seed=0)
    model = LibreYOLO("LibreYOLOXn.yaml")
    summary = model.train(data=str(data), epochs=1, imgsz=IMGSZ, batch=2, workers=0, val=True,
                          project=str(tmp_path), name="yolox", plots=False)
    run = Path(summary["save_dir"])
    with open(run / "results.csv", newline="") as f:
        row = next(csv.DictReader(f))
    losses = [float(row[f"train/{k}"]) for k in ("iou_loss", "obj_loss", "cls_loss")]
    assert all(np.isfinite(losses)) and losses[0] > 0 and losses[1] > 0, row
    assert "metrics/mAP50-95" in row
    back = LibreYOLO(str(run / "weights" / "last.pt"))
    assert back.family.name == "yolox" and back.size == "n" and back.nc == 3
    assert back.names == {0: "square", 1: "circle", 2: "triangle"}
    image = sorted((Path(data).parent / "images" / "val").glob("*.jpg"))[0]
    result = back(str(image), conf=0.0001)
    with Image.open(image) as im:
        assert result.orig_shape == (im.height, im.width)
    assert len(result) > 0  # an untrained head still ranks some boxes above a tiny threshold
