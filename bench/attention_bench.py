"""Fused (SDPA) against manual (matmul-softmax-matmul) attention for ViT, fp32 and fp16 autocast.

    python bench/attention_bench.py                 # CUDA when available, else CPU
    python bench/attention_bench.py --device cuda --sizes ti,s,b --batch 1,32

Times (1) one ViT attention module alone and (2) the whole ViT forward, with the modules'
``fused_attn`` flag on and off, using CUDA events (device time) on a GPU. Also records whether
fused equals manual bit for bit and the max abs difference, per precision. Prints a table and
writes JSON to bench/results/<date>-attention-<device>.json.

Swin rows (``--swin-sizes t,s,b``, key ``swin_rows``): the window attention of stage 1's shifted
block (its relative position bias plus the shift mask reach SDPA as one additive mask) and the
whole Swin forward, fused against manual, same precisions and batches.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from libreyolo import set_fused_attention
from libreyolo.models.swin.network import SwinTransformer, shifted_window_mask, window_partition
from libreyolo.models.vit.network import VIT_SIZES, VisionTransformer


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sizes", default="ti,s,b")
    ap.add_argument("--batch", default="1,8,32")
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--out", default=None)
    ap.add_argument("--swin-sizes", default="t,s,b", help="swin sizes for the window-attention rows ('' to skip)")
    args = ap.parse_args()
    device = torch.device(args.device)
    rows = run(device, args.sizes.split(","), [int(b) for b in args.batch.split(",")], args.n)
    swin_rows = run_swin(device, [s for s in args.swin_sizes.split(",") if s],
                         [int(b) for b in args.batch.split(",")], args.n)
    head = f"{'size':<5}{'batch':>6} {'precision':<14}{'attn fused':>11}{'manual':>9}{'x':>6}{'exact':>7}" \
           f"{'fwd fused':>11}{'manual':>9}{'x':>6}{'exact':>7}  max diff fwd"
    print(head)
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
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    result = {"device": name, "torch": torch.__version__, "command": "python bench/attention_bench.py "
              + " ".join(f"--{k} {v}" for k, v in vars(args).items() if v is not None), "rows": rows,
              "swin_rows": swin_rows,
              "date": datetime.date.today().isoformat()}
    out = Path(args.out) if args.out else (Path(__file__).parent / "results"
                                           / f"{result['date']}-attention-{device.type}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
