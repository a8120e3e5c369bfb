"""Where graphed b1 predict() spends its time beyond the network (issue 45), on CUDA.

    PYTHONPATH=. python3 bench/host_profile.py --families yolo9 rtdetr vit [--half] [--n 200] [--out DIR]

Per family (seeded model, size as bench/host_overhead.py, a 480x640 frame): the graphed predict and
the graphed forward alone (medians), then the pipeline's device time (torch.profiler: CUDA kernels
of 20 graphed calls, graph replays included) and the host's (cProfile of --n calls, by own time).
For finding the cost, not for reporting latency (the profilers add their own).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.host_overhead import SIZES, _frame, _median_ms  # noqa: E402
from libreyolo.data.sources import array_source  # noqa: E402
from libreyolo.graphs.parity import seeded_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", nargs="+", default=["yolo9", "rtdetr", "vit"])
    ap.add_argument("--half", action="store_true")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    for name in args.families:
        profile_one(name, args)


def profile_one(name: str, args: argparse.Namespace) -> None:
    sync, dev = torch.cuda.synchronize, torch.device("cuda")
    model = seeded_model(name, SIZES[name], device="cuda")
    frame = _frame(name, model.family.task)
    kw = {"conf": 0.25} if model.family.task == "detect" else {}
    x, _ = model.family.letterbox(model.imgsz)([array_source(frame, "bgr", "frame").to_device(dev)],
                                               dtype=torch.float16 if args.half else torch.float32)
    call = lambda: model.predict(frame, half=args.half, cuda_graph=True, **kw)  # noqa: E731
    fwd = _median_ms(lambda: model.graph_forward(x, True), 100, 10, sync)
    pred = _median_ms(call, 100, 10, sync)
    tag = "fp16" if args.half else "fp32"
    text = [f"## {name}-{SIZES[name]} {tag}: predict {pred} ms, forward alone {fwd} ms, over {pred - fwd:.3f} ms"]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            call()
        sync()
    events = prof.key_averages()
    text.append(events.table(sort_by="self_device_time_total", row_limit=25, max_name_column_width=60))
    text.append(events.table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=60))
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(args.n):
        call()
    sync()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(35)
    text.append(f"cProfile, {args.n} calls, by own time:\n" + s.getvalue())
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(45)
    text.append("by cumulative time:\n" + s.getvalue())
    out = "\n".join(text)
    print(out)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"host-profile-{name}.txt").write_text(out)


if __name__ == "__main__":
    main()
