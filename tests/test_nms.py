"""NMS equals standard greedy class-aware NMS (an independent, obviously-correct reference)."""
from __future__ import annotations

import pytest
import torch

from libreyolo.ops.nms import nms


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
