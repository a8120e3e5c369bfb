"""Semantic-segmentation training data: YAML, mask checking, dataset geometry, augmentation, metrics."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from PIL import Image

from libreyolo.errors import ArgumentError, DatasetError
from libreyolo.ops.letterbox import Letterbox
from libreyolo.train import semantic_data
from libreyolo.train.data import build_dataloader
from libreyolo.train.semantic_data import (
    IGNORE_INDEX,
    SemanticAugment,
    SemanticDataset,
    build_semantic_dataset,
    collate_semantic,
    load_semantic_yaml,
    mask_path,
    resize_nearest,
)
from libreyolo.train.semantic_metrics import SemanticMetrics
from libreyolo.train.shapes import make_segmentation_dataset

NAMES = ["bg", "red", "green", "blue"]
PALETTE = np.array([(128, 128, 128), (230, 30, 30), (30, 210, 30), (30, 30, 230)])


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "libreyolo"]


def _blocks(h, w):
    """A class map of rectangles of every class, asymmetric left-right (flips show)."""
    mask = np.zeros((h, w), np.uint8)
    mask[h // 6: h // 2, w // 8: w // 2] = 1
    mask[h // 2:, w // 2: w - w // 10] = 2
    mask[h // 8: h // 3, 2 * w // 3:] = 3
    return mask


def _pair(root, name, mask=None, *, h=48, w=64, split="train", mode="L", missing=False):
    """An image whose colour encodes its class (PALETTE[mask]) and, unless ``missing``, its mask file."""
    ids = _blocks(h, w) if mask is None else mask
    img = root / "images" / split / f"{name}.png"
    img.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(PALETTE[np.clip(ids, 0, 3)].astype(np.uint8)).save(img)
    if not missing:
        out = root / "masks" / split / f"{name}.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.asarray(ids, np.uint8)).convert(mode).save(out)
    return img


def _classes_of(img: torch.Tensor) -> np.ndarray:
    """The class whose colour each pixel is nearest to."""
    arr = img.permute(1, 2, 0).numpy().astype(np.int64)
    return ((arr[:, :, None, :] - PALETTE[None, None]) ** 2).sum(-1).argmin(-1)


def _interior(mask: np.ndarray) -> np.ndarray:
    """Labelled pixels whose 3x3 neighbourhood has their class (away from resampled edges)."""
    padded = np.pad(mask, 1, constant_values=-1)
    same = np.ones(mask.shape, bool)
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            same &= padded[1 + dy: 1 + dy + mask.shape[0], 1 + dx: 1 + dx + mask.shape[1]] == mask
    return same & (mask != IGNORE_INDEX)


# --- data YAML and the generated dataset -----------------------------------------------------------
def test_generated_dataset_loads_without_warnings(tmp_path, caplog):
    data_yaml = make_segmentation_dataset(tmp_path / "seg", n_train=4, n_val=2, imgsz=80, nc=4, seed=3)
    cfg = load_semantic_yaml(data_yaml)
    assert cfg.task == "semantic" and cfg.masks_dir == "masks" and cfg.nc == 4
    assert cfg.names == {0: "background", 1: "red", 2: "green", 3: "blue"}
    assert len(cfg.train) == 4 and len(cfg.val) == 2
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        ds = build_semantic_dataset(cfg, "train", 64, augment=False)
    assert _warnings(caplog) == [] and len(ds) == 4
    sizes = set()
    for image, mp in zip(ds.files, ds.mask_files, strict=True):
        assert mp == tmp_path / "seg" / "masks" / "train" / f"{image.stem}.png"
        ids = np.asarray(Image.open(mp))
        assert Image.open(mp).mode == "L" and Image.open(image).size == ids.shape[::-1]
        assert set(np.unique(ids)) <= {0, 1, 2, 3, 255} and (ids == 255).any() and (ids > 0).any()
        sizes.add(ids.shape)
    assert any(h != w for h, w in sizes) and len(sizes) > 1
    again = make_segmentation_dataset(tmp_path / "again", n_train=4, n_val=2, imgsz=80, nc=4, seed=3)
    assert (again.parent / "masks/val/val_00001.png").read_bytes() == (data_yaml.parent / "masks/val/val_00001.png"
                                                                      ).read_bytes()


def test_generated_classes_are_told_apart_by_colour(tmp_path):
    cfg = load_semantic_yaml(make_segmentation_dataset(tmp_path, n_train=3, n_val=1, imgsz=96, nc=3, seed=1))
    for image in cfg.train:
        arr = np.asarray(Image.open(image)).astype(np.float64)
        ids = np.asarray(Image.open(mask_path(image)))
        means = {c: arr[ids == c].mean(0) for c in (1, 2) if (ids == c).sum() > 20}
        for c, m in means.items():  # each shape class sits near its own colour (red, green)
            assert int(np.argmax(m)) == c - 1, (image, c, m)


def test_yaml_takes_lists_and_masks_dir(tmp_path):
    root = tmp_path / "ds"
    a = _pair(root, "a")
    v = _pair(root, "v", split="val")
    (root / "train.txt").write_text("images/train/a.png\n")
    (root / "masks").rename(root / "ann")
    (tmp_path / "d.yaml").write_text("path: ds\ntrain: train.txt\nval: [images/val]\nmasks_dir: ann\n"
                                     "names: {0: bg, 1: r, 2: g, 3: b}\n")
    cfg = load_semantic_yaml(tmp_path / "d.yaml")
    assert cfg.train == [a] and cfg.val == [v] and cfg.masks_dir == "ann"
    assert build_semantic_dataset(cfg, "val", 32, False).mask_files == [root / "ann" / "val" / "v.png"]
    (tmp_path / "e.yaml").write_text("path: ds\ntrain: train.txt\nval: train.txt\nmasks_dir: a/b\nnames: [x]\n")
    with pytest.raises(DatasetError, match="'masks_dir' must be a folder name"):
        load_semantic_yaml(tmp_path / "e.yaml")


def test_mask_path_replaces_the_last_images_folder(tmp_path):
    image = tmp_path / "images" / "set" / "images" / "x.jpg"
    assert mask_path(image) == tmp_path / "images" / "set" / "masks" / "x.png"
    assert mask_path(tmp_path / "flat" / "x.jpg") is None


# --- mask checking --------------------------------------------------------------------------------
def _rgb_mask(root):
    return _pair(root, "bad", mode="RGB")


def _wrong_size(root):
    img = _pair(root, "bad")
    Image.fromarray(_blocks(40, 64)).save(root / "masks" / "train" / "bad.png")
    return img


def _corrupt(root):
    img = _pair(root, "bad")
    full = (root / "masks" / "train" / "bad.png").read_bytes()
    (root / "masks" / "train" / "bad.png").write_bytes(full[: len(full) // 2])
    return img


BAD_MASKS = {  # case -> (make the bad pair, phrase of its warning)
    "missing": (lambda root: _pair(root, "bad", missing=True), "mask file not found"),
    "wrong size": (_wrong_size, "mask is 64x40 (w x h) but its image bad.png is 64x48"),
    "rgb": (_rgb_mask, "mask has 3 channels (mode RGB)"),
    "corrupt": (_corrupt, "the file is corrupt or not an image"),
    "empty": (lambda root: (_pair(root, "bad"), (root / "masks/train/bad.png").write_bytes(b""))[0], "is empty"),
}


@pytest.mark.parametrize("case", list(BAD_MASKS))
def test_each_bad_mask_warns_once_naming_the_file_and_is_skipped(tmp_path, caplog, case):
    make, phrase = BAD_MASKS[case]
    good = _pair(tmp_path, "good")
    bad = make(tmp_path)
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        ds = SemanticDataset([good, bad], NAMES, 32, augment=False)
    assert ds.files == [good]
    warnings = _warnings(caplog)
    assert len(warnings) == 1, warnings
    assert str(tmp_path / "masks" / "train" / "bad.png") in warnings[0] and phrase in warnings[0], warnings
    assert "skipped" in warnings[0]
    assert "2 images: 1 usable, 1 skipped" in caplog.records[-1].getMessage()


def test_out_of_range_ids_warn_once_and_become_ignore(tmp_path, caplog):
    ids = _blocks(48, 64)
    ids[:4, :4] = 7
    ids[-2:, -3:] = 200
    img = _pair(tmp_path, "odd", ids)
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        ds = SemanticDataset([img], NAMES, 64, augment=False)
    warnings = _warnings(caplog)
    assert len(warnings) == 1, warnings
    text = warnings[0]
    assert str(tmp_path / "masks" / "train" / "odd.png") in text and "class ids 7, 200 outside 0..3" in text
    assert "22 pixels" in text and "treated as ignore (255)" in text
    assert "1 masks with out-of-range class ids" in caplog.records[-1].getMessage()
    expected = ids.astype(np.int64)
    expected[(expected == 7) | (expected == 200)] = 255
    assert torch.equal(ds[0][2]["mask_orig"], torch.from_numpy(expected))


def test_palette_and_16_bit_masks_are_class_ids(tmp_path, caplog):
    ids = _blocks(48, 64)
    p_img = _pair(tmp_path, "pal", ids)
    pal = Image.fromarray(ids).convert("P")
    pal.putpalette([v for c in PALETTE.tolist() for v in c] + [0] * (256 - 4) * 3)
    pal.save(tmp_path / "masks" / "train" / "pal.png")
    assert Image.open(tmp_path / "masks" / "train" / "pal.png").mode == "P"
    i16 = _pair(tmp_path, "wide", ids)
    Image.fromarray(ids.astype(np.uint16)).save(tmp_path / "masks" / "train" / "wide.png")
    assert Image.open(tmp_path / "masks" / "train" / "wide.png").mode.startswith("I")
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        ds = SemanticDataset([p_img, i16], NAMES, 64, augment=False)
    assert _warnings(caplog) == []
    for k in range(2):
        assert torch.equal(ds[k][2]["mask_orig"], torch.from_numpy(ids.astype(np.int64)))


def test_warnings_stop_at_the_limit_with_one_summary(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(semantic_data, "_MAX_WARNINGS", 2)
    files = [_pair(tmp_path, "good")] + [_pair(tmp_path, f"m{k}", missing=True) for k in range(4)]
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        SemanticDataset(files, NAMES, 32, augment=False)
    warnings = _warnings(caplog)
    assert len(warnings) == 3 and warnings[-1] == "2 more dataset warnings not shown"


def test_no_usable_image_is_a_dataset_error(tmp_path, caplog):
    files = [_pair(tmp_path, "a", missing=True), _rgb_mask(tmp_path)]
    with caplog.at_level(logging.INFO, logger="libreyolo"), pytest.raises(DatasetError) as info:
        SemanticDataset(files, NAMES, 32, augment=False)
    assert "none of the 2 images has a usable mask" in str(info.value)
    assert str(tmp_path / "masks" / "train") in str(info.value)
    assert len(_warnings(caplog)) == 2


# --- evaluation geometry --------------------------------------------------------------------------
@pytest.mark.parametrize("h, w", [(60, 100), (90, 50)])
def test_eval_sample_is_letterboxed_like_predict(tmp_path, h, w):
    img_path = _pair(tmp_path, "x", h=h, w=w, split="val")
    ids = _blocks(h, w)
    image, mask, info = SemanticDataset([img_path], NAMES, 64, augment=False)[0]
    assert image.dtype == torch.uint8 and image.shape == (3, 64, 64)
    assert mask.dtype == torch.int64 and mask.shape == (64, 64)
    ratio = 64 / max(h, w)
    new_h, new_w = int(h * ratio), int(w * ratio)  # SegFormer's floor rounding, top-left
    assert info["orig_shape"] == (h, w) and info["ratio"] == pytest.approx(ratio) and info["pad"] == (0.0, 0.0)
    assert info["path"] == str(img_path)
    assert torch.equal(info["mask_orig"], torch.from_numpy(ids.astype(np.int64)))
    reference, _ = Letterbox(64, pad_value=114, placement="topleft", size_rounding="floor", divisor=1.0)(
        [torch.from_numpy(np.array(Image.open(img_path))).permute(2, 0, 1)], dtype=torch.uint8)
    assert torch.equal(image, reference[0])
    assert (mask[new_h:] == 255).all() and (mask[:, new_w:] == 255).all()
    assert (image[:, new_h:] == 114).all() and (image[:, :, new_w:] == 114).all()
    assert torch.equal(mask[:new_h, :new_w], torch.from_numpy(resize_nearest(ids.astype(np.int64), new_h, new_w)))
    inner = _interior(mask.numpy())
    assert inner.sum() > 0.5 * new_h * new_w
    assert (_classes_of(image)[inner] == mask.numpy()[inner]).all()


def test_eval_uses_the_given_letterbox_and_keeps_uint8_rgb(tmp_path):
    img_path = _pair(tmp_path, "x", h=60, w=100, split="val")
    model_letterbox = Letterbox(64, pad_value=114, placement="center", divisor=255.0, channels="BGR")
    image, mask, info = SemanticDataset([img_path], NAMES, 64, False, letterbox=model_letterbox)[0]
    assert info["pad"] == (0.0, 13.0)  # round(60 * 0.64) = 38 rows, centred
    assert (mask[:13] == 255).all() and (mask[51:] == 255).all() and (mask[13:51] != 255).any()
    assert image.dtype == torch.uint8 and int(image.max()) > 1 and (image[:, :13] == 114).all()
    inner = _interior(mask.numpy())
    assert (_classes_of(image)[inner] == mask.numpy()[inner]).all()  # still RGB
    with pytest.raises(ValueError, match="letterbox is for 64-pixel inputs"):
        SemanticDataset([img_path], NAMES, 32, False, letterbox=model_letterbox)


# --- training augmentation ------------------------------------------------------------------------
def test_augmentation_keeps_image_and_mask_aligned(tmp_path):
    files = [_pair(tmp_path, "wide", h=60, w=96), _pair(tmp_path, "tall", h=90, w=56)]
    ds = SemanticDataset(files, NAMES, 48, augment=True)
    flips, padded = set(), 0
    for seed in range(10):
        torch.manual_seed(seed)
        image, mask, info = ds[seed % 2]
        assert image.shape == (3, 48, 48) and image.dtype == torch.uint8
        assert mask.shape == (48, 48) and mask.dtype == torch.int64
        m = mask.numpy()
        assert set(np.unique(m)) <= {0, 1, 2, 3, 255}
        inner = _interior(m)
        assert inner.sum() > 0, f"seed {seed}: no labelled pixels"
        assert (_classes_of(image)[inner] == m[inner]).all(), f"seed {seed}: image and mask disagree"
        pad = (image == 114).all(0).numpy()
        assert (m[pad] == 255).all()
        padded += int(pad.any())
        flips.add(info["flipped"])
        assert 0.5 * 48 / 56 - 1e-9 <= info["ratio"] <= 2.0 * 48 / 56 + 1e-9 or info["path"].endswith("wide.png")
    assert flips == {True, False} and padded > 0  # scales below 1 leave padding, flips both ways


def test_augmentation_is_deterministic_for_a_seed(tmp_path):
    ds = SemanticDataset([_pair(tmp_path, "a", h=60, w=80)], NAMES, 40, augment=True)
    outs = []
    for seed in (5, 5, 6):
        torch.manual_seed(seed)
        outs.append(ds[0])
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1]) and outs[0][2] == outs[1][2]
    assert not (torch.equal(outs[0][0], outs[2][0]) and outs[0][2] == outs[2][2])

    def batches(seed):  # without workers the samples draw from torch's global RNG
        torch.manual_seed(seed)
        loader = build_dataloader(ds, 1, shuffle=True, workers=0, pin_memory=False, seed=seed,
                                  collate_fn=collate_semantic)
        return [b[1] for _ in range(3) for b in loader]

    assert all(torch.equal(a, b) for a, b in zip(batches(1), batches(1), strict=True))


def test_hsv_option_changes_colours_only(tmp_path):
    img = _pair(tmp_path, "a", h=60, w=80)
    plain = SemanticDataset([img], NAMES, 40, True, SemanticAugment())
    jitter = SemanticDataset([img], NAMES, 40, True, SemanticAugment(hsv_v=0.5, hsv_s=0.5))
    torch.manual_seed(3)
    a = plain[0]
    torch.manual_seed(3)
    b = jitter[0]
    assert torch.equal(a[1], b[1]) and a[2] == b[2]
    assert not torch.equal(a[0], b[0])


def test_crop_avoids_one_class_dominating():
    mask = np.zeros((200, 200), np.int64)
    mask[:, 100:] = 1

    def share(cat_max_ratio, seed):
        rng = np.random.default_rng(seed)
        top, left = semantic_data._crop_origin(mask, 64, cat_max_ratio, rng)
        crop = mask[top:top + 64, left:left + 64]
        return np.bincount(crop.ravel(), minlength=2).max() / crop.size

    balanced = sum(share(0.75, s) <= 0.75 for s in range(20))
    unconstrained = sum(share(1.0, s) <= 0.75 for s in range(20))
    assert balanced >= 16 and unconstrained < balanced


@pytest.mark.parametrize("kwargs, message", [
    ({"scale": (0.0, 1.0)}, "scale"), ({"scale": (2.0, 1.0)}, "scale"), ({"cat_max_ratio": 0.0}, "cat_max_ratio"),
    ({"fliplr": 1.5}, "fliplr"), ({"hsv_v": -0.1}, "hsv_v"),
])
def test_augment_settings_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SemanticAugment(**kwargs)


def test_collate_stacks_images_and_masks(tmp_path):
    files = [_pair(tmp_path, "a", h=60, w=80), _pair(tmp_path, "b", h=40, w=30)]
    ds = SemanticDataset(files, NAMES, 32, augment=False)
    images, masks, infos = collate_semantic([ds[0], ds[1]])
    assert images.shape == (2, 3, 32, 32) and images.dtype == torch.uint8
    assert masks.shape == (2, 32, 32) and masks.dtype == torch.int64
    assert [i["orig_shape"] for i in infos] == [(60, 80), (40, 30)]
    assert infos[1]["mask_orig"].shape == (40, 30)


# --- metrics --------------------------------------------------------------------------------------
def _numpy_metrics(preds, gts, nc, ignore=255):
    """Per-class float64 loop, written independently of the confusion matrix."""
    p = np.concatenate([x.ravel() for x in preds]).astype(np.int64)
    g = np.concatenate([x.ravel() for x in gts]).astype(np.int64)
    keep = g != ignore
    p, g = p[keep], g[keep]
    ious, accs = [], []
    for c in range(nc):
        inter = float(np.sum((p == c) & (g == c)))
        union = float(np.sum((p == c) | (g == c)))
        if union > 0:
            ious.append(inter / union)
        if np.sum(g == c) > 0:
            accs.append(inter / float(np.sum(g == c)))
    return {"mIoU": np.mean(ious), "pixel_acc": float(np.sum(p == g)) / len(g), "mAcc": np.mean(accs)}


def test_metrics_match_an_independent_computation():
    rng = np.random.default_rng(0)
    nc = 5
    preds, gts = [], []
    for h, w in ((17, 23), (30, 11), (8, 8)):
        g = rng.integers(0, nc - 1, (h, w))  # class 4 never in the ground truth: only as a false positive
        g[rng.random((h, w)) < 0.1] = 255
        p = np.where(rng.random((h, w)) < 0.6, np.clip(g, 0, nc - 1), rng.integers(0, nc, (h, w)))
        preds.append(p)
        gts.append(g)
    metrics = SemanticMetrics(nc)
    metrics.update([torch.from_numpy(p) for p in preds[:2]], [torch.from_numpy(g) for g in gts[:2]])
    metrics.update(torch.from_numpy(preds[2])[None], torch.from_numpy(gts[2])[None])  # a batched tensor
    got = metrics.compute()
    expected = _numpy_metrics(preds, gts, nc)
    for key in ("mIoU", "pixel_acc", "mAcc"):
        assert got[key] == pytest.approx(expected[key], abs=1e-12), key
    assert len(metrics.iou_per_class) == 5
    metrics.reset()
    assert metrics.compute() == {"mIoU": 0.0, "pixel_acc": 0.0, "mAcc": 0.0}


def test_metrics_tiny_case_by_hand():
    gt = torch.tensor([[0, 0, 1, 1], [0, 255, 1, 1]])
    pred = torch.tensor([[0, 1, 1, 1], [0, 2, 0, 1]])
    metrics = SemanticMetrics(4, names={0: "a", 1: "b", 2: "c", 3: "d"})
    metrics.update(pred, gt)
    # 7 scored pixels (255 ignored, so its prediction 2 is not a false positive): 5 correct.
    # class 0: tp 2, fp 1, fn 1 -> 2/4; class 1: tp 3, fp 1, fn 1 -> 3/5; classes 2, 3: union 0, left out
    got = metrics.compute()
    assert got["mIoU"] == pytest.approx((2 / 4 + 3 / 5) / 2)
    assert got["pixel_acc"] == pytest.approx(5 / 7)
    assert got["mAcc"] == pytest.approx((2 / 3 + 3 / 4) / 2)
    assert metrics.iou_per_class == {"a": pytest.approx(0.5), "b": pytest.approx(0.6)}


def test_metrics_refuse_mismatched_or_out_of_range_masks():
    metrics = SemanticMetrics(3)
    with pytest.raises(ArgumentError, match="shape"):
        metrics.update(torch.zeros(2, 4, 4, dtype=torch.long), torch.zeros(2, 4, 5, dtype=torch.long))
    with pytest.raises(ArgumentError, match="class id 3"):
        metrics.update(torch.full((4, 4), 3), torch.zeros(4, 4, dtype=torch.long))
    with pytest.raises(ArgumentError, match="integer class ids"):
        metrics.update(torch.zeros(1, 4, 4), torch.zeros(1, 4, 4, dtype=torch.long))
    with pytest.raises(ArgumentError, match="one predicted mask per"):
        metrics.update([torch.zeros(4, 4, dtype=torch.long)], [])


@pytest.mark.parametrize("h, w, new_h, new_w", [(48, 64, 30, 40), (17, 23, 64, 51), (90, 50, 38, 21)])
def test_mask_resize_samples_pixel_centres_like_torch_nearest_exact(h, w, new_h, new_w):
    ids = np.random.default_rng(h).integers(0, 4, (h, w))
    expected = torch.nn.functional.interpolate(torch.from_numpy(ids)[None, None].double(), size=(new_h, new_w),
                                               mode="nearest-exact")[0, 0].long().numpy()
    np.testing.assert_array_equal(resize_nearest(ids, new_h, new_w), expected)
