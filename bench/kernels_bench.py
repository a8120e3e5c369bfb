"""Time each kernel slot's reference against its in-tree provider on CUDA.

    PYTHONPATH=. python3 bench/kernels_bench.py --json out.json

Prints a table (median milliseconds per call, CUDA events) and writes JSON
with the GPU name, torch/Triton versions and the command. Each row also
records the parity seen in that run (exact match for fake quantization, max
absolute difference for deformable attention), so a speed number is never
reported for a kernel that gave different answers.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from libreyolo import kernels  # noqa: E402
from libreyolo.kernels.attention.deformable import ms_deform_attn_portable  # noqa: E402
from libreyolo.quant import (  # noqa: E402
    fake_quant_fp8,
    fake_quant_int8_affine,
    fake_quant_int8_per_channel,
)


def time_ms(fn: Callable[[], object], warmup: int, iters: int, repeats: int = 5) -> float:
    """Median over `repeats` of the mean time of `iters` back-to-back calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / iters)
    return statistics.median(samples)


def forward_backward(fn: Callable[..., torch.Tensor], x: torch.Tensor, *args: object) -> Callable[[], None]:
    leaf = x.detach().clone().requires_grad_()
    grad = torch.ones_like(x)

    def run() -> None:
        leaf.grad = None
        fn(leaf, *args).backward(grad)

    return run


def quant_cases() -> list[tuple[str, str, Callable, Callable, torch.Tensor, tuple]]:
    from libreyolo.kernels.quant import triton_provider as tp

    gen = torch.Generator(device="cuda").manual_seed(0)
    act = torch.randn(16, 256, 80, 80, device="cuda", generator=gen)
    weight = torch.randn(4096, 4096, device="cuda", generator=gen) * 0.02
    scale = torch.tensor(0.05, device="cuda")
    zero_point = torch.tensor(3, device="cuda")
    channel_scale = weight.abs().amax(dim=1) / 127
    cases = []
    for dtype in (torch.bfloat16, torch.float32):
        name = str(dtype).replace("torch.", "")
        a, w = act.to(dtype), weight.to(dtype)
        cases += [
            ("fake_quant_fp8", f"act 16x256x80x80 {name}", fake_quant_fp8, tp.fake_quant_fp8, a, (scale,)),
            (
                "fake_quant_int8_per_channel",
                f"weight 4096x4096 axis0 {name}",
                fake_quant_int8_per_channel,
                tp.fake_quant_int8_per_channel,
                w,
                (channel_scale, 0),
            ),
            (
                "fake_quant_int8_affine",
                f"act 16x256x80x80 {name}",
                fake_quant_int8_affine,
                tp.fake_quant_int8_affine,
                a,
                (scale, zero_point),
            ),
        ]
    return cases


def msda_inputs(batch: int, queries: int) -> tuple:
    gen = torch.Generator(device="cuda").manual_seed(0)
    shapes = [(80, 80), (40, 40), (20, 20), (10, 10)]
    length = sum(h * w for h, w in shapes)
    heads, channels, points = 8, 32, 4
    value = torch.randn(batch, length, heads, channels, device="cuda", generator=gen)
    locs = torch.rand(batch, queries, heads, len(shapes), points, 2, device="cuda", generator=gen)
    weights = torch.rand(batch, queries, heads, len(shapes), points, device="cuda", generator=gen).softmax(-1)
    return value, torch.tensor(shapes, device="cuda"), shapes, locs, weights


def bench_quant(rows: list[dict], warmup: int, iters: int) -> None:
    for slot, case, reference, provider, x, args in quant_cases():
        same = torch.equal(provider(x, *args), reference(x, *args))
        for mode in ("forward", "forward+backward"):
            if mode == "forward":
                ref_fn, prov_fn = partial(reference, x, *args), partial(provider, x, *args)
            else:
                ref_fn, prov_fn = forward_backward(reference, x, *args), forward_backward(provider, x, *args)
            rows.append(row(slot, case, mode, time_ms(ref_fn, warmup, iters), time_ms(prov_fn, warmup, iters), same))


def bench_msda(rows: list[dict], warmup: int, iters: int) -> None:
    from libreyolo.kernels.attention.deformable_triton import ms_deform_attn_triton

    for label, batch, queries in (("decoder B4 Q300", 4, 300), ("encoder B2 Q8500", 2, 8500)):
        value, shapes_t, shapes, locs, weights = msda_inputs(batch, queries)
        with torch.no_grad():
            expected = ms_deform_attn_portable(value, shapes, locs, weights)
            diff = (ms_deform_attn_triton(value, shapes_t, locs, weights) - expected).abs().max().item()
            portable = partial(ms_deform_attn_portable, value, shapes, locs, weights)
            provider = partial(ms_deform_attn_triton, value, shapes_t, locs, weights)
            ref_ms = time_ms(portable, warmup, iters)
            prov_ms = time_ms(provider, warmup, iters)
        case = f"{label} H8 C32 L4 P4 float32"
        rows.append(row("ms_deform_attn", case, "forward", ref_ms, prov_ms, diff <= 1e-5, max_abs_diff=diff))


def row(slot: str, case: str, mode: str, ref_ms: float, prov_ms: float, parity: bool, **extra) -> dict:
    return {
        "slot": slot,
        "case": case,
        "mode": mode,
        "provider": "triton",
        "reference_ms": round(ref_ms, 4),
        "provider_ms": round(prov_ms, 4),
        "speedup": round(ref_ms / prov_ms, 3) if prov_ms > 0 else None,
        "parity": parity,
        **extra,
    }


def print_table(rows: list[dict]) -> None:
    header = f"{'slot':<28} {'case':<36} {'mode':<17} {'ref ms':>9} {'prov ms':>9} {'x':>7}  parity"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['slot']:<28} {r['case']:<36} {r['mode']:<17} {r['reference_ms']:>9.4f} "
            f"{r['provider_ms']:>9.4f} {r['speedup']:>7.2f}  {'ok' if r['parity'] else 'MISMATCH'}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the results to this JSON file")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("kernels_bench: no CUDA device; the providers only run on CUDA. Nothing was timed.")
        return 1
    try:
        import triton
    except ImportError:
        print("kernels_bench: Triton is not installed; there is no in-tree provider to time.")
        return 1
    rows: list[dict] = []
    bench_quant(rows, args.warmup, args.iters)
    bench_msda(rows, args.warmup, args.iters)
    print_table(rows)
    result = {
        "what": "kernel slots: reference vs in-tree Triton provider",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "active": kernels.active(),
        "timing": f"CUDA events, median of 5 repeats of {args.iters} calls after {args.warmup} warm-up calls",
        "rows": rows,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0 if all(r["parity"] for r in rows) else 2


if __name__ == "__main__":
    sys.exit(main())
