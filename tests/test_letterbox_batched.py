"""A run of same-sized images is letterboxed in one go, with the numbers of one image at a time."""
from __future__ import annotations

import pytest
import torch

from libreyolo.ops.letterbox import Letterbox

LETTERBOXES = [
    Letterbox(96),
    Letterbox(96, placement="center", channels="BGR", divisor=1.0),
    Letterbox(96, resize="pil-bilinear", size_rounding="floor"),
    Letterbox(96, resize="opencv-linear", placement="center"),
]
LETTERBOX_IDS = ["bilinear", "center-bgr-raw", "pil", "opencv"]


def one_at_a_time(lb: Letterbox, images: list[torch.Tensor]) -> tuple[torch.Tensor, list]:
    parts = [lb([img]) for img in images]
    return torch.cat([p[0] for p in parts]), [m for p in parts for m in p[1]]


@pytest.mark.parametrize("lb", LETTERBOXES, ids=LETTERBOX_IDS)
@pytest.mark.parametrize("integer", [True, False], ids=["uint8", "float"])
def test_runs_of_same_sized_images_equal_one_image_at_a_time(lb, integer):
    g = torch.Generator().manual_seed(0)

    def img(h, w):
        x = torch.rand(3, h, w, generator=g)
        return (x * 255).round().to(torch.uint8) if integer else x

    # runs of equal sizes, a lone image between them, a same-size run that is not adjacent, and one already 96x96
    images = [img(50, 80)] * 1 + [img(50, 80), img(50, 80), img(120, 40), img(50, 80), img(96, 96), img(96, 96)]
    batched, metas = lb(images)
    single, single_metas = one_at_a_time(lb, images)
    assert torch.equal(batched, single)
    assert metas == single_metas


def test_a_preallocated_output_is_filled_in_place():
    lb = Letterbox(64)
    images = [torch.randint(0, 256, (3, 30, 60), dtype=torch.uint8) for _ in range(3)]
    out = torch.full((3, 3, 64, 64), -1.0)
    got, _ = lb(images, out=out)
    assert got.data_ptr() == out.data_ptr() and not (out == -1).any()
    assert torch.equal(out, one_at_a_time(lb, images)[0])


@pytest.mark.parametrize("lb", LETTERBOXES, ids=LETTERBOX_IDS)
@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.parametrize("bgr", [False, True], ids=["rgb", "bgr"])
@pytest.mark.parametrize("hw", [(50, 80), (120, 40), (96, 96)], ids=["wide", "tall", "exact"])
def test_place_batch_of_uploaded_frames_equals_the_per_image_path(lb, n, bgr, hw):
    """``place_batch`` (what a graph holding the letterbox runs on the uploaded (B, H, W, 3) frames)
    gives the numbers of ``__call__`` on the same frames reordered one by one, bit for bit."""
    from libreyolo.data.sources import SourceImage

    frames = torch.randint(0, 256, (n, *hw, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(n))
    images = [SourceImage(frames[i], bgr=bgr).orient(frames[i]) for i in range(n)]
    want, metas = lb(images)
    got = lb.place_batch(frames, bgr)
    assert torch.equal(got, want)
    assert lb.metas_for(*hw, n) == metas


@pytest.mark.parametrize("method", ["opencv-linear", "pil-bilinear"])
@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.parametrize("bgr", [False, True], ids=["rgb", "bgr"])
@pytest.mark.parametrize("hw", [(50, 80), (200, 40), (96, 96)], ids=["wide", "tall-shrunk", "exact"])
def test_stretch_place_batch_equals_the_per_image_path(method, n, bgr, hw):
    """DETR's stretch: one batched 8-bit resize of the uploaded frames (what the whole-pipeline graph then
    holds) gives each image the numbers it gets alone, bit for bit, and the same metas."""
    from libreyolo.data.sources import SourceImage
    from libreyolo.ops.stretch import Stretch

    st = Stretch(96, method=method)
    frames = torch.randint(0, 256, (n, *hw, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(n))
    images = [SourceImage(frames[i], bgr=bgr).orient(frames[i]) for i in range(n)]
    want, metas = st(images)
    got = st.place_batch(frames, bgr)
    assert got.dtype == want.dtype and torch.equal(got, want)
    assert st.metas_for(*hw, n) == metas


@pytest.mark.parametrize("name", sorted(__import__("libreyolo.models.registry", fromlist=["families"]).families()))
@pytest.mark.parametrize("bgr", [False, True], ids=["rgb", "bgr"])
def test_every_family_place_batch_equals_its_per_image_preprocessing(name, bgr):
    """Where a family's preprocessing has a batched form for uploaded frames (what CUDA predict runs on a
    staged batch of same-size frames, eagerly and in a graph), it gives the per-image path's numbers bit
    for bit, for fp32 and fp16 (a subclass that changes ``__call__`` must change ``place_batch`` too)."""
    from libreyolo.data.sources import SourceImage
    from libreyolo.models.registry import get_family

    family = get_family(name)
    imgsz = family.check_imgsz(getattr(family, "default_imgsz", None) or 64)
    pre = family.letterbox(imgsz)
    if not callable(getattr(pre, "place_batch", None)):
        pytest.skip(f"{name}: its preprocessing has no batched form ({type(pre).__name__})")
    hw = (max(8, imgsz * 3 // 4), imgsz + 16)
    frames = torch.randint(0, 256, (2, *hw, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(7))
    images = [SourceImage(frames[i], bgr=bgr).orient(frames[i]) for i in range(2)]
    for dtype in (torch.float32, torch.float16):
        want, metas = pre(images, dtype=dtype)
        got = pre.place_batch(frames, bgr, dtype)
        assert got.dtype == want.dtype and torch.equal(got, want), (name, dtype)
        assert pre.metas_for(*hw, 2) == metas
