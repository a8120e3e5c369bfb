"""Training data: data YAML parsing, label checking, letterbox/augmentation geometry, loaders."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from PIL import Image

from libreyolo.errors import DatasetError
from libreyolo.train.augment import AugmentConfig, hsv_jitter, random_affine
from libreyolo.train.data import (
    ClassifyDataset,
    DetectionDataset,
    build_dataloader,
    collate_classify,
    collate_detect,
    load_classify_root,
    load_data_yaml,
    set_loader_epoch,
)
from libreyolo.train.shapes import CLASSES, make_shapes_dataset

NAMES = ["a", "b", "c"]
COLOURS = [(220, 30, 30), (30, 200, 30), (30, 30, 220), (220, 220, 30)]


def _image(path, w=64, h=48, colour=(128, 128, 128)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (w, h), colour).save(path)
    return path


def _item(root, name, labels, split="train", **kw):
    """An image under root/images/<split> and, unless ``labels`` is None, its label file."""
    img = _image(root / "images" / split / f"{name}.png", **kw)
    if labels is not None:
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split / f"{name}.txt").write_text(labels)
    return img


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "libreyolo"]


# --- data YAML ------------------------------------------------------------------------------------
def test_data_yaml_resolves_folders_lists_and_names(tmp_path):
    root = tmp_path / "ds"
    a = _item(root, "a", "0 0.5 0.5 0.2 0.2\n")
    b = _item(root, "b", "")
    v = _item(root, "v", "", split="val")
    extra = _image(root / "more" / "x.jpg")
    (root / "extra.txt").write_text("more/x.jpg\n\n")
    (tmp_path / "d.yaml").write_text("path: ds\ntrain: [images/train, extra.txt]\nval: images/val\n"
                                     "names: {0: cat, 1: dog}\n")
    cfg = load_data_yaml(tmp_path / "d.yaml")
    assert cfg.root == tmp_path / "ds" and cfg.task == "detect"
    assert cfg.train == [a, b, extra] and cfg.val == [v]
    assert cfg.names == {0: "cat", 1: "dog"} and cfg.nc == 2

    (tmp_path / "e.yaml").write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames: [x, y, z]\n")
    assert load_data_yaml(tmp_path / "e.yaml").names == {0: "x", 1: "y", 2: "z"}


@pytest.mark.parametrize("text, expected", [
    (None, "not found"),
    ("train: [unclosed\n", "cannot be parsed"),
    ("- just\n- a list\n", "expected a mapping"),
    ("train: images/train\nnames: [a]\n", "missing key(s) val"),
    ("train: images/train\nval: images/train\n", "missing key(s) names"),
    ("path: nowhere\ntrain: images/train\nval: images/train\nnames: [a]\n", "'path' 'nowhere' resolves to"),
    ("train: images/train\nval: images/missing\nnames: [a]\n", "'val' entry 'images/missing' resolves to"),
    ("train: images/train\nval: empty\nnames: [a]\n", "no images found for 'val'"),
    ("train: images/train\nval: images/train\nnames: {0: a, 2: b}\n", "without gaps"),
    ("train: images/train\nval: images/train\nnames: [a, b]\nnc: 3\n", "'nc' is 3"),
])
def test_data_yaml_errors_say_what_is_wrong(tmp_path, text, expected):
    _item(tmp_path, "a", "")
    (tmp_path / "empty").mkdir()
    path = tmp_path / "d.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(DatasetError) as info:
        load_data_yaml(path)
    assert expected in str(info.value)
    if "resolves to" in expected:
        assert str(tmp_path) in str(info.value)  # the resolved path is named


def test_classify_root_lists_classes_and_samples(tmp_path):
    for split in ("train", "test"):
        for cls in ("dog", "cat"):
            _image(tmp_path / split / cls / "1.jpg")
    cfg = load_classify_root(tmp_path)
    assert cfg.task == "classify" and cfg.names == {0: "cat", 1: "dog"}
    assert cfg.samples("val") == [(tmp_path / "test" / "cat" / "1.jpg", 0), (tmp_path / "test" / "dog" / "1.jpg", 1)]
    _image(tmp_path / "val" / "bird" / "1.jpg")
    with pytest.raises(DatasetError, match="class folders not in train"):
        load_classify_root(tmp_path)
    with pytest.raises(DatasetError, match="missing folder"):
        load_classify_root(tmp_path / "train")


# --- label checking -------------------------------------------------------------------------------
BAD_LABELS = """0 0.5 0.5 0.2 0.2
1 0.5 0.5 0.2
1 a 0.5 0.2 0.2
5 0.5 0.5 0.2 0.2
1.5 0.5 0.5 0.2 0.2
2 0.95 0.5 0.2 0.2
1 1.5 0.5 0.2 0.2
1 0.5 0.5 0 0.2
0 0.5 0.5 0.2 0.2
1.0 0.25 0.25 0.1 0.1
"""


def test_each_bad_label_line_warns_once_and_is_fixed_or_dropped(tmp_path, caplog):
    img = _item(tmp_path, "x", BAD_LABELS, w=100, h=50)
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        ds = DetectionDataset([img], NAMES, 64, augment=False)
    warnings = _warnings(caplog)
    label_file = str(tmp_path / "labels" / "train" / "x.txt")
    expected = {
        "expected 5 fields": "line 2", "not all finite numbers": "line 3", "outside [0, 3)": "line 4",
        "not an integer": "line 5", "past the image edge": "line 6", "entirely outside": "line 7",
        "zero or negative width": "line 8", "repeats an earlier one": "line 9",
    }
    assert len(warnings) == len(expected), warnings
    for phrase, line in expected.items():
        hits = [w for w in warnings if phrase in w]
        assert len(hits) == 1 and label_file in hits[0] and line in hits[0], (phrase, warnings)
    summary = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO][-1]
    assert "7 label lines dropped" in summary and "1 boxes clipped" in summary
    expected_boxes = np.array([[0, 0.4, 0.4, 0.6, 0.6], [2, 0.85, 0.4, 1.0, 0.6], [1, 0.2, 0.2, 0.3, 0.3]])
    np.testing.assert_allclose(ds.labels[0], expected_boxes, atol=1e-6)
    _, labels, info = ds[0]  # 100x50 -> 64x32 placed at top 16
    np.testing.assert_allclose(labels.numpy(), expected_boxes * [1, 64, 32, 64, 32] + [0, 0, 16, 0, 16], atol=1e-4)


def test_missing_and_empty_label_files_are_backgrounds(tmp_path, caplog):
    files = [_item(tmp_path, "boxes", "0 0.5 0.5 0.5 0.5\n"), _item(tmp_path, "empty", ""),
             _item(tmp_path, "missing", None)]
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        ds = DetectionDataset(files, NAMES, 64, augment=False)
    assert _warnings(caplog) == []
    assert "2 backgrounds (1 without a label file, 1 with no boxes)" in caplog.records[-1].getMessage()
    assert [len(ds[i][1]) for i in range(3)] == [1, 0, 0]


def test_labels_beside_the_image_are_found(tmp_path):
    img = _image(tmp_path / "flat" / "a.png")
    (tmp_path / "flat" / "a.txt").write_text("2 0.5 0.5 0.5 0.5\n")
    assert DetectionDataset([img], NAMES, 64, augment=False).labels[0][:, 0].tolist() == [2]


def test_corrupt_images_are_skipped_with_a_warning(tmp_path, caplog):
    good = _item(tmp_path, "good", "0 0.5 0.5 0.5 0.5\n")
    junk = tmp_path / "images" / "train" / "junk.jpg"
    junk.write_bytes(b"not an image at all" * 10)
    buffer = tmp_path / "full.jpg"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buffer)
    cut = tmp_path / "images" / "train" / "cut.jpg"
    cut.write_bytes(buffer.read_bytes()[: buffer.stat().st_size // 2])
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        ds = DetectionDataset([junk, good, cut, tmp_path / "gone.jpg"], NAMES, 64, augment=False)
    assert ds.files == [good]
    warnings = _warnings(caplog)
    assert len(warnings) == 3 and all("image skipped" in w for w in warnings)
    for bad in ("junk.jpg", "cut.jpg", "gone.jpg"):
        assert any(bad in w for w in warnings)
    assert "3 skipped" in caplog.records[-1].getMessage()
    with pytest.raises(DatasetError, match="none of the 2 images"):
        DetectionDataset([junk, cut], NAMES, 64, augment=False)


# --- geometry -------------------------------------------------------------------------------------
def _colour_mask(img: torch.Tensor, colour) -> np.ndarray:
    arr = img.permute(1, 2, 0).numpy().astype(np.int32)
    return np.sqrt(((arr - np.array(colour)) ** 2).sum(-1)) < 60


def _box_iou(a, b) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - iw * ih
    return iw * ih / union


def test_letterbox_labels_map_back_to_the_original_image(tmp_path):
    arr = np.full((60, 100, 3), 128, np.uint8)
    arr[10:40, 20:50] = COLOURS[0]  # box (20, 10, 50, 40) in the 100 x 60 original
    path = tmp_path / "images" / "val" / "r.png"
    path.parent.mkdir(parents=True)
    Image.fromarray(arr).save(path)
    (tmp_path / "labels" / "val").mkdir(parents=True)
    (tmp_path / "labels" / "val" / "r.txt").write_text("0 0.35 0.416667 0.3 0.5\n")
    img, labels, info = DetectionDataset([path], NAMES, 64, augment=False)[0]
    assert img.dtype == torch.uint8 and img.shape == (3, 64, 64)
    assert info["orig_shape"] == (60, 100) and info["ratio"] == pytest.approx(0.64)
    left, top = info["pad"]
    back = (labels[0, 1:].numpy() - [left, top, left, top]) / info["ratio"]
    np.testing.assert_allclose(back, [20, 10, 50, 40], atol=1e-3)
    ys, xs = np.nonzero(_colour_mask(img, COLOURS[0]))
    assert _box_iou(labels[0, 1:].tolist(), [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]) > 0.9
    assert (img[:, : int(top)] == 114).all() and (img[:, int(top) + 38:] == 114).all()  # centred grey padding


@pytest.mark.parametrize("mosaic", [1.0, 0.0])
def test_augmented_boxes_cover_their_objects(tmp_path, mosaic):
    files = []
    for k, colour in enumerate(COLOURS):  # one rectangle of its own colour per image, class = colour
        arr = np.full((80, 96, 3), 128, np.uint8)
        x1, y1, x2, y2 = 10 + 6 * k, 12 + 4 * k, 50 + 8 * k, 48 + 5 * k
        arr[y1:y2, x1:x2] = colour
        path = tmp_path / "images" / f"{k}.png"
        path.parent.mkdir(exist_ok=True)
        Image.fromarray(arr).save(path)
        label = f"{k} {(x1 + x2) / 192} {(y1 + y2) / 160} {(x2 - x1) / 96} {(y2 - y1) / 80}"
        path.with_suffix(".txt").write_text(label)
        files.append(path)
    hyp = AugmentConfig(mosaic=mosaic, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0, fliplr=0.5)
    ds = DetectionDataset(files, ["r", "g", "b", "y"], 64, True, hyp)
    checked = covered = coloured = 0
    for seed in range(12):
        torch.manual_seed(seed)
        img, labels, info = ds[seed % 4]
        assert img.shape == (3, 64, 64) and info["mosaic"] == (mosaic == 1.0)
        masks = [_colour_mask(img, c) for c in COLOURS]
        inside = [np.zeros((64, 64), bool) for _ in COLOURS]
        for cls, *box in labels.tolist():
            x1, y1, x2, y2 = (int(np.floor(box[0])), int(np.floor(box[1])), int(np.ceil(box[2])), int(np.ceil(box[3])))
            inside[int(cls)][y1:y2, x1:x2] = True
            ys, xs = np.nonzero(masks[int(cls)][max(y1 - 1, 0):y2 + 1, max(x1 - 1, 0):x2 + 1])
            assert len(xs), f"seed {seed}: box {box} of class {int(cls)} has none of its colour"
            found = [xs.min() + max(x1 - 1, 0), ys.min() + max(y1 - 1, 0), xs.max() + 1 + max(x1 - 1, 0),
                     ys.max() + 1 + max(y1 - 1, 0)]
            assert _box_iou(box, found) > 0.8, (seed, box, found)
            checked += 1
        covered += sum(int((m & i).sum()) for m, i in zip(masks, inside, strict=True))
        coloured += sum(int(m.sum()) for m in masks)
    assert checked >= 12
    assert covered >= 0.95 * coloured  # object pixels without a box only in slivers too small to keep


def test_mosaic_closes_for_the_last_epochs(tmp_path):
    files = [_item(tmp_path, str(k), "0 0.5 0.5 0.5 0.5\n") for k in range(2)]
    ds = DetectionDataset(files, NAMES, 64, True, AugmentConfig(close_mosaic=2))
    ds.set_epoch(7, 10)
    assert ds[0][2]["mosaic"] is True
    ds.set_epoch(8, 10)
    assert ds[0][2]["mosaic"] is False


def test_affine_warp_keeps_pixels_and_boxes_on_the_same_grid():
    """An identity warp returns the image unchanged (OpenCV samples at integer pixel centres, the
    matrix is in continuous coordinates: a half-pixel slip would blur every edge), and a 1.5x zoom
    maps a box onto exactly the pixels its object lands on."""
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
    boxes = np.array([[0, 8.0, 6.0, 24.0, 30.0]], np.float32)
    same, kept = random_affine(img, boxes, (64, 48), AugmentConfig(scale=0.0, translate=0.0), rng)
    assert np.array_equal(same, img) and np.allclose(kept, boxes)
    square = np.full((40, 40, 3), 114, np.uint8)
    square[10:20, 10:20] = (255, 0, 0)
    draws = iter([0.0, 1.5, 0.0, 0.0, 0.5, 0.5])  # angle, zoom 1.5, shear x, shear y, centred

    class Fixed:
        def uniform(self, lo, hi):
            return next(draws)

    box = np.array([[0, 10.0, 10.0, 20.0, 20.0]], np.float32)
    warped, mapped = random_affine(square, box, (40, 40), AugmentConfig(scale=0.5, translate=0.0), Fixed())
    assert np.allclose(mapped[0, 1:], [5, 5, 20, 20])  # (10 - 20) * 1.5 + 20 = 5
    ys, xs = np.nonzero((warped[..., 0] > 200) & (warped[..., 1] < 50))
    assert (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1) == (5, 5, 20, 20)
    # the pixel left of the edge, centre 4.5, samples 9.67: 1/6 of the way into the red column at 10
    # (a warp on pixel indices instead would sample 9.33, a third of the way: red 161)
    assert abs(int(warped[12, 4, 0]) - (114 + (255 - 114) / 6)) <= 3, warped[12, 4]


def test_hsv_jitter_moves_colours_but_keeps_grey(tmp_path):
    img = np.full((8, 8, 3), (200, 40, 40), np.uint8)
    img[:, :4] = 114
    out = hsv_jitter(img, 0.3, 0.0, 0.0, np.random.default_rng(1))
    assert out.shape == img.shape and out.dtype == np.uint8
    assert (out[:, :4] == 114).all() and not (out[:, 4:] == (200, 40, 40)).all()
    brighter = hsv_jitter(img, 0.0, 0.0, 0.4, np.random.default_rng(3))  # value only: hue and grey stay
    assert (brighter[:, :4] == brighter[0, 0]).all() and (brighter[:, :4, 0] == brighter[:, :4, 1]).all()
    assert hsv_jitter(img, 0.0, 0.0, 0.0, np.random.default_rng(1)) is img


# --- batching -------------------------------------------------------------------------------------
def test_collate_detect_stacks_images_and_indexes_targets():
    batch = [(torch.zeros(3, 32, 32, dtype=torch.uint8), torch.ones(n, 5), {"path": str(n)}) for n in (2, 0, 3)]
    images, targets, infos = collate_detect(batch)
    assert images.shape == (3, 3, 32, 32) and images.dtype == torch.uint8
    assert targets.shape == (5, 6) and targets[:, 0].tolist() == [0, 0, 2, 2, 2]
    assert [i["path"] for i in infos] == ["2", "0", "3"]


def _epoch(loader):
    return [(images.clone(), targets.clone()) for images, targets, _ in loader]


def test_loader_with_two_workers_is_deterministic(tmp_path):
    data = load_data_yaml(make_shapes_dataset(tmp_path, n_train=8, n_val=1, imgsz=64, seed=3))
    ds = DetectionDataset(data.train, data.names, 64, augment=True)

    def loader(seed):
        return build_dataloader(ds, 4, shuffle=True, workers=2, pin_memory=False, seed=seed, collate_fn=collate_detect)

    first, again, other = _epoch(loader(0)), _epoch(loader(0)), _epoch(loader(1))
    assert len(first) == 2
    for (a, ta), (b, tb) in zip(first, again, strict=True):
        assert torch.equal(a, b) and torch.equal(ta, tb)
    assert not all(torch.equal(a, b) for (a, _), (b, _) in zip(first, other, strict=True))


def test_set_epoch_reaches_persistent_workers(tmp_path):
    files = [_item(tmp_path, str(k), "0 0.5 0.5 0.5 0.5\n") for k in range(4)]
    ds = DetectionDataset(files, NAMES, 64, True, AugmentConfig(close_mosaic=1))
    loader = build_dataloader(ds, 2, shuffle=False, workers=1, pin_memory=False, seed=0, collate_fn=collate_detect)
    set_loader_epoch(loader, 0, 2)
    assert all(info["mosaic"] for *_, infos in loader for info in infos)
    set_loader_epoch(loader, 1, 2)
    assert not any(info["mosaic"] for *_, infos in loader for info in infos)


# --- synthetic shapes -----------------------------------------------------------------------------
def test_shapes_detection_dataset_loads_cleanly(tmp_path, caplog):
    yaml_path = make_shapes_dataset(tmp_path / "a", n_train=6, n_val=2, imgsz=96, seed=5)
    again = make_shapes_dataset(tmp_path / "b", n_train=6, n_val=2, imgsz=96, seed=5)
    data = load_data_yaml(yaml_path)
    assert data.names == dict(enumerate(CLASSES)) and len(data.train) == 6 and len(data.val) == 2
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        ds = DetectionDataset(data.train, data.names, 96, augment=False)
    assert _warnings(caplog) == []
    for k, boxes in enumerate(ds.labels):
        assert 1 <= len(boxes) <= 6 and set(boxes[:, 0].tolist()) <= {0, 1, 2}
        img, labels, _ = ds[k]
        for box in labels[:, 1:].round().int().tolist():  # a saturated shape fills each box's centre
            x1, y1, x2, y2 = box
            patch = img[:, (y1 + y2) // 2, (x1 + x2) // 2].int()
            assert int(patch.max() - patch.min()) > 60, (k, box)
    a = sorted(p.read_text() for p in (tmp_path / "a" / "labels" / "train").iterdir())
    assert a == sorted(p.read_text() for p in (tmp_path / "b" / "labels" / "train").iterdir())
    assert load_data_yaml(again).train[0].name == data.train[0].name


def test_shapes_classification_dataset_loads(tmp_path):
    root = make_shapes_dataset(tmp_path, n_train=6, n_val=3, imgsz=64, task="classify")
    data = load_classify_root(root)
    assert data.names == dict(enumerate(sorted(CLASSES)))
    samples = data.samples("train")
    assert sorted(c for _, c in samples) == [0, 0, 1, 1, 2, 2]
    assert all(data.names[c] == f.parent.name for f, c in samples)
    val = ClassifyDataset(data.samples("val"), 32, augment=False)
    x, c = val[0]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and c == data.samples("val")[0][1]
    assert -3 < float(x.mean()) < 3
    train = ClassifyDataset(samples, 32, augment=True)
    torch.manual_seed(0)
    first = train[1][0]
    torch.manual_seed(0)
    assert torch.equal(first, train[1][0])
    images, labels = collate_classify([train[0], train[1]])
    assert images.shape == (2, 3, 32, 32) and labels.dtype == torch.long and labels.shape == (2,)
