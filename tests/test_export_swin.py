"""Swin artifacts: validated against eager with fused attention on, portable attention only.

Swin keeps the manual path by default; these tests switch fused SDPA on (``set_fused_attention``)
so that eager runs SDPA with the position bias and shift mask as an additive mask, and check that
every export capture declines it (recording which predicate did) and emits matmul-softmax-matmul.
The TorchScript ONNX case exports the whole swin-t; the dynamo ONNX, ExecuTorch and CoreML cases keep
the first 2 blocks of each stage (8 of 12: every stage, shifted and masked blocks included) so CI stays
fast. The whole swin-t ExecuTorch program validates too (max abs error 2.2e-6 on logits, ~2 min of
CPU on the 2-core machine).
"""
from __future__ import annotations

import pytest
import torch

from libreyolo import LibreYOLO, set_fused_attention
from libreyolo.kernels.attention import record_attention

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

FUSED_ONNX_OPS = {"Attention", "MultiHeadAttention", "com.microsoft::Attention",
                  "com.microsoft::MultiHeadAttention"}
FUSED_NAMES = ("scaled_dot_product", "flash_attention", "efficient_attention", "_sdpa")


def swin_t(blocks_per_stage: int | None = None):
    """swin-t with spread, seeded weights (non-zero position bias) and fused attention on."""
    model = LibreYOLO("LibreSwint-cls.yaml", nc=1000)
    if blocks_per_stage is not None:
        for stage in model.net.layers:
            stage.blocks = stage.blocks[:blocks_per_stage]
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, t in model.net.state_dict().items():
            if t.is_floating_point():
                if t.ndim >= 2:
                    t.copy_(torch.randn(t.shape, generator=g) / t[0].numel() ** 0.5)
                else:
                    t.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn(t.shape, generator=g))
    slots = set_fused_attention(model.net)
    assert slots == sum(len(s.blocks) for s in model.net.layers)
    return model, slots


def assert_eager_is_fused(model, slots: int) -> None:
    with record_attention() as calls, torch.no_grad():
        model.net(torch.zeros(1, 3, 224, 224))
    assert len(calls) == slots and all(c.path == "sdpa" for c in calls), calls


def assert_every_slot_declined(calls, slots: int, predicate: str) -> list[tuple[str, ...]]:
    """Every primitive call was a fused request that ``predicate`` declined, at least one per slot.

    (SDPA calls recorded alongside are the eager model's, run by the validation.)"""
    primitive = [c for c in calls if c.path != "sdpa"]
    assert len(primitive) >= slots, f"{len(primitive)} primitive attention calls recorded, expected >= {slots}"
    assert all(c.fused_requested and c.path == "primitive" for c in primitive), primitive
    assert all(predicate in c.declined_by for c in primitive), {c.declined_by for c in primitive}
    return sorted({c.declined_by for c in primitive})


def assert_validated(report) -> None:
    assert report.status == "passed", report.text()
    assert report.checks and report.worst()["worst_ratio"] <= 1.0, report.text()
    assert all(d["kind"] == "classes" for d in report.detections), report.text()


@pytest.fixture(scope="module")
def swin_onnx(tmp_path_factory):
    model, slots = swin_t()
    assert_eager_is_fused(model, slots)
    with record_attention() as calls:
        report = model.export(format="onnx", output=tmp_path_factory.mktemp("swin") / "swin.onnx", verbose=False)
    return model, slots, report, calls


def test_swin_onnx_torchscript_export_validates_against_fused_eager(swin_onnx):
    model, slots, report, calls = swin_onnx
    assert_validated(report.validation)
    reasons = assert_every_slot_declined(calls, slots, "torch.onnx.is_in_onnx_export()")
    assert ("torch.jit.is_tracing()", "torch.onnx.is_in_onnx_export()") in reasons  # the TorchScript exporter


def test_swin_onnx_graph_has_no_fused_attention_only_primitive_ops(swin_onnx):
    from libreyolo.export.onnx import onnx_ops

    ops = onnx_ops(swin_onnx[2].path)
    assert not ops & FUSED_ONNX_OPS and {"MatMul", "Softmax"} <= ops, sorted(ops)
    assert all("::" not in op for op in ops), sorted(ops)


def test_swin_onnx_runtime_gives_the_eager_top5(swin_onnx):
    from libreyolo import SAMPLE_IMAGE

    model, _, report, _ = swin_onnx
    eager, got = model(SAMPLE_IMAGE), LibreYOLO(report.path)(SAMPLE_IMAGE)
    assert got.probs is not None and got.probs.top5 == eager.probs.top5
    torch.testing.assert_close(got.probs.data, eager.probs.data, atol=1e-6, rtol=0)


def test_swin_onnx_dynamo_export_validates_and_has_no_fused_attention(tmp_path):
    pytest.importorskip("onnxscript", reason="the dynamo ONNX exporter needs onnxscript")
    from libreyolo.export.base import ExportOptions
    from libreyolo.export.driver import _metadata
    from libreyolo.export.metadata import stamp
    from libreyolo.export.module import ExportModule
    from libreyolo.export.onnx import EXPORTER, onnx_ops
    from libreyolo.export.validate import validate_artifact

    model, slots = swin_t(blocks_per_stage=2)
    assert_eager_is_fused(model, slots)
    module = ExportModule(model.net, model.family, None, nc=model.nc).eval()
    path = tmp_path / "swin.onnx"
    with record_attention() as calls, torch.no_grad():
        program = torch.onnx.export(module, (torch.zeros(1, 3, 224, 224),), dynamo=True, opset_version=23,
                                    input_names=["images"], output_names=["logits"], verbose=False)
    program.save(str(path))
    assert not any(any(n in str(node.target) for n in FUSED_NAMES) for node in program.exported_program.graph.nodes)
    reasons = assert_every_slot_declined(calls, slots, "torch.compiler.is_exporting()")
    assert all("torch.jit.is_tracing()" not in r for r in reasons)  # dynamo does not trace with the JIT
    ops = onnx_ops(path)
    assert not ops & FUSED_ONNX_OPS and {"MatMul", "Softmax"} <= ops, sorted(ops)  # opset 23 has Attention
    opts = ExportOptions("onnx", 224)
    meta = _metadata(model, EXPORTER, opts, module)
    EXPORTER.write_metadata(path, stamp(meta, EXPORTER.content_sha256(path)), meta)  # as the export driver does
    assert_validated(validate_artifact(model, EXPORTER, path, opts))


def test_swin_executorch_program_validates_and_has_no_fused_attention(tmp_path):
    pytest.importorskip("executorch.exir")
    from libreyolo.export.executorch import pte_ops

    model, slots = swin_t(blocks_per_stage=2)
    assert_eager_is_fused(model, slots)
    with record_attention() as calls:
        report = model.export(format="executorch", output=tmp_path / "swin.pte", verbose=False)
    assert_validated(report.validation)
    assert_every_slot_declined(calls, slots, "torch.compiler.is_exporting()")
    ops = pte_ops(report.path)
    assert not any(any(n in op for n in FUSED_NAMES) for op in ops), sorted(ops)


def test_swin_coreml_program_has_no_fused_attention(tmp_path):
    pytest.importorskip("coremltools")
    from libreyolo.export.coreml import mlpackage_ops

    model, slots = swin_t(blocks_per_stage=2)
    with record_attention() as calls:
        report = model.export(format="coreml", output=tmp_path / "swin.mlpackage", verbose=False)
    assert_every_slot_declined(calls, slots, "torch.compiler.is_exporting()")
    ops = mlpackage_ops(report.path)
    assert {"matmul", "softmax"} <= ops and not any("attention" in op for op in ops), sorted(ops)
    if report.validation.status != "passed":  # CoreML predicts on macOS only
        assert report.validation.status == "not validated" and "macOS" in report.validation.reason
