"""What the CUDA-graph parity harness needs of the DETR line, checked on the CPU: no per-forward
host work in RF-DETR's backbone (the constant resize weights of its position table are built once
per shape on the model's device, as anchors are), and DEIMv2's ViT sizes keep half precision
through the decoder. The graph checks themselves need a GPU (marked ``gpu`` below)."""
from __future__ import annotations

import pytest
import torch

from libreyolo.models.registry import get_family


def test_rfdetr_position_resize_weights_are_built_once_per_shape(monkeypatch):
    """The second forward at a shape reuses the device copy of the resize weights (a CUDA graph
    captures that forward; a host -> device copy inside it fails capture, as the H200 matrix of
    2026-12-07 recorded). Mutation: without the per-shape cache the second forward builds them
    again and the spy below records a call."""
    from libreyolo.models.rfdetr import dinov2

    torch.manual_seed(0)
    net = get_family("rfdetr").build("n", 3).eval()
    embed = net.backbone[0].encoder.encoder.embeddings
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        first = embed(x)
    calls = []
    real = dinov2.aa_bicubic_weights
    monkeypatch.setattr(dinov2, "aa_bicubic_weights", lambda *a: calls.append(a) or real(*a))
    with torch.no_grad():
        again = embed(x)
        embed(torch.rand(1, 3, 96, 96))
    assert torch.equal(first, again) and calls == [(24, 6), (24, 6)]  # only the new shape (96 px: 6 x 6 patches)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_deimv2_vit_size_keeps_half_precision(dtype):
    """deimv2-s (a ViT size, whose ``reg_scale`` is an int64 parameter) runs under half weights and
    returns half outputs; before the fix ``0.5 * reg_scale`` made the boxes float32 and the next
    layer's grid_sample refused the mix ("expected scalar type Half but found Float")."""
    torch.manual_seed(0)
    net = get_family("deimv2").build("s", 3).eval()
    assert net.decoder.reg_scale.dtype == torch.int64
    with torch.no_grad():
        out = net.to(dtype)(torch.rand(1, 3, 64, 64).to(dtype))
    assert out["pred_logits"].dtype == dtype and out["pred_boxes"].dtype == dtype
    # values are not compared with float32 here: the untrained top-k selection reorders under half
    # rounding (rows differ wholesale); graph-vs-eager fp16 equality is the GPU harness's check
    assert bool(torch.isfinite(out["pred_boxes"]).all())


# --- on a CUDA machine: the parity harness's rows for the three families the 2026-12-07 H200 matrix
# failed (rfdetr: capture; deimv2 ViT sizes: fp16; lwdetr-t: graph != eager by ~1e-5 in fp32)
@pytest.mark.gpu
@pytest.mark.parametrize("name,size", [("rfdetr", "n"), ("deimv2", "s"), ("lwdetr", "t")])
def test_graph_parity_rows_pass_on_cuda(name, size):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from libreyolo.graphs.parity import check_family_size

    rows = check_family_size(name, size, device="cuda", imgszs=(640, 320))
    failed = [f"{r['check']}: {r['detail']}" for r in rows if r["result"] == "fail"]
    assert not failed, failed
