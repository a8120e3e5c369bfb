"""Batched detection postprocessing equals a per-image textbook reference, ties included.

The reference (plain Python over one image at a time): map boxes back to the source image and
clip them, drop boxes with no area and classes not asked for, take every (box, class) pair
above ``conf``, visit them by descending score (ties: lower box-major index ``n * nc + k``
first), greedy class-aware NMS, at most ``max_det``.
"""
from __future__ import annotations

import pytest
import torch

from libreyolo.errors import ArgumentError
from libreyolo.ops.letterbox import LetterboxMeta
from libreyolo.ops.postprocess import (
    DEFAULT_MAX_NMS,
    detect_padded,
    detect_postprocess,
    pack_params,
    read_detections,
)
from tests.test_nms import reference_nms

NC = 4


def reference_postprocess(pred, meta, *, conf, iou, max_det, classes=None, max_nms=None):
    h, w = meta.orig_shape
    left, top = meta.pad
    ratio = torch.tensor(meta.ratio, dtype=torch.float32)  # float32 arithmetic, as the network's outputs
    boxes = pred[:4].T.clone()
    boxes[:, 0::2] = ((boxes[:, 0::2] - left) / ratio).clamp(0, w)
    boxes[:, 1::2] = ((boxes[:, 1::2] - top) / ratio).clamp(0, h)
    scores = pred[4:].T
    cand = []
    for n in range(boxes.shape[0]):
        if not (boxes[n, 2] > boxes[n, 0] and boxes[n, 3] > boxes[n, 1]):
            continue
        for k in range(scores.shape[1]):
            if scores[n, k] > conf and (classes is None or k in classes):
                cand.append((-float(scores[n, k]), n * scores.shape[1] + k, n, k))
    cand.sort()
    if max_nms is not None:
        cand = cand[:max_nms]
    if not cand:
        return torch.zeros(0, 4), torch.zeros(0), torch.zeros(0)
    b = torch.stack([boxes[n] for _, _, n, _ in cand])
    s = torch.tensor([-c for c, _, _, _ in cand])
    c = torch.tensor([k for _, _, _, k in cand])
    # every candidate has a distinct (-score, index) rank, so the reference visits them in this order
    keep = reference_nms(b, torch.arange(len(cand), 0, -1, dtype=torch.float32), iou, c, max_det)
    return b[keep], s[keep], c[keep].float()


def random_predictions(g, batch, n=120, *, size=96, levels=8, quantum=4.0):
    """(B, 4 + NC, n) in network pixels, with exact score ties, repeated boxes and empty boxes."""
    xy = torch.rand(batch, n, 2, generator=g) * size
    wh = torch.rand(batch, n, 2, generator=g) * size / 3
    boxes = torch.cat((xy, xy + wh), -1)
    boxes = (boxes / quantum).round() * quantum
    boxes[:, ::11, 2] = boxes[:, ::11, 0]  # no width
    scores = (torch.rand(batch, n, NC, generator=g) * levels).round() / levels
    return torch.cat((boxes, scores), -1).transpose(1, 2).contiguous()


def metas_for(batch, size=96):
    shapes = [(size - 16, size), (size // 2, size // 3), (size * 2, size + 40), (size, size)]
    out = []
    for i in range(batch):
        h, w = shapes[i % len(shapes)]
        ratio = min(size / h, size / w)
        out.append(LetterboxMeta((h, w), ratio, (float(3 * i), float(2 * i))))
    return out


def assert_same(ours, ref):
    xyxy, conf, cls = ref
    assert torch.equal(ours["xyxy"], xyxy) and torch.equal(ours["conf"], conf) and torch.equal(ours["cls"], cls)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("iou", [0.3, 0.6])
def test_matches_the_per_image_reference_with_ties(seed, iou):
    g = torch.Generator().manual_seed(seed)
    pred, metas = random_predictions(g, 3), metas_for(3)
    classes = [0, 2] if seed % 2 else None
    ours = detect_postprocess(pred, metas, conf=0.25, iou=iou, max_det=50, classes=classes)
    for i in range(3):
        assert_same(ours[i], reference_postprocess(pred[i], metas[i], conf=0.25, iou=iou, max_det=50,
                                                   classes=classes))


def test_batched_equals_per_image():
    g = torch.Generator().manual_seed(11)
    pred, metas = random_predictions(g, 4, levels=5), metas_for(4)
    batched = detect_postprocess(pred, metas, conf=0.2, iou=0.45, max_det=30)
    for i in range(4):
        single = detect_postprocess(pred[i:i + 1], metas[i:i + 1], conf=0.2, iou=0.45, max_det=30)[0]
        for k in ("xyxy", "conf", "cls"):
            assert torch.equal(batched[i][k], single[k])


def test_capped_equals_uncapped_when_the_candidates_fit_and_is_a_prefix_otherwise():
    g = torch.Generator().manual_seed(12)
    pred, metas = random_predictions(g, 2, n=200), metas_for(2)
    scores = pred[:, 4:]
    fit = int((scores > 0.3).flatten(1).sum(1).max())
    full = detect_postprocess(pred, metas, conf=0.3, iou=0.5, max_det=300)
    for cap in (fit, fit + 1, DEFAULT_MAX_NMS):
        capped = detect_postprocess(pred, metas, conf=0.3, iou=0.5, max_det=300, max_nms=cap)
        assert all(torch.equal(a[k], b[k]) for a, b in zip(capped, full, strict=True) for k in a)
    small = detect_postprocess(pred, metas, conf=0.3, iou=0.5, max_det=300, max_nms=fit // 4)
    for i, (a, b) in enumerate(zip(small, full, strict=True)):
        n = a["conf"].shape[0]
        assert 0 < n < b["conf"].shape[0]
        assert torch.equal(a["xyxy"], b["xyxy"][:n]) and torch.equal(a["conf"], b["conf"][:n])
        assert_same(a, reference_postprocess(pred[i], metas[i], conf=0.3, iou=0.5, max_det=300, max_nms=fit // 4))


@pytest.mark.parametrize("select", ["sort", "topk"])
@pytest.mark.parametrize("max_nms", [7, 90, DEFAULT_MAX_NMS])
def test_fixed_shape_stage_equals_the_adaptive_one(max_nms, select, monkeypatch):
    # fixed: what CUDA and graphs run (the best max_nms keys: a full sort of small sets, a top-k of
    # larger ones); adaptive: what a CPU runs
    from libreyolo.ops import postprocess

    monkeypatch.setattr(postprocess, "SORT_BELOW", 1 << 30 if select == "sort" else 0)
    g = torch.Generator().manual_seed(13)
    pred, metas = random_predictions(g, 3, levels=4), metas_for(3)
    params = pack_params(metas, conf=0.25, iou=0.5, nc=NC, classes=[1, 2, 3])
    fixed = detect_padded(pred, params, max_det=40, max_nms=max_nms, fixed_shape=True)
    adaptive = detect_padded(pred, params, max_det=40, max_nms=max_nms, fixed_shape=False)
    assert fixed[0].shape == adaptive[0].shape == (3, 40, 6)
    assert torch.equal(fixed[0], adaptive[0]) and torch.equal(fixed[1], adaptive[1])


def test_padded_output_has_zero_rows_after_the_counts():
    g = torch.Generator().manual_seed(14)
    pred, metas = random_predictions(g, 2), metas_for(2)
    dets, counts = detect_padded(pred, pack_params(metas, conf=0.8, iou=0.5, nc=NC), max_det=150)
    assert dets.shape == (2, 150, 6) and counts.dtype == torch.int64
    for i in range(2):
        assert 0 < int(counts[i]) < 150 and bool((dets[i, int(counts[i]):] == 0).all())
    per_image = read_detections(dets, counts)
    assert [d["conf"].shape[0] for d in per_image] == counts.tolist()
    assert all(d["xyxy"].is_contiguous() and d["conf"].is_contiguous() for d in per_image)


def test_nothing_above_conf_gives_empty_results():
    g = torch.Generator().manual_seed(15)
    pred, metas = random_predictions(g, 2), metas_for(2)
    out = detect_postprocess(pred, metas, conf=1.0, iou=0.5, max_det=10)
    assert [d["xyxy"].shape for d in out] == [(0, 4), (0, 4)]
    assert out[0]["cls"].dtype == torch.float32


def test_max_nms_is_checked():
    g = torch.Generator().manual_seed(16)
    pred, metas = random_predictions(g, 1), metas_for(1)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ArgumentError, match="max_nms"):
            detect_postprocess(pred, metas, conf=0.3, iou=0.5, max_det=10, max_nms=bad)


def test_predict_takes_max_nms_and_reports_speed():
    from libreyolo import SAMPLE_IMAGE
    from tests.conftest import seeded_model

    model = seeded_model("t")
    full = model(SAMPLE_IMAGE, imgsz=160, conf=0.05)
    capped = model(SAMPLE_IMAGE, imgsz=160, conf=0.05, max_nms=3)
    assert 0 < len(capped) <= 3 < len(full)
    assert torch.equal(capped.boxes.conf, full.boxes.conf[:len(capped)])
    assert set(full.speed) == {"preprocess", "inference", "postprocess"} and min(full.speed.values()) >= 0
    with pytest.raises(ArgumentError, match="max_nms"):
        model(SAMPLE_IMAGE, imgsz=160, max_nms=0)
