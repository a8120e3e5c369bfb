"""RT-DETR / D-FINE on CUDA: deformable-attention providers, eager vs graphed forward, and the reference.

    PYTHONPATH=. python3 bench/detr_bench.py --json bench/results/<date>-detr-h200.json
    PYTHONPATH=. python3 bench/detr_bench.py --peer-python /path/to/reference/venv/bin/python ...

For rtdetr-r18 and dfine-n (seeded weights, 640, batch 1, fp32), on the letterboxed sample:

- per ``ms_deform_attn`` provider (the portable ``grid_sample`` path first, then every provider
  the registry has here, one at a time): median eager forward latency and the largest
  difference from the portable path's outputs (per query row; rows that only trade places in
  a near-tied query selection are matched first);
- the graphed forward (``Model.graph_forward``: copy-in, replay, copy-out) and whether it is
  bit-for-bit the eager forward; the bare replay;
- with ``--peer-python``: the reference library's ``predict()`` with and without
  ``cuda_graph=True`` in a child process of that interpreter (its D-FINE capture is expected to
  fail: its forward builds a host tensor). A failure is recorded, not raised.

Each figure is the median of ``--n`` calls after ``--warmup``, host-timed around a device sync.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from libreyolo import kernels  # noqa: E402
from libreyolo.kernels import _registry  # noqa: E402

SLOT = "ms_deform_attn"
CASES = (("rtdetr", "r18"), ("dfine", "n"))

PEER = r'''
import json, sys, time, statistics, numpy as np, torch, libreyolo
import libreyolo.models.rtdetr.model as rm
for v in rm.RTDETR_CONFIGS.values():
    v["backbone_pretrained"] = False
img = (np.random.default_rng(0).random((480, 640, 3)) * 255).astype(np.uint8)
out = {}
for fam, size in (("rtdetr", "r18"), ("dfine", "n")):
    m = (libreyolo.LibreRTDETR if fam == "rtdetr" else libreyolo.LibreDFINE)(None, size=size, device="cuda")
    for graph in (False, True):
        key = f"{fam}-{size} predict " + ("cuda_graph" if graph else "eager")
        try:
            for _ in range(WARMUP):
                m(img, conf=0.25, cuda_graph=graph)
            times = []
            for _ in range(N):
                torch.cuda.synchronize(); t = time.perf_counter()
                m(img, conf=0.25, cuda_graph=graph)
                torch.cuda.synchronize(); times.append((time.perf_counter() - t) * 1e3)
            out[key] = statistics.median(times)
        except Exception as exc:
            out[key] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
print("PEER_JSON " + json.dumps(out))
'''


def median_ms(fn, n: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def row_error(a: dict, b: dict) -> float:
    """Largest per-row difference after matching rows that only traded places."""
    from tests.test_compat_detr import rows_match

    worst = 0.0
    for i in range(a["pred_logits"].shape[0]):
        x = torch.cat([a["pred_logits"][i], a["pred_boxes"][i]], -1).float().cpu().numpy()
        y = torch.cat([b["pred_logits"][i], b["pred_boxes"][i]], -1).float().cpu().numpy()
        ok, _, err = rows_match(x, y, 1e-3)
        worst = max(worst, err if ok else float("inf"))
    return worst


def bench_case(family: str, size: str, n: int, warmup: int) -> dict:
    from libreyolo.assets import SAMPLE_IMAGE
    from libreyolo.data.sources import load_sources
    from libreyolo.graphs.parity import seeded_model

    model = seeded_model(family, size, device="cuda")
    x, _ = model.family.letterbox(640)([load_sources(SAMPLE_IMAGE)[0].data.cuda()])
    net = model.inference_module()
    kernels.active()
    names = [impl.name for impl in _registry._selection(SLOT).ordered]
    state = _registry._snapshot()
    row: dict = {"case": f"{family}-{size}", "providers": {}}
    try:
        with torch.inference_mode():
            for n_ in names:
                kernels.disable(SLOT, n_, "bench: portable")
            portable = net(x)
            row["providers"]["portable"] = {"forward_ms": median_ms(lambda: net(x), n, warmup), "max_diff": 0.0}
            _registry._restore(state)
            for name in names:
                for other in names:
                    if other != name:
                        kernels.disable(SLOT, other, "bench: one at a time")
                got = net(x)
                row["providers"][name] = {"forward_ms": median_ms(lambda: net(x), n, warmup),
                                          "max_diff": row_error(got, portable)}
                _registry._restore(state)
            eager = net(x)
            graphed = model.graph_forward(x, True)
            row["graph_bit_equal"] = all(torch.equal(eager[k], graphed[k]) for k in eager)
            row["forward_eager_ms"] = median_ms(lambda: net(x), n, warmup)
            row["forward_graph_ms"] = median_ms(lambda: model.graph_forward(x, True), n, warmup)
    finally:
        _registry._restore(state)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--peer-python", help="interpreter with the reference libreyolo 1.6.0 installed")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
              "command": " ".join(sys.argv), "cases": [bench_case(f, s, args.n, args.warmup) for f, s in CASES]}
    if args.peer_python:
        code = PEER.replace("WARMUP", str(args.warmup)).replace("N)", f"{args.n})")
        proc = subprocess.run([args.peer_python, "-c", code], capture_output=True, text=True, cwd="/tmp")
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("PEER_JSON ")]
        result["peer"] = json.loads(line[-1][len("PEER_JSON "):]) if line else {"error": proc.stderr[-2000:]}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
