"""Fused (SDPA) against manual (matmul-softmax-matmul) attention: ViT/Swin modules, and every attention family.

    python bench/attention_bench.py                 # CUDA when available, else CPU
    python bench/attention_bench.py --device cuda --sizes ti,s,b --batch 1,32
    python bench/attention_bench.py --families vit,deit,swin,segformer,swinir \
        --out bench/results/<date>-attention-families-h200.json          # the per-family run (H200: < 4 min)
    python bench/attention_bench.py --families vit,deit,swin,segformer,swinir --device cpu --quick --out /tmp/a.json

Without ``--families``: times (1) one ViT attention module alone and (2) the whole ViT forward, with
the modules' ``fused_attn`` flag on and off, using CUDA events (device time) on a GPU, fp32 and fp16
autocast. Also records whether fused equals manual bit for bit and the max abs difference, per
precision. Prints a table and writes JSON to bench/results/<date>-attention-<device>.json.
Swin rows (``--swin-sizes t,s,b``, key ``swin_rows``): the window attention of stage 1's shifted
block (its relative position bias plus the shift mask reach SDPA as one additive mask) and the
whole Swin forward, fused against manual, same precisions and batches.

With ``--families`` (key ``family_rows``; the other rows are skipped): per family, its smallest
size with the seeded weights of ``tests/attention_rule.py`` at its typical input (224 for the
classifiers, 512 for SegFormer, 256 for SwinIR; ``--quick``: tiny inputs, batch 1, few calls),
in fp32 and fp16 (a float16 copy of the network, as ``predict(half=True)`` runs): the max abs
difference fused against manual of the network output on four input distributions (uniform,
clipped normal, ramp, large magnitude; per distribution and overall) and of the worst attention
module alone, whether that is byte-exact, the family's default and the rule's verdict
(docs/kernels.md: fused by default only if byte-exact, ViT/DeiT excepted), and the eager
latency manual against fused at each ``--batch`` (default 1,8 here).
"""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the seeded families of tests/attention_rule.py

from libreyolo import set_fused_attention  # noqa: E402
from libreyolo.models.swin.network import SwinTransformer, shifted_window_mask, window_partition  # noqa: E402
from libreyolo.models.vit.network import VIT_SIZES, VisionTransformer  # noqa: E402
from tests.attention_rule import (  # noqa: E402
    compare_paths,
    default_fused,
    max_abs_diff,
    probe_batch,
    rule_violation,
    seeded_net,
    tensors,
)

# family -> (smallest size, typical input, --quick input); classifiers take 224 only
FAMILY_CASES = {
    "vit": ("ti", 224, 224),
    "deit": ("t", 224, 224),
    "swin": ("t", 224, 224),
    "segformer": ("b0", 512, 64),
    "swinir": ("s", 256, 32),
    "rtdetr": ("r18", 640, 96),
    "dfine": ("n", 640, 96),
}


def _time(fn, device: torch.device, n: int, warmup: int = 10) -> float:
    """Median milliseconds per call (CUDA events on a GPU, perf_counter on the CPU)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(n):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def run(device: torch.device, sizes: list[str], batches: list[int], n: int) -> list[dict]:
    rows = []
    precisions = ["fp32"] + (["fp16-autocast"] if device.type == "cuda" else [])
    for size in sizes:
        torch.manual_seed(0)
        net = VisionTransformer(VIT_SIZES[size], 1000).to(device).eval()
        attn = net.blocks[0].attn
        dim = VIT_SIZES[size].embed_dim
        for batch in batches:
            x_img = torch.randn(batch, 3, 224, 224, device=device)
            x_tok = torch.randn(batch, 197, dim, device=device)
            for prec in precisions:
                ctx = (lambda: torch.autocast("cuda", dtype=torch.float16)) if prec != "fp32" else torch.no_grad
                row = {"size": size, "batch": batch, "precision": prec}
                for what, module, x in (("attention", attn, x_tok), ("forward", net, x_img)):
                    outs = {}
                    for fused in (True, False):
                        set_fused_attention(net, enabled=fused)
                        with torch.inference_mode(), ctx():
                            outs[fused] = module(x).float()
                            key = f"{what}_{'fused' if fused else 'manual'}_ms"
                            row[key] = _time(lambda m=module, t=x: m(t), device, n)
                    row[f"{what}_speedup"] = row[f"{what}_manual_ms"] / row[f"{what}_fused_ms"]
                    row[f"{what}_byte_exact"] = bool(torch.equal(outs[True], outs[False]))
                    row[f"{what}_max_abs_diff"] = float((outs[True] - outs[False]).abs().max())
                set_fused_attention(net, enabled=True)
                rows.append(row)
    return rows


def run_swin(device: torch.device, sizes: list[str], batches: list[int], n: int) -> list[dict]:
    """Swin window attention (stage 1's shifted block: bias + shift mask) and the whole forward."""
    rows = []
    precisions = ["fp32"] + (["fp16-autocast"] if device.type == "cuda" else [])
    for size in sizes:
        torch.manual_seed(0)
        net = SwinTransformer(size, 1000).to(device).eval()
        with torch.no_grad():  # a non-zero bias table, as trained weights have
            for m in net.modules():
                if hasattr(m, "relative_position_bias_table"):
                    m.relative_position_bias_table.normal_(0, 0.02)
        block = net.layers[0].blocks[1]
        attn, window, res = block.attn, block.window, 56
        mask = shifted_window_mask(res, res, window, block.shift, device)
        for batch in batches:
            x_img = torch.randn(batch, 3, 224, 224, device=device)
            x_win = window_partition(torch.randn(batch, res, res, attn.dim, device=device), window)
            for prec in precisions:
                ctx = (lambda: torch.autocast("cuda", dtype=torch.float16)) if prec != "fp32" else torch.no_grad
                row = {"family": "swin", "size": size, "batch": batch, "precision": prec,
                       "windows": int(x_win.shape[0]), "heads": attn.num_heads}
                calls = (("window_attention", lambda a=attn, t=x_win, m=mask: a(t, m)),
                         ("forward", lambda f=net, t=x_img: f(t)))
                for what, fn in calls:
                    outs = {}
                    for fused in (True, False):
                        set_fused_attention(net, enabled=fused)
                        with torch.inference_mode(), ctx():
                            outs[fused] = fn().float()
                            row[f"{what}_{'fused' if fused else 'manual'}_ms"] = _time(fn, device, n)
                    row[f"{what}_speedup"] = row[f"{what}_manual_ms"] / row[f"{what}_fused_ms"]
                    row[f"{what}_byte_exact"] = bool(torch.equal(outs[True], outs[False]))
                    row[f"{what}_max_abs_diff"] = float((outs[True] - outs[False]).abs().max())
                set_fused_attention(net, enabled=False)  # swin's default
                rows.append(row)
    return rows


def run_families(device: torch.device, names: list[str], batches: list[int], n: int, quick: bool) -> list[dict]:
    """Per family and precision: fused-vs-manual differences on the probe batch, rule verdict, latency."""
    rows = []
    precisions = {"fp32": torch.float32, **({"fp16": torch.float16} if device.type == "cuda" else {})}
    for name in names:
        if name not in FAMILY_CASES:
            raise SystemExit(f"unknown attention family {name!r}; one of {', '.join(FAMILY_CASES)}")
        size, typical, tiny = FAMILY_CASES[name]
        imgsz = tiny if quick else typical
        master = seeded_net(name, size, calibration=torch.cat(list(probe_batch(imgsz, large=False).values())))
        default = default_fused(master)
        for prec, dtype in precisions.items():
            probes = probe_batch(imgsz, large=dtype == torch.float32)  # x100 inputs overflow fp16 (DETR)
            net = copy.deepcopy(master).to(device, dtype)
            cmp = compare_paths(net, torch.cat(list(probes.values())).to(device, dtype))
            per_input = {k: max_abs_diff(_sample(cmp.manual, i), _sample(cmp.fused, i)) for i, k in enumerate(probes)}
            violation = rule_violation(name, cmp.output_diff, default)
            for batch in batches:
                g = torch.Generator().manual_seed(batch)
                x = torch.rand(batch, 3, imgsz, imgsz, generator=g).to(device, dtype)
                row = {"family": name, "size": size, "imgsz": imgsz, "batch": batch, "precision": prec,
                       "attention_modules": len(cmp.module_diffs), "default_fused": default,
                       "byte_exact": cmp.byte_exact, "max_abs_diff": cmp.output_diff,
                       "max_abs_diff_per_input": per_input, "worst_module_max_abs_diff": cmp.worst_module_diff,
                       "output_magnitude": max(float(t.float().abs().max()) for t in tensors(cmp.manual)),
                       "rule": "ok" if violation is None else "VIOLATED", "rule_violation": violation}
                with torch.inference_mode():
                    for fused in (False, True):
                        set_fused_attention(net, fused)
                        row[f"{'fused' if fused else 'manual'}_ms"] = _time(lambda f=net, t=x: f(t), device, n,
                                                                           warmup=min(10, n))
                set_fused_attention(net, default)
                row["speedup"] = row["manual_ms"] / row["fused_ms"]
                rows.append(row)
            del net
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def _sample(out, i: int):
    """Sample ``i`` of a batched output (every tensor's first dimension)."""
    return [t[i] for t in tensors(out)]


def print_family_rows(rows: list[dict]) -> None:
    print(f"{'family':<10}{'size':<5}{'px':>5}{'batch':>6} {'prec':<5}{'default':>8}{'exact':>7}{'max diff':>10}"
          f"{'module':>10}{'rule':>6}{'manual ms':>11}{'fused ms':>10}{'x':>6}")
    for r in rows:
        print(f"{r['family']:<10}{r['size']:<5}{r['imgsz']:>5}{r['batch']:>6} {r['precision']:<5}"
              f"{'fused' if r['default_fused'] else 'manual':>8}{str(r['byte_exact']):>7}{r['max_abs_diff']:>10.3g}"
              f"{r['worst_module_max_abs_diff']:>10.3g}{r['rule']:>6}{r['manual_ms']:>11.3f}{r['fused_ms']:>10.3f}"
              f"{r['speedup']:>6.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sizes", default="ti,s,b")
    ap.add_argument("--batch", default=None, help="batch sizes (default 1,8,32; with --families 1,8; --quick 1)")
    ap.add_argument("--n", type=int, default=None, help="timed calls per figure (default 50; --families 30; --quick 3)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--swin-sizes", default="t,s,b", help="swin sizes for the window-attention rows ('' to skip)")
    ap.add_argument("--families", default="", help="per-family rows instead, e.g. vit,deit,swin,segformer,swinir "
                    f"(known: {','.join(FAMILY_CASES)})")
    ap.add_argument("--quick", action="store_true", help="tiny inputs, batch 1, 3 calls: a smoke check (CPU)")
    args = ap.parse_args()
    device = torch.device(args.device)
    batches = [int(b) for b in (args.batch or ("1" if args.quick else "1,8" if args.families else "1,8,32")).split(",")]
    n = args.n or (3 if args.quick else 30 if args.families else 50)
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
              "torch": torch.__version__, "cuda": torch.version.cuda,
              "command": " ".join(["python", "bench/attention_bench.py", *sys.argv[1:]]),
              "date": datetime.date.today().isoformat()}
    if args.families:
        result["family_rows"] = run_families(device, args.families.split(","), batches, n, args.quick)
        print_family_rows(result["family_rows"])
        kind = "attention-families"
    else:
        result["rows"] = run(device, args.sizes.split(","), batches, n)
        result["swin_rows"] = run_swin(device, [s for s in args.swin_sizes.split(",") if s], batches, n)
        print_module_rows(result["rows"], result["swin_rows"])
        kind = "attention"
    out = Path(args.out) if args.out else (Path(__file__).parent / "results"
                                           / f"{result['date']}-{kind}-{device.type}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


def print_module_rows(rows: list[dict], swin_rows: list[dict]) -> None:
    print(f"{'size':<5}{'batch':>6} {'precision':<14}{'attn fused':>11}{'manual':>9}{'x':>6}{'exact':>7}"
          f"{'fwd fused':>11}{'manual':>9}{'x':>6}{'exact':>7}  max diff fwd")
    for r in rows:
        print(f"{r['size']:<5}{r['batch']:>6} {r['precision']:<14}{r['attention_fused_ms']:>11.3f}"
              f"{r['attention_manual_ms']:>9.3f}{r['attention_speedup']:>6.2f}{str(r['attention_byte_exact']):>7}"
              f"{r['forward_fused_ms']:>11.3f}{r['forward_manual_ms']:>9.3f}{r['forward_speedup']:>6.2f}"
              f"{str(r['forward_byte_exact']):>7}  {r['forward_max_abs_diff']:.3g}")
    if swin_rows:
        print(f"\n{'swin':<5}{'batch':>6} {'precision':<14}{'win fused':>11}{'manual':>9}{'x':>6}{'exact':>7}"
              f"{'fwd fused':>11}{'manual':>9}{'x':>6}{'exact':>7}  max diff fwd")
    for r in swin_rows:
        print(f"{r['size']:<5}{r['batch']:>6} {r['precision']:<14}{r['window_attention_fused_ms']:>11.3f}"
              f"{r['window_attention_manual_ms']:>9.3f}{r['window_attention_speedup']:>6.2f}"
              f"{str(r['window_attention_byte_exact']):>7}{r['forward_fused_ms']:>11.3f}{r['forward_manual_ms']:>9.3f}"
              f"{r['forward_speedup']:>6.2f}{str(r['forward_byte_exact']):>7}  {r['forward_max_abs_diff']:.3g}")


if __name__ == "__main__":
    main()
