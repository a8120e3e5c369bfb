"""The semantic task end to end: predict on every source kind, Results.semantic_mask, plot/save/JSON,
ONNX and ExecuTorch artifacts validated and predicting the same map, training on the synthetic
dataset, and the task plugin contract itself (options, payloads)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.errors import ArgumentError
from libreyolo.results import Results
from libreyolo.tasks import get_task, payload_names
from tests import mutations

IMGSZ = 128


@pytest.fixture(scope="module")
def seg():
    """A seeded, high-gain segformer-b0 (5 classes): class maps with several classes."""
    return mutations.seeded("segformer", 8, True)


def test_every_task_is_a_plugin_with_its_own_payload_and_options():
    assert payload_names() == {"boxes": "detect", "probs": "classify", "semantic_mask": "semantic",
                               "restored": "restore"}
    assert set(get_task("detect").options) == {"conf", "iou", "max_det", "max_nms", "classes"}
    assert get_task("classify").options == {}
    assert set(get_task("semantic").options) == {"classes"}
    assert set(get_task("restore").options) == {"tile", "tile_pad"} and not get_task("restore").has_classes
    with pytest.raises(TypeError, match="unknown payload"):
        Results(names={}, orig_shape=(2, 2), masks=None)


def test_predict_takes_its_tasks_options_checks_them_and_refuses_unknown_ones(seg):
    with pytest.raises(ArgumentError, match="unknown predict option.*'bogus'.*valid for semantic: classes"):
        seg.predict(SAMPLE_IMAGE, imgsz=IMGSZ, bogus=1)
    with pytest.raises(ArgumentError, match="classes must be class ids in 0..4"):
        seg.predict(SAMPLE_IMAGE, imgsz=IMGSZ, classes=[7])
    with pytest.raises(ArgumentError, match="conf must be"):
        seg.predict(SAMPLE_IMAGE, imgsz=IMGSZ, conf=2.0)  # another task's option: checked, then ignored
    r = seg.predict(SAMPLE_IMAGE, imgsz=IMGSZ, conf=0.5)
    assert r.semantic_mask is not None and r.boxes is None and r.probs is None


def test_semantic_mask_on_the_original_canvas_from_files_arrays_tensors_and_folders(seg, tmp_path):
    rgb = np.asarray(Image.open(SAMPLE_IMAGE).convert("RGB"))
    h, w = rgb.shape[:2]
    from_file = seg.predict(SAMPLE_IMAGE, imgsz=IMGSZ)
    m = from_file.semantic_mask
    assert m.data.shape == (h, w) and m.data.dtype == torch.int64 and m.orig_shape == (h, w)
    assert len(m.classes) >= 2, m.classes  # the seeded high-gain head gives several classes
    assert len(from_file) == len(m.classes)
    for k in m.classes:
        assert torch.equal(m.class_mask(k), m.data == k)
    assert sum(m.areas().values()) == h * w
    from_bgr = seg.predict(rgb[:, :, ::-1].copy(), imgsz=IMGSZ)
    from_rgb = seg.predict(rgb, imgsz=IMGSZ, color_format="rgb")
    from_tensor = seg.predict(torch.from_numpy(rgb).permute(2, 0, 1), imgsz=IMGSZ)
    for r in (from_bgr, from_rgb, from_tensor):
        assert torch.equal(r.semantic_mask.data, m.data)
    small = Image.fromarray(rgb[: h // 2, : w // 3])
    small.save(tmp_path / "a.png")
    Image.open(SAMPLE_IMAGE).save(tmp_path / "b.jpg")
    out = seg.predict(tmp_path, imgsz=IMGSZ)
    assert [r.semantic_mask.data.shape for r in out] == [(h // 2, w // 3), (h, w)]


def test_classes_restricts_which_ids_a_pixel_may_take(seg):
    full = seg.predict(SAMPLE_IMAGE, imgsz=IMGSZ).semantic_mask
    keep = full.classes[:1] + [c for c in range(5) if c not in full.classes][:1]
    only = seg.predict(SAMPLE_IMAGE, imgsz=IMGSZ, classes=keep).semantic_mask
    assert set(only.classes) <= set(keep)
    assert torch.equal(only.data == keep[0], (only.data == keep[0]))
    assert bool((only.data[full.data == keep[0]] == keep[0]).all())  # a pixel its best class won keeps it


def test_plot_save_and_json(seg, tmp_path):
    r = seg.predict(SAMPLE_IMAGE, imgsz=IMGSZ)
    overlay = r.plot()
    assert overlay.size == (r.orig_shape[1], r.orig_shape[0])
    assert not np.array_equal(np.asarray(overlay), r.orig_rgb())  # the overlay changed the picture
    path = r.save(tmp_path / "out.jpg")
    assert Image.open(path).size == overlay.size
    palette = Image.open(tmp_path / "out_mask.png")
    assert palette.mode == "P"
    assert np.array_equal(np.asarray(palette), r.semantic_mask.numpy().astype(np.uint8))
    rows = json.loads(r.to_json())
    assert [row["class"] for row in rows] == r.semantic_mask.classes
    assert abs(sum(row["area"] for row in rows) - 1.0) < 1e-4
    assert sum(row["pixels"] for row in rows) == r.orig_shape[0] * r.orig_shape[1]
    assert "classes:" in r.verbose()


def test_cli_predict_writes_the_overlay_the_palette_png_and_json(seg, tmp_path):
    from libreyolo.cli import main

    ckpt = seg.save(tmp_path / "LibreSegformerb0-sem.pt")
    rc = main(["predict", f"model={ckpt}", f"source={SAMPLE_IMAGE}", f"save_dir={tmp_path / 'pred'}", "json=true",
               f"imgsz={IMGSZ}", "classes=0,1,2"])
    assert rc == 0
    names = sorted(p.name for p in (tmp_path / "pred").iterdir())
    stem = SAMPLE_IMAGE.stem if hasattr(SAMPLE_IMAGE, "stem") else "sample"
    assert any(n.endswith("_mask.png") for n in names) and any(n.endswith(".json") for n in names), names
    rows = json.loads(next((tmp_path / "pred").glob("*.json")).read_text())
    assert {row["class"] for row in rows} <= {0, 1, 2}, (stem, rows)


@pytest.fixture(scope="module")
def artifacts(seg, tmp_path_factory):
    pytest.importorskip("onnxruntime")
    folder = tmp_path_factory.mktemp("seg-artifacts")
    out = {"onnx": seg.export(format="onnx", imgsz=IMGSZ, output=folder / "s.onnx", verbose=False)}
    try:
        import executorch.exir  # noqa: F401
    except ImportError:
        pass
    else:
        out["executorch"] = seg.export(format="executorch", imgsz=IMGSZ, output=folder / "s.pte", verbose=False)
    return out


@pytest.mark.parametrize("fmt", ["onnx", "executorch"])
def test_artifacts_validate_and_predict_the_same_map_as_eager(seg, artifacts, fmt):
    if fmt not in artifacts:
        pytest.skip(f"{fmt} is not installed (pip install 'libreyolo[{fmt}]')")
    report = artifacts[fmt].validation
    assert report.status == "passed", report.text()
    assert all(d["kind"] == "pixels" and d["passed"] for d in report.decoded), report.text()
    assert report.worst()["worst_ratio"] <= 1.0
    runtime = LibreYOLO(artifacts[fmt].path)
    assert runtime.task == "semantic"
    got = runtime.predict(SAMPLE_IMAGE).semantic_mask
    want = seg.predict(SAMPLE_IMAGE, imgsz=IMGSZ).semantic_mask
    agree = float((got.data == want.data).float().mean())
    tie = next(d for d in report.decoded if d["probe"] == "sample")
    assert agree >= tie["agreement"] - 1e-9 and agree > 0.999, agree


def test_executorch_segformer_runs_portable_ops_only(artifacts):
    if "executorch" not in artifacts:
        pytest.skip("executorch is not installed (pip install 'libreyolo[executorch]')")
    from libreyolo.export.base import get_exporter

    ops = get_exporter("executorch").graph_ops(artifacts["executorch"].path)
    others = {op for op in ops if not op.startswith("delegate::")}
    assert all(op.startswith("aten::") for op in others), others
    assert not [op for op in others if "attention" in op or "flash" in op], others


def test_onnx_segformer_attention_is_primitive_ops(artifacts):
    import onnx

    graph = onnx.load(str(artifacts["onnx"].path)).graph
    ops = {n.op_type for n in graph.node}
    assert "MatMul" in ops and "Softmax" in ops
    assert not [op for op in ops if "Attention" in op], ops


def test_match_masks_counts_only_ties_in_favour_and_fails_anything_else():
    from libreyolo.export.matching import match_masks

    ref = torch.zeros(4, 4, dtype=torch.int64)
    margin = torch.full((4, 4), 1.0)
    margin[0, 0] = 1e-7
    got = ref.clone()
    got[0, 0] = 3  # at a tie
    allowed = {"logits": torch.full((5, 4, 4), 1e-6)}
    m = match_masks({"mask": ref, "margin": margin}, {"mask": got}, allowed=allowed)
    assert m["passed"] and m["tie_swaps"] == 1 and m["matched"] == 15
    got[1, 1] = 2  # a confident pixel changed class
    m = match_masks({"mask": ref, "margin": margin}, {"mask": got}, allowed=allowed)
    assert not m["passed"] and "1 differ beyond a tie" in m["line"]
    assert not match_masks({"mask": ref}, {"mask": got[:2]})["passed"]


def test_training_on_the_synthetic_dataset_lowers_the_loss_and_the_checkpoint_loads_and_exports(tmp_path):
    pytest.importorskip("cv2")
    pytest.importorskip("onnxruntime")
    data = get_task("semantic").synthetic_dataset(tmp_path / "data", n_train=12, n_val=3, imgsz=80, nc=3, seed=1)
    torch.manual_seed(0)
    model = LibreYOLO("LibreSegformerb0-sem.yaml", nc=3)
    out = model.train(data=str(data), epochs=3, batch=4, imgsz=64, project=str(tmp_path / "runs"), name="r",
                      workers=0, lr0=1e-3, warmup_epochs=0, plots=False)
    rows = (tmp_path / "runs" / "r" / "results.csv").read_text().splitlines()
    header, first, last = rows[0].split(","), rows[1].split(","), rows[-1].split(",")
    loss = header.index("train/sem")
    assert float(last[loss]) < float(first[loss]), rows
    assert {"metrics/mIoU", "metrics/pixel_acc"} <= set(header)
    best = LibreYOLO(out["best"])
    assert best.task == "semantic" and best.nc == 3 and best.names == {0: "background", 1: "red", 2: "green"}
    metrics = best.val(data=str(data), batch=2, workers=0)
    assert set(metrics) >= {"mIoU", "pixel_acc", "mAcc"} and 0.0 <= metrics["mIoU"] <= 1.0
    onnx = best.export(format="onnx", imgsz=64, output=tmp_path / "best.onnx", verbose=False)
    assert onnx.validation.status == "passed", onnx.validation.text()
    assert LibreYOLO(onnx.path).val(data=str(data), batch=2, workers=0)["pixel_acc"] == pytest.approx(
        metrics["pixel_acc"], abs=1e-3)
