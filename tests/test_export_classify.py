"""ViT/DeiT artifacts: validated against eager (fused attention on), portable attention only.

Eager runs SDPA (``fused_attn`` defaults on); every export capture must decline it and emit
matmul-softmax-matmul. Each test records which predicate made each attention slot decline.
Models are untrained (seeded); the ExecuTorch and CoreML cases keep 2 of the 12 identical
blocks of vit-ti/deit-t so CI stays fast (the full 12-block ExecuTorch export validates too,
in ~5 min on 2 shared cores: see docs/deploy.md).
"""
from __future__ import annotations

import json

import pytest
import torch

from libreyolo import LibreYOLO, set_fused_attention
from libreyolo.kernels.attention import record_attention

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

FUSED_ONNX_OPS = {"Attention", "MultiHeadAttention", "com.microsoft::Attention",
                  "com.microsoft::MultiHeadAttention"}
FUSED_NAMES = ("scaled_dot_product", "flash_attention", "efficient_attention", "_sdpa")
BLOCKS = {"vit": 12, "deit": 12}
# measured on CPU (torch 2.13): SDPA's CPU kernel and matmul-softmax-matmul round differently
FUSED_BYTE_EXACT_ON_CPU = {"vit": False, "deit": False}


def classifier(family: str, size: str, blocks: int | None = None):
    torch.manual_seed(0)
    stem = {"vit": "LibreViT", "deit": "LibreDeiT"}[family]
    model = LibreYOLO(f"{stem}{size}-cls.yaml", nc=1000)
    if blocks is not None:
        model.net.blocks = model.net.blocks[:blocks]
    return model


def attention_modules(model) -> int:
    return sum(isinstance(getattr(m, "fused_attn", None), bool) for m in model.net.modules())


def assert_eager_is_fused(model) -> None:
    with record_attention() as calls, torch.no_grad():
        model.net(torch.zeros(1, 3, 224, 224))
    assert len(calls) == attention_modules(model) and all(c.path == "sdpa" for c in calls), calls


def assert_every_slot_declined(calls, slots: int, predicate: str) -> list[tuple[str, ...]]:
    """Every slot reached under the export capture asked for fused attention and declined it,
    naming ``predicate``; the other recorded calls are the eager side of the validation."""
    declined = [c for c in calls if c.declined_by]
    assert len(declined) >= slots, f"{len(declined)} declining attention calls recorded, expected at least {slots}"
    assert all(c.fused_requested and c.path == "primitive" for c in declined), declined
    assert all(predicate in c.declined_by for c in declined), {c.declined_by for c in declined}
    eager = [c for c in calls if not c.declined_by]
    assert all(c.path == "sdpa" for c in eager), eager  # eager (validation) ran fused, never primitive
    return sorted({c.declined_by for c in declined})


@pytest.fixture(scope="module")
def vit_onnx(tmp_path_factory):
    model = classifier("vit", "ti")
    assert_eager_is_fused(model)
    with record_attention() as calls:
        report = model.export(format="onnx", output=tmp_path_factory.mktemp("vit") / "vit.onnx", verbose=False)
    return model, report, calls


def test_vit_onnx_torchscript_export_validates_against_fused_eager(vit_onnx):
    model, report, calls = vit_onnx
    v = report.validation
    assert v.status == "passed", v.text()
    raw = [c for c in v.checks if c["output"] == "logits"]
    assert all(c["ratio"] <= 1.0 for c in raw) and len(raw) == 5  # four probes and their error distribution
    assert all(d["kind"] == "classes" and d["identical"] for d in v.detections), v.text()
    reasons = assert_every_slot_declined(calls, attention_modules(model), "torch.onnx.is_in_onnx_export()")
    assert ("torch.jit.is_tracing()", "torch.onnx.is_in_onnx_export()") in reasons  # the TorchScript exporter


def test_vit_onnx_graph_has_no_fused_attention_only_primitive_ops(vit_onnx):
    from libreyolo.export.onnx import onnx_ops

    ops = onnx_ops(vit_onnx[1].path)
    assert not ops & FUSED_ONNX_OPS and {"MatMul", "Softmax"} <= ops, sorted(ops)
    assert all("::" not in op for op in ops), sorted(ops)


def test_classify_artifact_metadata_carries_normalisation_and_preprocessing(vit_onnx):
    meta = {p.key: p.value for p in onnx.load(str(vit_onnx[1].path)).metadata_props}
    norm, pre = json.loads(meta["normalization"]), json.loads(meta["letterbox"])
    assert (norm["mean"], norm["std"], norm["scale"]) == ([0.5] * 3, [0.5] * 3, 1 / 255)
    assert (pre["kind"], pre["crop_pct"], pre["resize_shorter_side"]) == ("resize-crop", 0.9, 248)
    assert meta["task"] == "classify" and json.loads(meta["output_names"]) == ["logits"]


def test_onnx_runtime_gives_classify_results_through_the_shared_predictor(vit_onnx):
    from libreyolo import SAMPLE_IMAGE

    model, report, _ = vit_onnx
    art = LibreYOLO(report.path)
    eager, got = model(SAMPLE_IMAGE), art(SAMPLE_IMAGE)
    assert got.probs is not None and got.boxes is None
    assert got.probs.top5 == eager.probs.top5
    torch.testing.assert_close(got.probs.data, eager.probs.data, atol=1e-6, rtol=0)


def test_deit_onnx_dynamo_export_validates_and_has_no_fused_attention(tmp_path):
    pytest.importorskip("onnxscript", reason="the dynamo ONNX exporter needs onnxscript")
    from libreyolo.export.base import ExportOptions
    from libreyolo.export.driver import _metadata
    from libreyolo.export.metadata import stamp
    from libreyolo.export.module import ExportModule
    from libreyolo.export.onnx import EXPORTER, onnx_ops
    from libreyolo.export.validate import validate_artifact

    model = classifier("deit", "t")
    assert_eager_is_fused(model)
    module = ExportModule(model.net, model.family, None, nc=model.nc).eval()
    path = tmp_path / "deit.onnx"
    with record_attention() as calls, torch.no_grad():
        program = torch.onnx.export(module, (torch.zeros(1, 3, 224, 224),), dynamo=True, opset_version=23,
                                    input_names=["images"], output_names=["logits"], verbose=False)
    program.save(str(path))
    assert not any(any(n in str(node.target) for n in FUSED_NAMES) for node in program.exported_program.graph.nodes)
    reasons = assert_every_slot_declined(calls, attention_modules(model), "torch.compiler.is_exporting()")
    assert all("torch.jit.is_tracing()" not in r for r in reasons)  # dynamo does not trace with the JIT
    ops = onnx_ops(path)
    assert not ops & FUSED_ONNX_OPS and {"MatMul", "Softmax"} <= ops, sorted(ops)  # opset 23 has Attention
    opts = ExportOptions("onnx", 224)
    meta = _metadata(model, EXPORTER, opts, module)
    EXPORTER.write_metadata(path, stamp(meta, EXPORTER.content_sha256(path)), meta)  # as the driver does
    report = validate_artifact(model, EXPORTER, path, opts)
    assert report.status == "passed", report.text()
    assert report.worst()["worst_ratio"] <= 1.0  # every logit within its float64-derived allowance


def test_executorch_program_validates_and_has_no_fused_attention(tmp_path):
    pytest.importorskip("executorch.exir")
    from libreyolo.export.executorch import pte_ops

    model = classifier("vit", "ti", blocks=2)
    assert_eager_is_fused(model)
    with record_attention() as calls:
        report = model.export(format="executorch", output=tmp_path / "vit.pte", verbose=False)
    assert report.validation.status == "passed", report.validation.text()
    assert report.validation.worst()["worst_ratio"] <= 1.0
    assert_every_slot_declined(calls, 2, "torch.compiler.is_exporting()")
    ops = pte_ops(report.path)
    assert not any(any(n in op for n in FUSED_NAMES) for op in ops), sorted(ops)
    assert LibreYOLO(report.path)(torch.rand(3, 200, 300)).probs is not None


def test_coreml_program_converts_with_a_tensor_input_and_no_fused_attention(tmp_path):
    pytest.importorskip("coremltools")
    from libreyolo.export.coreml import mlpackage_ops

    model = classifier("deit", "t", blocks=2)
    with record_attention() as calls:
        report = model.export(format="coreml", output=tmp_path / "deit.mlpackage", verbose=False)
    assert_every_slot_declined(calls, 2, "torch.compiler.is_exporting()")
    ops = mlpackage_ops(report.path)
    assert {"matmul", "softmax"} <= ops and not any("attention" in op for op in ops), sorted(ops)
    if report.validation.status != "passed":  # CoreML predicts on macOS only
        assert report.validation.status == "not validated" and "macOS" in report.validation.reason


def test_cli_exports_a_deit_checkpoint_to_onnx(tmp_path, capsys):
    from libreyolo.cli import main

    ckpt = classifier("deit", "t").save(tmp_path / "LibreDeiTt-cls.pt")
    assert main(["export", f"model={ckpt}", "format=onnx"]) == 0
    out = capsys.readouterr().out
    assert "validation: passed" in out and "top-k classes matched" in out, out
    art = tmp_path / "LibreDeiTt-cls.onnx"
    assert art.is_file()
    assert main(["predict", f"model={art}", f"save_dir={tmp_path / 'runs'}", "json=true"]) == 0
    line = capsys.readouterr().out
    assert "class" in line and "detections" not in line, line
    saved = json.loads(next((tmp_path / "runs").glob("*.json")).read_text())
    assert len(saved) == 5 and {"name", "class", "confidence"} <= set(saved[0])


# --- fused against manual attention on CPU ---------------------------------------------------------
@pytest.mark.parametrize("family,size", [("vit", "ti"), ("deit", "t")])
def test_fused_attention_is_not_byte_exact_against_manual_on_cpu(family, size):
    """Statement for vit/deit on CPU: SDPA and the primitive path differ in the last bits
    (max ~2e-6 on logits), so fused stays a speed choice within float tolerance, on by default."""
    model = classifier(family, size)
    x = torch.rand(2, 3, 224, 224, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with torch.no_grad():
        assert set_fused_attention(model.net, enabled=True) == BLOCKS[family]
        fused = model.net(x)
        assert set_fused_attention(model.net, enabled=False) == BLOCKS[family]
        manual = model.net(x)
    assert torch.equal(fused, manual) is FUSED_BYTE_EXACT_ON_CPU[family]
    torch.testing.assert_close(fused, manual, atol=1e-4, rtol=0)


def test_fused_attention_defaults_on_for_vit_and_deit():
    for family, size in (("vit", "ti"), ("deit", "t")):
        model = classifier(family, size)
        flags = [m.fused_attn for m in model.net.modules() if isinstance(getattr(m, "fused_attn", None), bool)]
        assert flags == [True] * 12


def test_attention_record_is_empty_outside_the_block():
    model = classifier("vit", "ti", blocks=1)
    with record_attention() as calls:
        pass
    with torch.no_grad():
        model.net(torch.zeros(1, 3, 224, 224))
    assert calls == []
