"""DETR export: rtdetr-r18 and dfine-n at their native size (640) to ONNX and ExecuTorch.

Every artifact is validated against eager by the export driver (raw outputs per query row,
decoded detections, the sample through predict()). The exported graphs must carry portable
ops only: deformable sampling as GridSample/gather, attention as MatMul/Softmax. A spy
provider registered on the ``ms_deform_attn`` slot and SDPA switched on in the eager model
prove that the registry and the fused kernel are used eagerly and declined while exporting.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from libreyolo import kernels  # noqa: E402
from libreyolo.export.selection import align_row_sets  # noqa: E402
from libreyolo.kernels.attention import ms_deform_attn_portable, set_fused_attention  # noqa: E402
from libreyolo.kernels.context import capturing_for_export, compiling  # noqa: E402
from tests.compat_utils import model_from_fixture  # noqa: E402
from tests.test_export_common import FUSED_OR_CUSTOM  # noqa: E402

FIXTURES = ("rtdetr-r18", "dfine-n")
SPY = "detr-export-spy"


class DeformSpy:
    """A provider that accepts every call, runs the portable path and records the context."""

    def __init__(self) -> None:
        self.eager_calls = 0
        self.export_calls = 0

    def __call__(self, *args, **kwargs):
        if capturing_for_export() or compiling():
            self.export_calls += 1
        else:
            self.eager_calls += 1
        return ms_deform_attn_portable(*args, **kwargs)


def _model(name, compat_dir, compat_fill):
    d = compat_dir / "fixtures" / name
    if not (d / "schema.json").is_file():
        pytest.skip(f"fixture {name} is not in {compat_dir}")
    model = model_from_fixture(d, compat_fill)
    assert set_fused_attention(model.net, True) > 0  # eager takes SDPA: the export must not
    return model


@pytest.fixture(scope="module")
def spy():
    s = DeformSpy()
    kernels.register("ms_deform_attn", s, name=SPY, predicate=lambda *a, **k: True)
    yield s
    kernels.unregister("ms_deform_attn", SPY)


_SUFFIX = {"onnx": "onnx", "executorch": "pte"}


def _export(model, fmt, tmp_path, spy):
    before = spy.export_calls
    report = model.export(format=fmt, imgsz=640, output=str(tmp_path / f"model.{_SUFFIX[fmt]}"), verbose=False)
    assert spy.export_calls == before, "the ms_deform_attn registry was consulted while exporting"
    return report


@pytest.mark.slow
@pytest.mark.parametrize("name", FIXTURES)
def test_detr_onnx_validates_against_eager_and_carries_portable_ops_only(name, compat_dir, compat_fill, spy,
                                                                         tmp_path):
    from libreyolo.export.onnx import onnx_ops

    model = _model(name, compat_dir, compat_fill)
    report = _export(model, "onnx", tmp_path, spy)
    v = report.validation
    assert v.status == "passed", v.text()
    assert {c["probe"] for c in v.checks} >= {"sample", "uniform", "clipped-normal", "ramps"}
    assert all(d["passed"] for d in v.detections)
    # never vacuous: the validator lowers conf until the sample keeps detections to compare
    assert all(d["eager"] > 0 for d in v.detections if d["probe"].startswith("sample")), v.text()
    assert spy.eager_calls > 0, "the spy provider never ran eagerly: this test could not fail"
    ops = onnx_ops(report.path)
    bad = sorted(op for op in ops if any(word.lower() in op.lower() for word in FUSED_OR_CUSTOM))
    assert not bad, f"fused or custom ops in the exported graph: {bad}"
    assert {"GridSample", "MatMul", "Softmax", "TopK"} <= ops, sorted(ops)


@pytest.mark.slow
@pytest.mark.parametrize("name", FIXTURES)
def test_detr_executorch_validates_against_eager_and_carries_portable_ops_only(name, compat_dir, compat_fill, spy,
                                                                               tmp_path):
    pytest.importorskip("executorch")
    from libreyolo.export.executorch import pte_ops

    model = _model(name, compat_dir, compat_fill)
    report = _export(model, "executorch", tmp_path, spy)
    v = report.validation
    assert v.status == "passed", v.text()
    assert all(d["passed"] for d in v.detections)
    assert all(d["eager"] > 0 for d in v.detections if d["probe"].startswith("sample")), v.text()
    ops = pte_ops(report.path)
    bad = sorted(op for op in ops if any(word.lower() in op.lower() for word in FUSED_OR_CUSTOM))
    assert not bad, f"fused or custom ops in the exported program: {bad}"
    assert any("grid_sampler" in op for op in ops), sorted(ops)


def test_row_sets_are_aligned_only_where_rows_traded_places():
    g = torch.Generator().manual_seed(0)
    ref = {"pred_logits": torch.randn(2, 6, 3, generator=g), "pred_boxes": torch.rand(2, 6, 4, generator=g)}
    swapped = {k: v.clone() for k, v in ref.items()}
    for v in swapped.values():
        v[1, [2, 4]] = v[1, [4, 2]]
    aligned, moved = align_row_sets(ref, swapped, ("pred_logits", "pred_boxes"), 1e-4, 0.0)
    assert moved == 2
    assert all(torch.equal(aligned[k], ref[k]) for k in ref)
    wrong = {k: v.clone() for k, v in swapped.items()}
    wrong["pred_boxes"][1, 2, 0] += 0.01  # a moved row that no longer matches anything stays put
    aligned, moved = align_row_sets(ref, wrong, ("pred_logits", "pred_boxes"), 1e-4, 0.0)
    assert moved == 1 and not torch.equal(aligned["pred_boxes"], ref["pred_boxes"])
    assert align_row_sets(ref, ref, ("pred_logits", "pred_boxes"), 1e-4, 0.0)[1] == 0
