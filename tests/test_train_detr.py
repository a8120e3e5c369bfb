"""DETR training (RT-DETR, D-FINE, DEIMv2 atto) on CPU at tiny sizes: Hungarian matching, denoising groups and
their attention mask, the loss on empty targets, a falling loss, the encoder/decoder seam that a
CUDA-graph trainer relies on, and one end-to-end epoch."""
from __future__ import annotations

import csv
import itertools
import math
from pathlib import Path

import pytest
import torch

from libreyolo.models.detr_shared.denoising import cxcywh_to_xyxy, denoising_attend_mask, make_denoising, split_targets
from libreyolo.models.registry import families
from libreyolo.train.loss import loss_for
from libreyolo.train.loss.detr import HungarianMatcher, bin_interpolation, edge_distances, linear_assignment
from tests.numerics import assert_within_float32_noise, float64_run, to_float64

pytest.importorskip("scipy", reason="DETR training needs libreyolo[train] (scipy)")

IMGSZ = 64
NC = 3
# (image, class, x1, y1, x2, y2) in pixels of a 64 px image; image 1 has one box
TARGETS = torch.tensor([[0, 1, 4, 6, 30, 40], [0, 2, 20, 10, 60, 50], [0, 0, 40, 40, 56, 60],
                        [1, 0, 10, 10, 28, 24]], dtype=torch.float32)


def _net(name: str, size: str, seed: int = 0):
    torch.manual_seed(seed)
    family = families()[name]
    net = family.build(size, NC)
    net.train()
    return family, net


def _images(batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.rand(batch, 3, IMGSZ, IMGSZ, generator=torch.Generator().manual_seed(seed))


def _float64_decode(family, net, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The training forward without denoising, in float64 (the reference for float32 bars)."""
    net64 = to_float64(net)
    net64.decoder.num_denoising = 0
    with torch.no_grad():
        return family.train_decode(net64, family.train_encode(net64, x.double()), TARGETS.double())


# --- (a) the matcher ------------------------------------------------------------------------------
@pytest.mark.parametrize("rows,cols", [(3, 3), (5, 3), (3, 5), (6, 4)])
def test_linear_assignment_equals_brute_force(rows, cols):
    cost = torch.rand(rows, cols, generator=torch.Generator().manual_seed(rows * 10 + cols))
    r, c = linear_assignment(cost)
    assert len(r) == min(rows, cols) and len(set(r.tolist())) == len(r) and len(set(c.tolist())) == len(c)
    got = float(cost[r, c].sum())
    if rows >= cols:  # choose a distinct row for every column
        best = min(sum(float(cost[p[j], j]) for j in range(cols)) for p in itertools.permutations(range(rows), cols))
    else:
        best = min(sum(float(cost[i, p[i]]) for i in range(rows)) for p in itertools.permutations(range(cols), rows))
    assert got == pytest.approx(best, abs=1e-6)


def test_hungarian_matcher_minimises_its_cost_and_finds_the_planted_answer():
    g = torch.Generator().manual_seed(0)
    gt_boxes = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.6, 0.3, 0.4]])
    labels = torch.tensor([2, 0])
    boxes = torch.rand(5, 4, generator=g) * 0.5 + 0.25
    boxes[3], boxes[1] = gt_boxes[0], gt_boxes[1]  # queries 3 and 1 sit exactly on the boxes
    logits = torch.full((5, NC), -4.0)
    logits[3, 2] = logits[1, 0] = 4.0
    matcher = HungarianMatcher()
    (q, j), = matcher(logits[None], boxes[None], [(labels, gt_boxes)])
    assert dict(zip(j.tolist(), q.tolist(), strict=True)) == {0: 3, 1: 1}
    cost = matcher.cost(logits, boxes, labels, gt_boxes)
    best = min(float(cost[p[0], 0] + cost[p[1], 1]) for p in itertools.permutations(range(5), 2))
    assert float(cost[q, j].sum()) == pytest.approx(best, abs=1e-5)


def test_fgl_targets_invert_dfine_box_decoding():
    from libreyolo.models.dfine.decoder import distance2bbox, weighting_function

    g = torch.Generator().manual_seed(3)
    start = torch.cat([torch.rand(6, 2, generator=g) * 0.5 + 0.25, torch.rand(6, 2, generator=g) * 0.3 + 0.1], 1)
    reg_scale = torch.tensor([4.0])
    distance = torch.rand(6, 4, generator=g) * 4 - 2
    boxes = cxcywh_to_xyxy(distance2bbox(start, distance, reg_scale))
    torch.testing.assert_close(edge_distances(start, boxes, reg_scale), distance, atol=1e-4, rtol=1e-4)
    bins = weighting_function(32, torch.tensor([0.5]), reg_scale)
    values = torch.cat([torch.rand(50, generator=g) * 3 - 1.5, bins[[0, 5, 16, 31]]])
    left, w_left = bin_interpolation(values, bins)
    assert ((left >= 0) & (left <= 31)).all()
    torch.testing.assert_close(w_left * bins[left] + (1 - w_left) * bins[left + 1], values, atol=1e-5, rtol=1e-5)
    left, w_left = bin_interpolation(torch.tensor([-1e3, 1e3]), bins)  # outside: the end bins, all weight there
    assert left.tolist() == [0, 31] and w_left.tolist() == [1.0, 0.0]


# --- (b) denoising groups -------------------------------------------------------------------------
def test_denoising_groups_shapes_noise_and_mask():
    gt = split_targets(TARGETS, 2, (IMGSZ, IMGSZ))
    torch.manual_seed(0)
    dn = make_denoising(gt, NC, num_queries=7, num_denoising=12, label_noise=0.0, box_noise=1.0)
    m, groups = 3, 4  # most boxes in an image, and 12 // 3 groups
    n = 2 * m * groups
    assert (dn.group_size, dn.groups, dn.num) == (m, groups, n)
    assert dn.labels.shape == (2, n) and dn.ref_unact.shape == (2, n, 4) and dn.attend.shape == (n + 7, n + 7)
    slot = torch.arange(n) % (2 * m)
    assert torch.equal(dn.labels[0, slot < m], gt[0][0].repeat(groups))  # no label noise asked for
    assert (dn.labels[1, (slot % m) >= 1] == NC).all()  # image 1 pads its missing boxes with the padding class
    # box noise: positive corners move less than half the box size, negative ones between half and all of it
    noised = cxcywh_to_xyxy(torch.sigmoid(dn.ref_unact[1]))
    box = gt[1][1][0]
    moved = (noised - cxcywh_to_xyxy(box)).abs() / (box[2:].repeat(2) * 0.5)
    clamped = (noised <= 1e-4) | (noised >= 1 - 1e-4)
    pos, neg = slot == 0, slot == m
    assert (moved[pos] < 1 + 1e-4).all()
    assert (moved[neg] < 2 + 1e-4).all()
    # where two corners of a negative crossed, the box collapses to width (height) 0 in logit space;
    # every other negative corner moved at least half the box size
    wh = torch.sigmoid(dn.ref_unact[1])[:, 2:].repeat(1, 2)
    far = (moved >= 1 - 1e-4) | clamped | (wh <= 1e-4)
    assert far[neg].all() and not far[pos].all()

    attend = dn.attend
    assert not attend[n:, :n].any()  # matching queries never see denoising ones
    assert attend[n:, n:].all() and attend[:n, n:].all()
    group = torch.arange(n) // (2 * m)
    same = group[:, None] == group[None, :]
    assert torch.equal(attend[:n, :n], same)  # denoising groups see themselves only
    assert torch.equal(denoising_attend_mask(m, groups, 7), attend)
    assert make_denoising(split_targets(TARGETS[:0], 2, (IMGSZ, IMGSZ)), NC, 7) is None


@pytest.mark.parametrize("name,size", [("rtdetr", "r18"), ("dfine", "n"), ("deimv2", "atto")])
def test_matching_queries_are_blind_to_the_denoising_queries(name, size):
    family, net = _net(name, size)
    feats = family.train_encode(net, _images())
    net.decoder.num_denoising = 0
    plain = family.train_decode(net, feats, TARGETS)
    net.decoder.num_denoising = 100
    with_dn = family.train_decode(net, feats, TARGETS)
    assert plain["dn_logits"].shape[2] == 0 and with_dn["dn_logits"].shape[2] == 2 * 3 * (100 // 3)
    exact = _float64_decode(family, net, _images())
    for k in ("pred_logits", "pred_boxes"):  # the denoising queries change rounding at most
        assert_within_float32_noise(with_dn[k], plain[k], exact[k], what=k)


# --- (c) empty targets ----------------------------------------------------------------------------
@pytest.mark.parametrize("name,size", [("rtdetr", "r18"), ("dfine", "n"), ("deimv2", "atto")])
def test_loss_is_finite_with_empty_images_and_an_empty_batch(name, size):
    family, net = _net(name, size)
    criterion = loss_for(name, "detect", NC)
    x = _images()
    for targets in (TARGETS[TARGETS[:, 0] == 0], TARGETS[:0]):  # image 1 empty, then both
        net.zero_grad(set_to_none=True)
        out = family.train_decode(net, family.train_encode(net, x), targets)
        loss, items = criterion(out, targets)
        assert torch.isfinite(loss) and torch.isfinite(items).all() and items.shape == (len(family.training_items),)
        loss.backward()
        grads = [p.grad for p in net.parameters() if p.grad is not None]
        assert grads and all(torch.isfinite(g).all() for g in grads)
    assert float(items[0]) > 0 and not items[1:].any()  # no boxes: the class term only


# --- (d) the loss falls ---------------------------------------------------------------------------
@pytest.mark.parametrize("name,size,steps", [("rtdetr", "r18", 6), ("dfine", "n", 14), ("rtdetrv2", "r18", 6)])
def test_a_few_steps_on_a_fixed_batch_make_the_loss_fall(name, size, steps):
    family, net = _net(name, size)
    criterion = loss_for(name, "detect", NC)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x = _images()
    losses = []
    for _ in range(steps):
        torch.manual_seed(0)  # the same denoising noise each step
        loss, _ = criterion(family.train_decode(net, family.train_encode(net, x), TARGETS), TARGETS)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.85 * losses[0], losses


# --- (e) the seam ---------------------------------------------------------------------------------
def _grads(net) -> dict[str, torch.Tensor]:
    return {k: p.grad.clone() for k, p in net.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name,size", [("rtdetr", "r18"), ("dfine", "n"), ("deimv2", "atto")])
def test_the_seam_gives_the_same_outputs_and_gradients(name, size):
    # bit for bit, in float32: what the lead's CUDA-graph parity test asks of a replayed step
    family, net = _net(name, size)
    criterion = loss_for(name, "detect", NC)
    x = _images()

    # direct: one autograd graph through encoder and decoder
    net.zero_grad(set_to_none=True)
    feats = family.train_encode(net, x)
    assert isinstance(feats, tuple) and all(isinstance(f, torch.Tensor) for f in feats)
    torch.manual_seed(5)
    out = family.train_decode(net, feats, TARGETS)
    loss, _ = criterion(out, TARGETS)
    loss.backward()
    direct = _grads(net)

    # the graph trainer's way: encoder outputs detached into leaves, decoder + loss eager, then the
    # leaves' gradients fed back through the encoder
    net.zero_grad(set_to_none=True)
    feats = family.train_encode(net, x)
    leaves = tuple(f.detach().requires_grad_() for f in feats)
    torch.manual_seed(5)
    out2 = family.train_decode(net, leaves, TARGETS)
    loss2, _ = criterion(out2, TARGETS)
    loss2.backward()
    torch.autograd.backward(feats, [leaf.grad for leaf in leaves])
    split = _grads(net)

    assert torch.equal(loss, loss2)
    for k in ("pred_logits", "pred_boxes", "dn_logits", "dn_boxes", "enc_logits", "enc_boxes"):
        assert torch.equal(out[k], out2[k]), k
    assert direct.keys() == split.keys()
    assert any(k.startswith("backbone.") for k in direct) and any(k.startswith("decoder.dec_") for k in direct)
    assert any(float(g.abs().sum()) > 0 for k, g in direct.items() if k.startswith("backbone."))
    differ = [k for k in direct if not torch.equal(split[k], direct[k])]
    assert not differ, differ


# deimv2 s: its ViT backbone takes ImageNet-normalised images, which the training seam must give it too
@pytest.mark.parametrize("name,size", [("rtdetr", "r18"), ("dfine", "n"), ("deimv2", "atto"), ("deimv2", "s")])
def test_the_training_path_ends_where_inference_does(name, size):
    family, net = _net(name, size)
    x = _images()
    net.decoder.num_denoising = 0
    with torch.no_grad():
        out = family.train_decode(net, family.train_encode(net, x), TARGETS)
        ref = net(x)  # the inference forward (BatchNorm in the same training mode)
    exact = float64_run(net, x)  # the inference forward in float64
    for k in ("pred_logits", "pred_boxes"):
        assert_within_float32_noise(out[k][-1], ref[k], exact[k], what=k)


# --- (f) end to end -------------------------------------------------------------------------------
def test_rtdetr_trains_one_epoch_and_its_checkpoint_predicts(tmp_path):
    pytest.importorskip("faster_coco_eval", reason="training metrics need libreyolo[train] (faster-coco-eval)")
    from libreyolo import LibreYOLO
    from libreyolo.train.shapes import make_shapes_dataset

    data = make_shapes_dataset(tmp_path / "shapes", n_train=4, n_val=2, imgsz=IMGSZ, seed=0)
    model = LibreYOLO("LibreRTDETRr18.yaml")
    summary = model.train(data=str(data), epochs=1, imgsz=IMGSZ, batch=2, nbs=2, workers=0, mosaic=0.0,
                          optimizer="AdamW", lr0=1e-4, warmup_epochs=0.0, project=str(tmp_path), name="rtdetr",
                          plots=False)
    run = Path(summary["save_dir"])
    with open(run / "results.csv", newline="") as f:
        row = list(csv.DictReader(f))[-1]
    terms = [float(row[f"train/{k}"]) for k in ("vfl_loss", "l1_loss", "giou_loss")]
    assert all(math.isfinite(v) and v > 0 for v in terms), row
    last = run / "weights" / "last.pt"
    back = LibreYOLO(str(last))
    assert back.family.name == "rtdetr" and back.nc == 3
    image = next((data.parent / "images" / "val").iterdir())
    result = back(str(image), imgsz=IMGSZ, conf=0.0)
    result = result[0] if isinstance(result, list) else result
    assert result is not None
