"""LW-DETR line export: rfdetr-n (288 px) and lwdetr-t (192 px), fixture weights, to ONNX and ExecuTorch.

The smallest inputs with at least one memory cell per query: with fewer (rfdetr-n at 128 px: 64
cells for 300 queries) the queries beyond the cells keep their raw learned reference boxes, whose
widths may be negative, and such degenerate boxes cannot be matched by IoU (the validator refused
rfdetr-n at 128 px, 262 of 300 detections matched, and lwdetr-t at 128 px, 97 of 100, with raw
outputs well within their allowance). At 288 px RF-DETR's position table is resized from 24 x 24
to 18 x 18 (antialiased bicubic), which the artifacts must reproduce. Every artifact is
validated against eager by the export driver (raw outputs per query row, decoded detections, the
sample through predict()), must carry portable ops only (deformable sampling as GridSample,
attention as MatMul/Softmax: eager runs SDPA and a spy ``ms_deform_attn`` provider, both declined
while exporting), predicts the eager detections through ``LibreYOLO(artifact)``, and a wrong
artifact (its outputs scaled by 1.001 at run time) is refused by the same validation.
"""
from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from libreyolo import LibreYOLO, kernels  # noqa: E402
from libreyolo.kernels.attention import set_fused_attention  # noqa: E402
from tests.compat_utils import MIN_SET_MATCH, model_from_fixture, set_match  # noqa: E402
from tests.test_export_common import FUSED_OR_CUSTOM  # noqa: E402
from tests.test_export_detr import DeformSpy  # noqa: E402

FIXTURES = ("rfdetr-n", "lwdetr-t")
IMGSZ = {"rfdetr-n": 288, "lwdetr-t": 192}
SPY = "lwdetr-line-export-spy"
_SUFFIX = {"onnx": "onnx", "executorch": "pte"}


@pytest.fixture(scope="module")
def spy():
    s = DeformSpy()
    kernels.register("ms_deform_attn", s, name=SPY, predicate=lambda *a, **k: True)
    yield s
    kernels.unregister("ms_deform_attn", SPY)


_CACHE: dict = {}


def _exported(name, fmt, compat_dir, compat_fill, spy, tmp_path_factory):
    """(model, report), one export per fixture and format for the whole module."""
    if (name, fmt) not in _CACHE:
        d = compat_dir / "fixtures" / name
        if not (d / "schema.json").is_file():
            pytest.skip(f"fixture {name} is not in {compat_dir}")
        model = model_from_fixture(d, compat_fill)
        assert set_fused_attention(model.net, True) > 0  # eager takes SDPA: the export must not
        before = spy.export_calls
        out = tmp_path_factory.mktemp(name) / f"model.{_SUFFIX[fmt]}"
        report = model.export(format=fmt, imgsz=IMGSZ[name], output=str(out), verbose=False)
        assert spy.export_calls == before, "the ms_deform_attn registry was consulted while exporting"
        _CACHE[(name, fmt)] = (model, report)
    return _CACHE[(name, fmt)]


def _assert_validated(model, report, spy) -> None:
    v = report.validation
    assert v.status == "passed", v.text()
    assert {c["probe"] for c in v.checks} >= {"sample", "uniform", "clipped-normal", "ramps"}
    assert all(d["passed"] for d in v.detections)
    assert all(d["eager"] > 0 for d in v.detections if d["probe"].startswith("sample")), v.text()
    assert spy.eager_calls > 0, "the spy provider never ran eagerly: this test could not fail"


@pytest.mark.slow
@pytest.mark.parametrize("name", FIXTURES)
def test_lwdetr_line_onnx_validates_carries_portable_ops_and_predicts_as_eager(name, compat_dir, compat_fill, spy,
                                                                                tmp_path_factory):
    from libreyolo import SAMPLE_IMAGE
    from libreyolo.export.onnx import onnx_ops

    model, report = _exported(name, "onnx", compat_dir, compat_fill, spy, tmp_path_factory)
    _assert_validated(model, report, spy)
    ops = onnx_ops(report.path)
    bad = sorted(op for op in ops if any(word.lower() in op.lower() for word in FUSED_OR_CUSTOM))
    assert not bad, f"fused or custom ops in the exported graph: {bad}"
    assert {"GridSample", "MatMul", "Softmax", "TopK"} <= ops, sorted(ops)
    eager = model(SAMPLE_IMAGE, imgsz=IMGSZ[name], conf=0.05)
    got = LibreYOLO(report.path)(SAMPLE_IMAGE, conf=0.05)
    as_dict = lambda r: {"xyxy": r.boxes.xyxy, "conf": r.boxes.conf, "cls": r.boxes.cls}  # noqa: E731
    assert len(eager) > 0 and min(set_match(as_dict(got), as_dict(eager))) >= MIN_SET_MATCH


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lwdetr-t"])  # rfdetr-n passed it too (161 s here): one family keeps CI short
def test_lwdetr_line_onnx_artifact_with_outputs_off_by_one_permille_is_refused(name, compat_dir, compat_fill, spy,
                                                                               tmp_path_factory):
    from libreyolo.export.compare import compare

    model, report = _exported(name, "onnx", compat_dir, compat_fill, spy, tmp_path_factory)
    runtime = LibreYOLO(report.path)
    real = runtime._forward
    runtime._forward = lambda batch, **kw: {k: v * 1.001 if v.is_floating_point() else v
                                            for k, v in real(batch, **kw).items()}
    wrong = compare(model, runtime)
    assert wrong.status == "failed", wrong.text()


@pytest.mark.slow
@pytest.mark.parametrize("name", [
    # runs and validates (no op is missing): measured 2026-12-07 here at 288 px, passed with raw outputs at
    # 0.12x their allowance and 1500/1500 detections matched, in 88 s of CPU time (85 user + 3 sys; 391 s
    # wall at load ~20), most of it XNNPACK lowering of the 12-block DINOv2, which no input size shrinks
    # (below 288 px the queries outnumber the cells: see the module docstring); this test with the opt-in
    # passed here too (93 s CPU, 440 s wall). Opt-in, over the CI budget.
    pytest.param("rfdetr-n", marks=pytest.mark.skipif(
        not os.environ.get("LIBREYOLO_LONG_EXPORTS"),
        reason="rfdetr-n ExecuTorch takes ~90 s of CPU (XNNPACK lowering of its 12-block ViT); "
               "LIBREYOLO_LONG_EXPORTS=1 runs it")),
    "lwdetr-t"])
def test_lwdetr_line_executorch_validates_and_carries_portable_ops(name, compat_dir, compat_fill, spy,
                                                                   tmp_path_factory):
    pytest.importorskip("executorch")
    from libreyolo.export.executorch import pte_ops

    model, report = _exported(name, "executorch", compat_dir, compat_fill, spy, tmp_path_factory)
    _assert_validated(model, report, spy)
    ops = pte_ops(report.path)
    bad = sorted(op for op in ops if any(word.lower() in op.lower() for word in FUSED_OR_CUSTOM))
    assert not bad, f"fused or custom ops in the exported program: {bad}"
    assert any("grid_sampler" in op for op in ops), sorted(ops)


@pytest.mark.parametrize(("src", "dst"), [(24, 8), (24, 20), (24, 30), (44, 20)])
def test_rfdetr_position_table_resize_is_the_reference_antialiased_bicubic(src, dst):
    """The table is resized by two matrix products (exportable) with the weights of PyTorch's
    antialiased bicubic, which the reference calls: within float32 rounding of it (measured 1.9e-6
    at most on N(0, 1) tables)."""
    import torch.nn.functional as F

    from libreyolo.models.rfdetr.dinov2 import Embeddings

    emb = Embeddings(16, 16, src, 2)
    torch.nn.init.normal_(emb.position_embeddings, generator=torch.Generator().manual_seed(0))
    assert emb.positions(src, src) is emb.position_embeddings  # the native grid is used as stored
    grid = emb.position_embeddings[:, 1:].reshape(1, src, src, -1).permute(0, 3, 1, 2)
    want = F.interpolate(grid, size=(dst, dst), mode="bicubic", align_corners=False, antialias=True)
    got = emb.positions(dst, dst)
    torch.testing.assert_close(got[:, 0], emb.position_embeddings[:, 0], atol=0, rtol=0)
    torch.testing.assert_close(got[:, 1:], want.permute(0, 2, 3, 1).reshape(1, dst * dst, -1), atol=5e-6, rtol=0)
