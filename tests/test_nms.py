"""NMS equals standard greedy class-aware NMS (an independent, obviously-correct reference)."""
from __future__ import annotations

import pytest
import torch

from libreyolo.ops.nms import greedy_nms, nms


def reference_nms(boxes, scores, iou_thres, classes=None, max_det=None):
    """Textbook greedy NMS in plain Python floats; ties by lower index first."""
    b = boxes.tolist()
    s = scores.tolist()
    c = classes.tolist() if classes is not None else [0] * len(s)
    order = sorted(range(len(s)), key=lambda i: (-s[i], i))

    def iou(p, q):
        iw = max(0.0, min(p[2], q[2]) - max(p[0], q[0]))
        ih = max(0.0, min(p[3], q[3]) - max(p[1], q[1]))
        inter = iw * ih
        union = max(0.0, p[2] - p[0]) * max(0.0, p[3] - p[1]) + max(0.0, q[2] - q[0]) * max(0.0, q[3] - q[1]) - inter
        return inter / union if union > 0 else 0.0

    keep = []
    for i in order:
        if all(c[i] != c[k] or iou(b[i], b[k]) <= iou_thres for k in keep):
            keep.append(i)
            if max_det is not None and len(keep) >= max_det:
                break
    return keep


def random_boxes(n, g, size=100.0, quantum=None):
    xy = torch.rand(n, 2, generator=g) * size
    wh = torch.rand(n, 2, generator=g) * size / 3 + 1
    boxes = torch.cat((xy, xy + wh), 1)
    if quantum:
        boxes = (boxes / quantum).round() * quantum
    return boxes


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("iou_thres", [0.3, 0.5, 0.7])
def test_matches_reference_on_random_boxes(seed, iou_thres):
    g = torch.Generator().manual_seed(seed)
    n = 300
    boxes = random_boxes(n, g)
    scores = torch.rand(n, generator=g)
    classes = torch.randint(0, 3, (n,), generator=g)
    assert nms(boxes, scores, iou_thres, classes=classes).tolist() == reference_nms(boxes, scores, iou_thres, classes)


def test_ties_are_broken_by_lower_index_first():
    g = torch.Generator().manual_seed(1)
    n = 200
    boxes = random_boxes(n, g, size=40.0, quantum=4.0)  # many identical boxes
    scores = (torch.rand(n, generator=g) * 4).round() / 4  # only 5 distinct scores
    ours = nms(boxes, scores, 0.5).tolist()
    assert ours == reference_nms(boxes, scores, 0.5)


def test_empty_input_gives_empty_long_tensor():
    keep = nms(torch.zeros(0, 4), torch.zeros(0), 0.5, classes=torch.zeros(0, dtype=torch.long))
    assert keep.shape == (0,) and keep.dtype == torch.long


def test_many_classes_never_suppress_each_other():
    box = torch.tensor([[10.0, 10, 50, 50]]).repeat(80, 1)
    scores = torch.linspace(0.9, 0.1, 80)
    classes = torch.arange(80)
    assert nms(box, scores, 0.1, classes=classes).tolist() == list(range(80))
    assert nms(box, scores, 0.1).tolist() == [0]  # class-agnostic: one survivor


def test_max_det_truncates_in_score_order_across_chunks():
    g = torch.Generator().manual_seed(3)
    n = 3000  # more than one internal chunk
    boxes = random_boxes(n, g, size=2000.0)
    scores = torch.rand(n, generator=g)
    classes = torch.randint(0, 10, (n,), generator=g)
    full = reference_nms(boxes, scores, 0.5, classes)
    assert nms(boxes, scores, 0.5, classes=classes, max_det=50).tolist() == full[:50]
    assert nms(boxes, scores, 0.5, classes=classes).tolist() == full


def test_degenerate_boxes_overlap_nothing():
    boxes = torch.tensor([[5.0, 5, 5, 5], [5.0, 5, 5, 5], [0.0, 0, 10, 10]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    assert nms(boxes, scores, 0.5).tolist() == [0, 1, 2]


def test_presorted_visits_boxes_in_the_given_order():
    boxes = torch.tensor([[0.0, 0, 10, 10], [1.0, 0, 11, 10], [50.0, 50, 60, 60]])
    scores = torch.tensor([0.5, 0.5, 0.4])
    assert nms(boxes, scores, 0.5).tolist() == [0, 2]
    order = torch.tensor([1, 0, 2])
    kept = nms(boxes[order], scores[order], 0.5, presorted=True)
    assert order[kept].tolist() == [1, 2]


# --- the batched, fixed-shape interface (libreyolo.ops.nms.greedy_nms) --------------------------------
def _sorted_batch(g, batch, n, *, quantum=None, levels=None, nc=3, size=100.0):
    """Per image: boxes, scores, classes in visiting order (descending score, ties by lower index)."""
    out = []
    for _ in range(batch):
        boxes = random_boxes(n, g, size=size, quantum=quantum)
        scores = torch.rand(n, generator=g)
        if levels:
            scores = (scores * levels).round() / levels  # many exact ties
        classes = torch.randint(0, nc, (n,), generator=g)
        order = sorted(range(n), key=lambda i: (-float(scores[i]), i))
        out.append((boxes[order], scores[order], classes[order]))
    return out


def _reference_keep(boxes, scores, classes, n_valid, iou_thres, max_det):
    # the reference sorts by (-score, index): on presorted input that is the identity order
    return reference_nms(boxes[:n_valid], scores[:n_valid], iou_thres, classes[:n_valid], max_det)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("iou_thres", [0.3, 0.5, 0.7])
def test_greedy_nms_batched_matches_the_reference_with_ties(seed, iou_thres):
    g = torch.Generator().manual_seed(100 + seed)
    n, max_det = 400, 250
    images = _sorted_batch(g, 3, n, quantum=4.0 if seed % 2 else None, levels=6 if seed < 2 else None, size=60.0)
    boxes = torch.stack([b for b, _, _ in images])
    classes = torch.stack([c for _, _, c in images])
    n_valid = torch.tensor([n, 137, 0])
    keep, counts = greedy_nms(boxes, classes, n_valid, iou_thres, max_det)
    assert keep.shape == (3, max_det) and counts.shape == (3,)
    for i, (b, s, c) in enumerate(images):
        want = _reference_keep(b, s, c, int(n_valid[i]), iou_thres, max_det)
        assert counts[i] == len(want)
        assert keep[i, :len(want)].tolist() == want and bool((keep[i, len(want):] == -1).all())


def test_greedy_nms_iou_exactly_at_the_threshold_does_not_suppress():
    boxes = torch.tensor([[[0.0, 0, 10, 10], [0.0, 0, 10, 20], [0.0, 0, 10, 19]]])  # IoU 0.5, then 10/19 > 0.5
    keep, counts = greedy_nms(boxes, torch.zeros(1, 3, dtype=torch.long), torch.tensor([3]), 0.5, 10)
    assert keep[0, :int(counts[0])].tolist() == [0, 1] == reference_nms(boxes[0], torch.tensor([3.0, 2, 1]), 0.5)


def test_greedy_nms_long_suppression_chains_across_blocks():
    # boxes sliding along a line: each overlaps its neighbours, so keep/suppress alternates in long chains
    n = 700
    x = torch.arange(n, dtype=torch.float32) * 3.0
    boxes = torch.stack((x, torch.zeros(n), x + 10, torch.full((n,), 10.0)), 1)
    scores = torch.linspace(1, 0, n)
    for thr in (0.3, 0.5, 0.8):
        keep, counts = greedy_nms(boxes[None], torch.zeros(1, n, dtype=torch.long), torch.tensor([n]), thr, n)
        assert keep[0, :int(counts[0])].tolist() == reference_nms(boxes, scores, thr)


def test_pairwise_iou_is_bitwise_box_iou():
    from libreyolo.ops.boxes import box_iou
    from libreyolo.ops.nms import pairwise_iou

    g = torch.Generator().manual_seed(5)
    for quantum in (None, 2.0):
        b = random_boxes(300, g, quantum=quantum)
        b[::9, 2] = b[::9, 0]  # some empty boxes
        ours, theirs = pairwise_iou(b[None], b[None])[0], box_iou(b, b)
        assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32))


_TRITON_SCRIPT = r"""
import sys, torch
sys.path.insert(0, sys.argv[1])
from tests.test_nms import _sorted_batch, _reference_keep
from libreyolo.ops import nms_triton
from libreyolo.ops.nms import greedy_nms
g = torch.Generator().manual_seed(7)
for quantum, levels, thr, max_det in ((None, None, 0.5, 200), (4.0, 5, 0.5, 200), (4.0, 5, 0.3, 9),
                                      (2.0, 3, 0.2, 300)):
    images = _sorted_batch(g, 3, 300, quantum=quantum, levels=levels, size=40.0)
    boxes = torch.stack([b for b, _, _ in images]); classes = torch.stack([c for _, _, c in images])
    n_valid = torch.tensor([300, 130, 0])
    ref = greedy_nms(boxes, classes, n_valid, thr, max_det, backend="torch")
    # no mask, a mask over part of the candidates (both paths in one walk), a mask over all of them
    for cap in (0, 64, 128, None):
        keep, counts = nms_triton.greedy_nms(boxes, classes, n_valid, torch.tensor(thr), max_det, mask_cap=cap)
        assert torch.equal(keep, ref[0]) and torch.equal(counts, ref[1]), (quantum, levels, thr, cap)
    for i, (b, s, c) in enumerate(images):
        assert keep[i, :int(counts[i])].tolist() == _reference_keep(b, s, c, int(n_valid[i]), thr, max_det)
print("ok")
"""


def test_triton_kernel_matches_the_reference_in_the_interpreter():
    """The CUDA kernel's logic, run by Triton's CPU interpreter (skipped where Triton is not installed)."""
    import importlib.util
    import os
    import subprocess
    import sys
    from pathlib import Path

    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed: its kernel is checked on CUDA by test_triton_kernel_on_cuda_*")
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _TRITON_SCRIPT, str(root)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(3))
def test_triton_kernel_on_cuda_matches_the_torch_backend_and_the_reference(seed):
    from libreyolo.ops.nms import nms_backend

    assert nms_backend(torch.device("cuda")) == "triton", "Triton NMS unavailable on this CUDA machine"
    g = torch.Generator().manual_seed(200 + seed)
    images = _sorted_batch(g, 4, 2000, quantum=4.0 if seed else None, levels=8 if seed == 2 else None,
                           nc=2, size=300.0)
    boxes = torch.stack([b for b, _, _ in images]).cuda()
    classes = torch.stack([c for _, _, c in images]).cuda()
    n_valid = torch.tensor([2000, 1500, 3, 0], device="cuda")
    from libreyolo.ops import nms_triton

    for thr, max_det in ((0.45, 300), (0.7, 1000), (0.2, 17)):
        keep, counts = greedy_nms(boxes, classes, n_valid, torch.tensor(thr, device="cuda"), max_det)
        ref_keep, ref_counts = greedy_nms(boxes, classes, n_valid, thr, max_det, backend="torch")
        assert torch.equal(keep, ref_keep) and torch.equal(counts, ref_counts)
        for cap in (0, 512):  # without the suppression mask, and with it over part of the candidates
            k2, c2 = nms_triton.greedy_nms(boxes, classes, n_valid, torch.tensor(thr, device="cuda"), max_det,
                                           mask_cap=cap)
            assert torch.equal(k2, ref_keep) and torch.equal(c2, ref_counts), cap
        for i, (b, s, c) in enumerate(images[:2]):
            assert keep[i, :int(counts[i])].tolist() == _reference_keep(b, s, c, int(n_valid[i]), thr, max_det)


def test_mask_rows_covers_small_batches_within_the_budget_and_skips_large_ones(monkeypatch):
    from libreyolo.ops import nms_triton as nt

    assert nt.mask_rows(1, 600) == 640  # every candidate, rounded up to a block
    assert nt.mask_rows(1, 30000) == nt.MASK_CAP
    rows = nt.mask_rows(nt.MASK_MAX_BATCH, 30000)
    assert 0 < rows <= nt.MASK_CAP and rows % nt.BLOCK == 0
    assert nt.MASK_MAX_BATCH * rows * rows // 8 <= nt.MASK_BYTES
    assert nt.mask_rows(nt.MASK_MAX_BATCH + 1, 600) == 0  # the walks of many images already run side by side
    monkeypatch.setenv("LIBREYOLO_NMS_MASK", "0")
    assert nt.mask_rows(1, 600) == 0
