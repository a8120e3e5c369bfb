"""Artifact runtimes: same predict() as eager, clear errors for bad files and missing packages."""
from __future__ import annotations

import sys

import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import onnx  # noqa: E402

from libreyolo import SAMPLE_IMAGE, LibreYOLO  # noqa: E402
from libreyolo.errors import ArgumentError, CheckpointError, MissingDependencyError  # noqa: E402
from libreyolo.results import Results  # noqa: E402
from libreyolo.runtimes.base import ArtifactPredictor, DecodedFamily  # noqa: E402
from tests.test_export_common import IMGSZ, exported, model  # noqa: E402


@pytest.fixture(scope="module")
def onnx_path(tmp_path_factory):
    return exported(tmp_path_factory, "onnx").path


@pytest.fixture(scope="module")
def runtime(onnx_path):
    return LibreYOLO(onnx_path)


def test_onnx_runtime_is_a_predictor_with_the_models_identity(runtime):
    assert isinstance(runtime, ArtifactPredictor)
    assert (runtime.family.name, runtime.size, runtime.imgsz, runtime.task) == ("yolo9", "t", IMGSZ, "detect")
    assert runtime.names == model().names
    assert runtime.providers[-1] == "CPUExecutionProvider"
    assert runtime.info()["validation"].startswith("passed")


def test_runtime_results_carry_the_eager_conventions(runtime):
    r = runtime(SAMPLE_IMAGE, conf=0.25, max_det=5, classes=[int(c) for c in range(80)])
    assert isinstance(r, Results) and len(r) <= 5
    assert r.boxes.xyxy.shape[1] == 4 and r.boxes.xywh.shape == r.boxes.xyxy.shape
    assert set(r.speed) == {"preprocess", "inference", "postprocess"}
    assert r.plot().size == (640, 480)


def test_a_static_batch_artifact_runs_any_number_of_images(runtime):
    single = runtime.predict(SAMPLE_IMAGE, conf=0.25)
    several = runtime.predict([str(SAMPLE_IMAGE)] * 3, conf=0.25)
    assert len(several) == 3
    for r in several:
        assert torch.equal(r.boxes.conf, single.boxes.conf)


def test_static_artifact_refuses_another_size_half_and_device_and_graphs(runtime):
    with pytest.raises(ArgumentError, match=f"exported for imgsz={IMGSZ}"):
        runtime.predict(SAMPLE_IMAGE, imgsz=IMGSZ + 32)
    with pytest.raises(ArgumentError, match="half=True needs an artifact exported with half=True"):
        runtime.predict(SAMPLE_IMAGE, half=True)
    # without CUDA the shared device check answers first; with it, the runtime says how to move
    with pytest.raises(ArgumentError, match="load it with" if torch.cuda.is_available() else "CUDA is not available"):
        runtime.predict(SAMPLE_IMAGE, device="cuda")
    with pytest.raises(NotImplementedError, match="cuda_graph applies to eager models"):
        runtime.predict(SAMPLE_IMAGE, cuda_graph=True)


def test_onnx_without_our_metadata_names_the_missing_keys(tmp_path, onnx_path):
    m = onnx.load(str(onnx_path))
    kept = [p for p in m.metadata_props if p.key not in ("family", "letterbox")]
    del m.metadata_props[:]
    m.metadata_props.extend(kept)
    bare = tmp_path / "bare.onnx"
    onnx.save(m, str(bare))
    with pytest.raises(CheckpointError, match="missing keys: family, letterbox"):
        LibreYOLO(bare)


def test_corrupt_and_missing_artifacts_are_clear_errors(tmp_path):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"\x00not an onnx file at all")
    with pytest.raises(CheckpointError, match="broken.onnx"):
        LibreYOLO(bad)
    with pytest.raises(CheckpointError, match="not found"):
        LibreYOLO(tmp_path / "absent.onnx")


def test_missing_onnxruntime_names_the_extra(onnx_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'libreyolo\[onnx\]'"):
        LibreYOLO(onnx_path)


def test_missing_executorch_names_the_extra(tmp_path, monkeypatch, onnx_path):
    from libreyolo.export.metadata import write_sidecar

    pte = tmp_path / "m.pte"
    pte.write_bytes(b"program")
    write_sidecar(pte, LibreYOLO(onnx_path).metadata | {"format": "executorch"})
    monkeypatch.setitem(sys.modules, "executorch.runtime", None)
    with pytest.raises(MissingDependencyError, match=r"libreyolo\[executorch\]"):
        LibreYOLO(pte)


def test_onnx_providers_prefer_gpu_when_present_and_honour_cpu():
    from libreyolo.runtimes.onnx import _providers

    class FakeOrt:
        @staticmethod
        def get_available_providers():
            return ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]

    assert _providers(FakeOrt, None, None) == ["TensorrtExecutionProvider", "CUDAExecutionProvider",
                                               "CPUExecutionProvider"]
    assert _providers(FakeOrt, torch.device("cpu"), None) == ["CPUExecutionProvider"]
    assert _providers(FakeOrt, torch.device("cuda", 1), None)[1] == ("CUDAExecutionProvider", {"device_id": 1})

    class CpuOrt:
        @staticmethod
        def get_available_providers():
            return ["CPUExecutionProvider"]

    assert _providers(CpuOrt, None, None) == ["CPUExecutionProvider"]
    with pytest.raises(ArgumentError, match="onnxruntime-gpu"):
        _providers(CpuOrt, torch.device("cuda"), None)


def test_embedded_nms_decoding_is_declared_by_the_contract_not_the_runtime(tmp_path_factory):
    art = LibreYOLO(exported(tmp_path_factory, "onnx", nms=True, dynamic=True, batch=2).path)
    assert isinstance(art.family, DecodedFamily)
    assert model().family.export.nms_decoder == "libreyolo.export.nms:EmbeddedNmsDecoder"
    with pytest.raises(ArgumentError, match="conf >= 0.001"):
        art.predict(SAMPLE_IMAGE, conf=0.0)


def test_embedded_nms_equals_greedy_nms_over_the_topk_candidates():
    from libreyolo.export.nms import EmbeddedNMS
    from libreyolo.ops.nms import nms

    g = torch.Generator().manual_seed(3)
    nc, n, k = 3, 400, 256
    centers = torch.rand(n, 2, generator=g) * 200 + 20
    size = torch.rand(n, 2, generator=g) * 40 + 10
    boxes = torch.cat((centers - size / 2, centers + size / 2), 1)
    scores = torch.rand(n, nc, generator=g) ** 3
    pred = torch.cat((boxes.T, scores.T)).unsqueeze(0)
    images = torch.zeros(1, 3, 256, 256)
    module = EmbeddedNMS(nc, topk=k, iterations=64, iou=0.45, conf=0.05, max_det=300)
    dets, num = module(pred, images)
    # the reference: library greedy NMS over the same top-k (box, class) pairs above conf
    clipped = boxes.clamp(0, 256)
    top = scores.flatten().topk(k)
    alive = top.values > 0.05
    bi, ci = top.indices[alive] // nc, top.indices[alive] % nc
    keep = nms(clipped[bi], top.values[alive], 0.45, classes=ci, max_det=300)
    assert int(num) == len(keep)
    assert torch.equal(dets[0, :len(keep), 4], top.values[alive][keep])
    assert torch.equal(dets[0, :len(keep), 5], ci[keep].float())
    assert torch.equal(dets[0, :len(keep), :4], clipped[bi][keep])  # selected, not recomputed
