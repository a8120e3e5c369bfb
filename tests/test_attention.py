"""Fused attention policy: SDPA in eager and under torch.compile, primitive ops in every export."""

from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from libreyolo import kernels
from libreyolo.kernels.attention import attention, attention_primitive, set_fused_attention
from tests.numerics import assert_within_float32_noise, float64_run

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

FUSED_NAMES = (
    "scaled_dot_product_attention",
    "_scaled_dot_product",
    "flash_attention",
    "efficient_attention",
)


class TinyAttention(nn.Module):
    """A module as model code would write it: one call to the helper."""

    def __init__(self, dim: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.fused_attn = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        out = attention(q, k, v, fused=self.fused_attn)
        return out.transpose(1, 2).reshape(b, n, d)


@pytest.fixture
def sdpa_calls(monkeypatch):
    calls = []
    original = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counting)
    return calls


def qkv(*shape: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(*shape), torch.randn(*shape), torch.randn(*shape)


def has_fused_node(graph: torch.fx.Graph) -> bool:
    return any(any(name in str(node.target) for name in FUSED_NAMES) for node in graph.nodes)


def test_fused_and_primitive_paths_agree():
    q, k, v = qkv(2, 3, 7, 16)
    exact = float64_run(attention, q, k, v, fused=False)
    assert_within_float32_noise(attention(q, k, v), attention(q, k, v, fused=False), exact)


def test_bool_mask_means_attend_and_float_mask_is_added():
    q, k, v = qkv(1, 2, 5, 8)
    keep = torch.rand(5, 5) > 0.3
    keep[:, 0] = True
    additive = torch.randn(5, 5)
    for mask in (keep, additive):
        fused = attention(q, k, v, mask=mask)
        manual = attention(q, k, v, mask=mask, fused=False)
        assert_within_float32_noise(fused, manual, float64_run(attention, q, k, v, mask=mask, fused=False))
    blocked = attention(q, k, v, mask=torch.zeros(5, 5, dtype=torch.bool).fill_diagonal_(True), fused=False)
    torch.testing.assert_close(blocked, v)  # each query may only see its own position


def test_explicit_scale_is_honoured_by_both_paths():
    q, k, v = qkv(1, 1, 4, 8)
    exact = float64_run(attention_primitive, q, k, v, scale=0.05)
    assert_within_float32_noise(attention(q, k, v, scale=0.05), attention_primitive(q, k, v, scale=0.05), exact)
    assert not torch.allclose(attention(q, k, v, scale=0.05), attention(q, k, v))


def test_eager_uses_sdpa_only_when_fused_is_requested(sdpa_calls):
    q, k, v = qkv(1, 2, 4, 8)
    attention(q, k, v)
    assert len(sdpa_calls) == 1
    attention(q, k, v, fused=False)
    assert len(sdpa_calls) == 1


def test_attention_explains_mismatched_shapes():
    with pytest.raises(ValueError, match="same last dim"):
        attention(torch.randn(2, 4, 8), torch.randn(2, 4, 6), torch.randn(2, 4, 6))


def test_jit_trace_records_primitive_ops(sdpa_calls):
    traced = torch.jit.trace(TinyAttention().eval(), torch.randn(1, 5, 8), check_trace=False)
    assert not sdpa_calls
    assert "scaled_dot_product_attention" not in str(traced.graph)


def test_plain_torch_compile_keeps_the_fused_op():
    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm.graph)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(TinyAttention().eval(), backend=recording_backend, fullgraph=True)
    compiled(torch.randn(1, 5, 8))
    assert graphs and has_fused_node(graphs[0])


def test_torch_export_graph_has_no_fused_attention_and_matches_eager():
    model = TinyAttention().eval()
    x = torch.randn(2, 5, 8)
    exported = torch.export.export(model, (x,))
    assert not has_fused_node(exported.graph)
    with torch.no_grad():
        assert_within_float32_noise(exported.module()(x), model(x), float64_run(model, x))


def test_the_check_above_would_see_a_fused_op():
    class RawSdpa(nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v)

    exported = torch.export.export(RawSdpa(), qkv(1, 2, 4, 8))
    assert has_fused_node(exported.graph)


def onnx_outputs(data: bytes, x: torch.Tensor):
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


def onnx_op_types(model) -> set[str]:
    return {node.op_type for node in model.graph.node}


def test_onnx_torchscript_export_has_no_attention_op_and_matches_eager():
    model = TinyAttention().eval()
    x = torch.randn(1, 5, 8)
    buffer = io.BytesIO()
    torch.onnx.export(model, (x,), buffer, dynamo=False, opset_version=17)
    types = onnx_op_types(onnx.load_from_string(buffer.getvalue()))
    assert "Attention" not in types and {"MatMul", "Softmax"} <= types
    with torch.no_grad():
        expected = model(x)
    assert_within_float32_noise(torch.from_numpy(onnx_outputs(buffer.getvalue(), x)), expected, float64_run(model, x))


def test_onnx_dynamo_export_has_no_attention_op_and_matches_eager():
    pytest.importorskip("onnxscript", reason="dynamo ONNX export needs onnxscript")
    model = TinyAttention().eval()
    x = torch.randn(1, 5, 8)
    # Opset 23 has an Attention op that a fused SDPA would be lowered to.
    program = torch.onnx.export(model, (x,), dynamo=True, opset_version=23, verbose=False)
    assert not has_fused_node(program.exported_program.graph)
    types = onnx_op_types(program.model_proto)
    assert "Attention" not in types and {"MatMul", "Softmax"} <= types
    with torch.no_grad():
        expected = model(x)
    actual = onnx_outputs(program.model_proto.SerializeToString(), x)
    assert_within_float32_noise(torch.from_numpy(actual), expected, float64_run(model, x))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = TinyAttention()
        self.other = nn.Linear(8, 8)
        self.other.fused_attn = "not a flag"  # only boolean flags are switched


def test_set_fused_attention_switches_every_flag_and_counts_them():
    model = nn.Sequential(Block(), Block(), nn.ReLU())
    assert set_fused_attention(model, enabled=False) == 2
    assert [m.attn.fused_attn for m in model[:2]] == [False, False]
    assert model[0].other.fused_attn == "not a flag"
    assert kernels.set_fused_attention(model) == 2
    assert [m.attn.fused_attn for m in model[:2]] == [True, True]


def test_set_fused_attention_returns_zero_without_switchable_attention():
    assert set_fused_attention(nn.Linear(3, 3)) == 0


def test_set_fused_attention_rejects_non_modules():
    with pytest.raises(TypeError, match="nn.Module"):
        set_fused_attention(object())  # type: ignore[arg-type]
