"""Which module's CUDA graph differs from its eager run (for a family whose graph != eager in the
parity matrix, e.g. lwdetr-t fp32 at 640, 2026-12-07 H200: up to 1.4e-5 on pred_logits).

    python bench/graph_bisect.py --family lwdetr --size t --imgsz 640 [--no-providers]

The model is the parity harness's seeded one and the input its ``uniform`` probe. One eager forward
records every module's inputs and output (first call of each module); then each module alone is
captured in a CUDA graph on those recorded inputs and replayed, and its output compared bit for bit
with the recorded eager one. Modules are listed in call order with their largest difference; the
smallest failing modules point at the op (a GEMM picked differently under capture, a kernel
provider taken in one mode only, ...). ``--no-providers`` first drops every registered
``ms_deform_attn`` provider (Triton, Hub), so eager and graph both run the portable sampling: if
the whole model then passes, the difference is a provider's. ``--blas cublas`` / ``cublaslt``
pins the GEMM library (a GEMM whose algorithm differs under capture, e.g. a split-K choice that
depends on the workspace, shows up as a Linear that differs with one library and not the other).
Needs CUDA; prints, writes nothing.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map


def _clone(x: Any) -> Any:
    return tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, x)


def _max_diff(a: Any, b: Any) -> float | None:
    """Largest |a - b| over the tensors of two nests; None when they are bit-identical."""
    fa, fb = tree_flatten(a)[0], tree_flatten(b)[0]
    worst, same = 0.0, True
    for x, y in zip(fa, fb, strict=False):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or not torch.equal(x, y):
                same = False
                if x.shape == y.shape and x.is_floating_point():
                    worst = max(worst, float((x.float() - y.float()).abs().max()))
    return None if same else worst


def _graph_output(module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
    static_args, static_kwargs = _clone(args), _clone(kwargs)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm-up: caches (anchors, proposals, cuBLAS handles) filled outside capture
            module(*static_args, **static_kwargs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = module(*static_args, **static_kwargs)
    graph.replay()
    torch.cuda.synchronize()
    return _clone(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", required=True)
    ap.add_argument("--size", required=True)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--no-providers", action="store_true", help="drop the ms_deform_attn providers first")
    ap.add_argument("--blas", choices=("cublas", "cublaslt"),
                    help="torch.backends.cuda.preferred_blas_library for the whole run")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    if a.blas:
        torch.backends.cuda.preferred_blas_library(a.blas)
    from libreyolo.graphs.parity import probes, seeded_model

    if a.no_providers:
        from libreyolo import kernels

        for impl in list(kernels.candidates("ms_deform_attn")):
            if impl.name != kernels.REFERENCE:
                kernels.disable("ms_deform_attn", impl.name, "graph_bisect --no-providers")
        print(f"ms_deform_attn providers left: {[i.name for i in kernels.candidates('ms_deform_attn')]}")
    model = seeded_model(a.family, a.size, device="cuda")
    net = model.net.eval()
    x = probes(model.family, a.imgsz, device=torch.device("cuda"))["uniform"]
    calls: dict[str, tuple] = {}
    order: list[str] = []

    def hook(name: str):
        def record(module, args, kwargs, output):
            if name not in calls:
                calls[name] = (_clone(args), _clone(kwargs), _clone(output))
                order.append(name)
        return record

    handles = [m.register_forward_hook(hook(n or "<net>"), with_kwargs=True) for n, m in net.named_modules()]
    with torch.inference_mode():
        net(x)
        for h in handles:
            h.remove()
        modules = dict(net.named_modules())
        modules["<net>"] = net
        failing = []
        for name in order:
            args, kwargs, eager = calls[name]
            try:
                diff = _max_diff(_graph_output(modules[name], args, kwargs), eager)
            except Exception as exc:  # noqa: BLE001 - a module that cannot be captured alone is reported, not fatal
                print(f"  {name}: not capturable alone ({type(exc).__name__}: {str(exc)[:120]})")
                continue
            if diff is not None:
                failing.append(name)
                print(f"DIFF {name} ({type(modules[name]).__name__}): max abs {diff:.3g}")
    leaves = [n for n in failing if not any(o != n and o.startswith(n + ".") for o in failing)]
    print(f"{len(failing)} of {len(order)} modules differ; smallest: {leaves or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
