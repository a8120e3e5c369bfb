"""SwinIR-s exported to ONNX (dynamic height/width), ExecuTorch and CoreML, validated on the image output.

An untrained SwinIR-s with seeded weights: the network's own residual structure keeps its 4x
output a smooth image, enough to compare pixels. Inputs stay tiny (SwinIR is heavy on a CPU):
ONNX at 32 px with the validator's dynamic 16 x 32 probe, ExecuTorch at 16 px (2 x 2 windows,
still shifted and masked) on the network cut to 2 groups of 2 layers (``shallow_seeded_swinir``:
the same ops; lowering all 24 layers takes over 2 minutes on 2 cores). CoreML converts at 16 px
too (about 20 s); it predicts, and so validates, on macOS only: elsewhere the report says "not
validated" and why.
"""
from __future__ import annotations

import sys
from functools import lru_cache
from typing import Any

import numpy as np
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.errors import ArgumentError
from tests.test_export_common import FUSED_OR_CUSTOM

ONNX_IMGSZ, PTE_IMGSZ, COREML_IMGSZ = 32, 16, 16


@lru_cache(maxsize=1)
def seeded_swinir() -> Any:
    return _seeded(LibreYOLO("LibreSwinIRs.yaml"))


@lru_cache(maxsize=1)
def shallow_seeded_swinir() -> Any:
    """SwinIR-s cut to 2 residual groups of 2 Swin layers (an unshifted and a shifted-window layer
    each), seeded the same way: every op of the 24-layer network (window partition and shift, the
    shift mask, windowed attention, residual groups, the upsampler), at a sixth of the graph. For
    ExecuTorch, whose lowering of the full network takes over 2 minutes on 2 CPU cores."""
    from unittest import mock

    from libreyolo.models.swinir import network

    full = network.SIZES["s"]
    shallow = network.SwinIRConfig(full.embed_dim, (2, 2), full.num_heads[:2], full.upsampler, full.resi_connection)
    with mock.patch.dict(network.SIZES, {"s": shallow}):
        model = LibreYOLO("LibreSwinIRs.yaml")
    assert len(model.net.layers) == 2 and all(len(g.residual_group.blocks) == 2 for g in model.net.layers)
    return _seeded(model)


def _seeded(model: Any) -> Any:
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for _key, t in sorted(model.net.named_parameters()):
            if t.ndim >= 2:
                t.copy_(torch.randn(t.shape, generator=g) * 0.5 / t[0].numel() ** 0.5)
    return model


def _image(h: int, w: int, seed: int = 0) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    rng = np.random.default_rng(seed)
    base = np.stack([np.sin(x / 5.0 + c) * np.cos(y / 7.0 - c) for c in range(3)], -1)
    return np.clip(127 + 90 * base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)


_ARTIFACTS: dict[str, Any] = {}


def _exported(tmp_path_factory, fmt: str, suffix: str, imgsz: int, model: Any = None, **opts: Any) -> Any:
    if fmt not in _ARTIFACTS:
        folder = tmp_path_factory.mktemp(f"swinir-{fmt}")
        _ARTIFACTS[fmt] = (model or seeded_swinir()).export(format=fmt, imgsz=imgsz, output=folder / f"s{suffix}",
                                                            verbose=False, **opts)
    return _ARTIFACTS[fmt]


@pytest.fixture(scope="module")
def onnx_dynamic(tmp_path_factory):
    pytest.importorskip("onnxruntime")
    return _exported(tmp_path_factory, "onnx", ".onnx", ONNX_IMGSZ, dynamic=True)


@pytest.fixture(scope="module")
def pte(tmp_path_factory):
    pytest.importorskip("executorch.exir", reason="executorch is not installed (pip install 'libreyolo[executorch]')")
    return _exported(tmp_path_factory, "executorch", ".pte", PTE_IMGSZ, shallow_seeded_swinir())


@pytest.fixture(scope="module")
def coreml_fused_requested(tmp_path_factory):
    """SwinIR-s with the seeded weights and fused attention switched on, converted to CoreML
    while every attention call is recorded: the export capture must decline SDPA in every slot."""
    pytest.importorskip("coremltools", reason="coremltools is not installed (pip install 'libreyolo[coreml]')")
    from libreyolo.kernels.attention import record_attention

    model = LibreYOLO("LibreSwinIRs.yaml")
    model.net.load_state_dict(seeded_swinir().net.state_dict())
    slots = model.set_fused_attention(True)
    with record_attention() as calls:
        report = model.export(format="coreml", imgsz=COREML_IMGSZ,
                              output=tmp_path_factory.mktemp("swinir-coreml") / "s.mlpackage", verbose=False)
    return report, slots, calls


def _same_image(eager: Any, art: Any) -> None:
    a, b = eager.restored.data, art.restored.data
    assert a.shape == b.shape
    assert int((a.int() - b.int()).abs().max()) <= 1  # one grey level: the validator's decoded bar


def test_onnx_validates_on_pixels_and_any_size_predicts_the_same_image(onnx_dynamic):
    v = onnx_dynamic.validation
    assert v.status == "passed", v.text()
    assert {c["group"] for c in v.checks if c["output"] == "image"} == {"image/image"}
    assert any(c["probe"] == f"{ONNX_IMGSZ // 2}x{ONNX_IMGSZ}" for c in v.checks), "no dynamic H/W probe"
    assert all(d["passed"] and "psnr" in d for d in v.decoded)
    art = LibreYOLO(onnx_dynamic.path)
    assert art.metadata["dynamic_axes"]["images"] == {"0": "batch", "2": "height", "3": "width"}
    img = _image(27, 45)
    eager, got = seeded_swinir().predict(img), art.predict(img)
    assert got.restored.shape == (108, 180, 3)
    _same_image(eager, got)


def test_onnx_attention_is_portable_ops(onnx_dynamic):
    from libreyolo.export.onnx import onnx_ops

    ops = onnx_ops(onnx_dynamic.path)
    assert {"MatMul", "Softmax"} <= ops
    assert not [op for op in ops if any(bad.lower() in op.lower() for bad in FUSED_OR_CUSTOM)], sorted(ops)


def test_executorch_validates_and_predicts_the_same_image(pte):
    v = pte.validation
    assert v.status == "passed", v.text()
    assert v.runtime.startswith("executorch")
    img = _image(13, 15, seed=1)  # pads to the artifact's 16 x 16, as eager pads it
    _same_image(shallow_seeded_swinir().predict(img), LibreYOLO(pte.path).predict(img))


def test_a_static_artifact_refuses_a_larger_image_naming_the_fix(pte):
    with pytest.raises(ArgumentError, match=r"takes 16x16 inputs .*got a 20x17 image.*dynamic=True"):
        LibreYOLO(pte.path).predict(_image(20, 17))


def test_a_wrong_model_is_refused(onnx_dynamic):
    from libreyolo.export.base import ExportOptions, get_exporter
    from libreyolo.export.validate import validate_artifact

    wrong = LibreYOLO("LibreSwinIRs.yaml")
    wrong.net.load_state_dict(seeded_swinir().net.state_dict())
    with torch.no_grad():
        wrong.net.layers[1].residual_group.blocks[1].attn.proj.weight.mul_(1.001)
    opts = ExportOptions("onnx", ONNX_IMGSZ, dynamic=True, dynamic_spatial=True)
    report = validate_artifact(wrong, get_exporter("onnx"), onnx_dynamic.path, opts)
    assert report.status == "failed", report.text()


# the ML Program ops of a window transformer with a pixel-shuffle upsampler: no fused attention op
SWINIR_MIL_OPS = {"add", "const", "conv", "gather", "gelu", "layer_norm", "linear", "matmul", "mul",
                  "pixel_shuffle", "reshape", "softmax", "split", "squeeze", "sub", "transpose", "concat",
                  "slice_by_index", "expand_dims", "real_div", "cast"}


def test_coreml_attention_is_matmul_softmax_even_when_fused_is_requested(coreml_fused_requested):
    from libreyolo.export.coreml import mlpackage_ops

    report, slots, calls = coreml_fused_requested
    assert slots > 0
    declined = [c for c in calls if c.path == "primitive"]
    assert len(declined) >= slots and all(c.fused_requested for c in declined), declined
    assert all("torch.compiler.is_exporting()" in c.declined_by for c in declined)
    assert report.path.is_dir() and (report.path / "Manifest.json").is_file()
    ops = mlpackage_ops(report.path)
    assert {"matmul", "softmax", "pixel_shuffle"} <= ops and ops <= SWINIR_MIL_OPS, sorted(ops - SWINIR_MIL_OPS)
    assert not [op for op in ops if "attention" in op], sorted(ops)


def test_coreml_package_is_image_in_image_out_and_honest_about_validation(coreml_fused_requested):
    import coremltools as ct

    from libreyolo.runtimes.coreml import read_metadata

    report = coreml_fused_requested[0]
    spec = ct.models.MLModel(str(report.path), skip_model_load=True).get_spec()
    (inp,), (out,) = spec.description.input, spec.description.output
    assert inp.type.WhichOneof("Type") == "imageType"
    assert (inp.type.imageType.height, inp.type.imageType.width) == (COREML_IMGSZ, COREML_IMGSZ)
    assert out.name == "image" and list(out.type.multiArrayType.shape) == [1, 3, 4 * COREML_IMGSZ, 4 * COREML_IMGSZ]
    meta = read_metadata(report.path)
    assert meta["family"] == "swinir" and meta["task"] == "restore"
    if sys.platform == "darwin":
        assert report.validation.status == "passed", report.validation.text()
    else:
        assert report.validation.status == "not validated"
        assert report.validation.headline() == "not validated: CoreML runs only on macOS"
        assert meta["validation"]["status"] == "not validated"
