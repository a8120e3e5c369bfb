"""DETR building blocks on the CPU: set-prediction postprocessing, stretch resize, per-shape caches."""
from __future__ import annotations

import pytest
import torch

from libreyolo.models.detr_shared.anchors import AnchorCache, LevelShapes, make_anchors
from libreyolo.models.registry import get_family
from libreyolo.ops.letterbox import LetterboxMeta
from libreyolo.ops.stretch import Stretch, StretchMeta, resize_u8
from libreyolo.ops.topk import topk_postprocess
from tests.test_compat_detr import rows_match


def test_topk_takes_the_best_query_class_pairs_over_all_classes():
    logits = torch.full((1, 3, 4), -10.0)
    logits[0, 0, 1], logits[0, 0, 2], logits[0, 2, 3] = 3.0, 2.0, 1.0  # query 0 gives two classes
    boxes = torch.tensor([[[0.5, 0.5, 0.2, 0.4], [0.1, 0.1, 0.1, 0.1], [0.25, 0.75, 0.5, 0.5]]])
    meta = StretchMeta((100, 200), (64, 64))
    (det,) = topk_postprocess(logits, boxes, [meta], conf=0.5, max_det=300)
    assert det["cls"].tolist() == [1.0, 2.0, 3.0]
    assert torch.allclose(det["conf"], torch.sigmoid(torch.tensor([3.0, 2.0, 1.0])))
    # normalised cxcywh -> source pixels (w=200, h=100), not clipped
    assert torch.allclose(det["xyxy"][0], torch.tensor([80.0, 30.0, 120.0, 70.0]))
    assert torch.allclose(det["xyxy"][2], torch.tensor([0.0, 50.0, 100.0, 100.0]))
    (top1,) = topk_postprocess(logits, boxes, [meta], conf=0.5, max_det=1)
    assert top1["cls"].tolist() == [1.0]
    (only3,) = topk_postprocess(logits, boxes, [meta], conf=0.5, max_det=1, classes=[3])
    assert only3["cls"].tolist() == [3.0]


def test_topk_maps_boxes_through_a_plain_letterbox_meta():
    logits = torch.full((1, 1, 2), 5.0)
    boxes = torch.tensor([[[0.5, 0.5, 0.5, 0.5]]])
    (det,) = topk_postprocess(logits, boxes, [LetterboxMeta((64, 128), 1.0, (0.0, 0.0))], conf=0.1, max_det=10)
    assert torch.allclose(det["xyxy"][0], torch.tensor([32.0, 16.0, 96.0, 48.0]))


@pytest.mark.parametrize("method", ["opencv-linear", "pil-bilinear"])
@pytest.mark.parametrize("shape", [(37, 53), (480, 640), (700, 300)])
def test_stretch_resize_keeps_a_flat_image_flat_and_bounded(method, shape):
    g = torch.Generator().manual_seed(0)
    flat = torch.full((3, *shape), 173, dtype=torch.uint8)
    assert torch.equal(resize_u8(flat, 64, 96, method), torch.full((3, 64, 96), 173, dtype=torch.uint8))
    img = torch.randint(0, 256, (3, *shape), generator=g, dtype=torch.uint8)
    out = resize_u8(img, 64, 64, method)
    assert out.dtype == torch.uint8 and tuple(out.shape) == (3, 64, 64)
    assert torch.equal(resize_u8(img, *shape, method), img)
    # no overshoot beyond the source range, and close to a float bilinear resize
    ref = torch.nn.functional.interpolate(img[None].float(), size=(64, 64), mode="bilinear", align_corners=False,
                                          antialias=method == "pil-bilinear")[0]
    assert int(out.min()) >= int(img.min()) and int(out.max()) <= int(img.max())
    assert float((out.float() - ref).abs().mean()) < 2.0


def test_stretch_batches_images_of_any_shape_with_their_metas():
    pre = Stretch(64, method="opencv-linear")
    imgs = [torch.randint(0, 256, (3, 30, 50), dtype=torch.uint8), torch.rand(3, 90, 40)]
    batch, metas = pre(imgs)
    assert tuple(batch.shape) == (2, 3, 64, 64) and 0.0 <= float(batch.min()) and float(batch.max()) <= 1.0
    assert [m.orig_shape for m in metas] == [(30, 50), (90, 40)]
    assert pre.describe()["placement"] == "stretch"


def test_anchor_cache_builds_once_per_shape_and_is_bypassed_while_tracing():
    cache = AnchorCache()
    a1, v1 = cache.anchors([(4, 4), (2, 2)], torch.device("cpu"))
    a2, _ = cache.anchors([(4, 4), (2, 2)], torch.device("cpu"))
    assert a1 is a2 and a1.shape == (1, 20, 4) and v1.dtype == torch.bool
    ref, valid = make_anchors([(4, 4), (2, 2)])
    assert torch.equal(a1, ref) and torch.equal(v1, valid)
    assert bool(torch.isinf(a1[~v1.expand_as(a1)]).all())
    shapes = cache.level_shapes([(4, 4), (2, 2)], torch.device("cpu"))
    assert isinstance(shapes, LevelShapes) and shapes == ((4, 4), (2, 2))
    assert cache.level_shapes([(4, 4), (2, 2)], torch.device("cpu")) is shapes

    def traced(x):
        return x + cache.anchors([(3, 3)], x.device)[0].sum()

    torch.jit.trace(traced, torch.zeros(1), check_trace=False)  # the check re-runs it eagerly
    assert len(cache._entries) == 2  # nothing built while tracing was kept


@pytest.mark.parametrize(("family", "size"), [("rtdetr", "r18"), ("dfine", "n")])
def test_detr_forward_is_per_image_and_shaped_as_the_contract_says(family, size):
    fam = get_family(family)
    torch.manual_seed(0)
    net = fam.build(size, 5).eval()
    x = torch.rand(2, 3, 160, 160)  # dfine-n (strides 16, 32) has 125 positions here: 125 queries
    with torch.no_grad():
        both = net(x)
        one = net(x[1:])
    names = fam.export.output_names
    queries = 300 if family == "rtdetr" else 125
    assert tuple(both[names[0]].shape) == (2, queries, 5) and tuple(both[names[1]].shape) == (2, queries, 4)
    # the same image alone or second in a batch: the same rows (near-tied queries may swap)
    rows = [torch.cat([out[names[0]][i], out[names[1]][i]], -1).numpy() for out, i in ((both, 1), (one, 0))]
    ok, moved, err = rows_match(rows[0], rows[1], 1e-4)
    assert ok, f"{moved} rows differ, max error {err:.3g}"
