"""Where a graphed predict() spends its time on CUDA: host stages, device kernels, candidate selection.

    PYTHONPATH=. python3 bench/serving_profile.py --shared ../shared [--json PATH]

For finding the slow part, not for reporting latency (``bench/serving_bench.py`` does that).
Three sections, YOLOv9-t at 640 on the sparse and dense workloads of the serving benchmark:

- ``host``: one graphed ``predict()`` split into its host stages (decode, upload, letterbox,
  pipeline replay, read-back, results), each timed with a device sync after it, at batch 1
  and 32 in fp16 and fp32;
- ``device``: ``torch.profiler`` over eager ``detect_padded`` (fixed shapes, the code the
  pipeline graph holds), the kernels by device time;
- ``select``: the device time of choosing the candidates, ``topk`` of ``max_nms`` keys against
  a full sort, and the NMS kernel alone, at several caps.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def cuda_ms(fn, n: int = 30, warm: int = 5) -> float:
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return round(statistics.median(times), 4)


def host_stages(model, frames: list[np.ndarray], half: bool, conf: float, n: int) -> dict[str, float]:
    from libreyolo.data.sources import open_sources
    from libreyolo.results import make_results

    dev = model.device
    lb = model.family.letterbox(640)
    dtype = torch.float16 if half else torch.float32
    post = model.family.device_postprocess()
    stages: dict[str, list[float]] = {k: [] for k in ("decode", "upload", "letterbox", "replay", "read", "results",
                                                       "predict", "forward_replay")}
    model(frames, conf=conf, half=half, batch=len(frames), cuda_graph=True)
    model(frames, conf=conf, half=half, batch=len(frames), cuda_graph=True)
    xf = torch.rand(len(frames), 3, 640, 640, device=dev, dtype=dtype)
    model._forward(xf, cuda_graph=True)
    for i in range(n + 5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        chunk = next(iter(open_sources(frames).batches(len(frames), skip_unreadable=False)))
        t1 = time.perf_counter()
        tensors = [img.to_device(dev) for img in chunk]
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        batch, metas = lb(tensors, dtype=dtype)
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        padded = model.pipeline_forward(batch, metas, True, conf=conf, iou=0.45, max_det=300)
        torch.cuda.synchronize()
        t4 = time.perf_counter()
        preds = post.read(padded)
        t5 = time.perf_counter()
        [make_results("detect", p, names=model.names, orig_shape=m.orig_shape, path=None, orig_img=img.pixels,
                      speed={}) for img, m, p in zip(chunk, metas, preds, strict=True)]
        t6 = time.perf_counter()
        model(frames, conf=conf, half=half, batch=len(frames), cuda_graph=True)
        torch.cuda.synchronize()
        t7 = time.perf_counter()
        model._forward(xf, cuda_graph=True)
        torch.cuda.synchronize()
        t8 = time.perf_counter()
        if i >= 5:
            for k, v in zip(stages, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t7 - t6, t8 - t7),
                            strict=True):
                stages[k].append(v * 1e3)
    return {k: round(statistics.median(v), 3) for k, v in stages.items()}


def device_profile(model, frames, half: bool, conf: float) -> str:
    from torch.profiler import ProfilerActivity, profile

    from libreyolo.ops.postprocess import detect_padded, pack_params

    dtype = torch.float16 if half else torch.float32
    tensors = [torch.from_numpy(f).to(model.device).permute(2, 0, 1).flip(0) for f in frames]
    batch, metas = model.family.letterbox(640)(tensors, dtype=dtype)
    preds = model._forward(batch)["predictions"]
    params = pack_params(metas, conf=conf, iou=0.45, nc=preds.shape[1] - 4, device=model.device)
    for _ in range(3):
        detect_padded(preds, params, max_det=300)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            detect_padded(preds, params, max_det=300)
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=18)


def selection(model, frames, conf: float) -> dict[str, float]:
    from libreyolo.ops import postprocess as pp

    tensors = [torch.from_numpy(f).to(model.device).permute(2, 0, 1).flip(0) for f in frames]
    batch, metas = model.family.letterbox(640)(tensors)
    preds = model._forward(batch)["predictions"].float()
    params = pp.pack_params(metas, conf=conf, iou=0.45, nc=preds.shape[1] - 4, device=model.device)
    b, c, n = preds.shape
    nc = c - 4
    scores = preds[:, 4:]
    index = (torch.arange(n, device=preds.device) * nc).unsqueeze(0) + torch.arange(nc, device=preds.device)[:, None]
    keys = pp._keys(scores, index, scores > conf).view(b, nc * n)
    out = {"keys_build": cuda_ms(lambda: pp._keys(scores, index, scores > conf)),
           "sort_all": cuda_ms(lambda: keys.sort(dim=1, descending=True))}
    for cap in (30000, 8192, 4096, 1024):
        out[f"topk_{cap}"] = cuda_ms(lambda cap=cap: keys.topk(cap, dim=1))
        out[f"detect_padded_{cap}"] = cuda_ms(lambda cap=cap: pp.detect_padded(preds, params, max_det=300,
                                                                                max_nms=cap))
    # the NMS kernel with and without its precomputed suppression mask (libreyolo.ops.nms_triton)
    import os

    os.environ["LIBREYOLO_NMS_MASK"] = "0"
    try:
        out["detect_padded_30000_no_mask"] = cuda_ms(lambda: pp.detect_padded(preds, params, max_det=300))
        reference = pp.detect_padded(preds, params, max_det=300)
    finally:
        del os.environ["LIBREYOLO_NMS_MASK"]
    masked = pp.detect_padded(preds, params, max_det=300)
    out["mask_same_result"] = all(torch.equal(a, b) for a, b in zip(reference, masked, strict=True))
    return out


def variants(model, frames, half: bool, conf: float, n: int) -> dict:
    """Graphed predict (wall ms, median) with the NMS mask on/off and candidate selection by sort/topk.

    Every variant is captured afresh; ``same`` says whether its detections equal the first's."""
    import os

    from libreyolo.ops import postprocess as pp

    kw = {"conf": conf, "half": half, "batch": len(frames), "cuda_graph": True}
    out: dict = {}
    first = None
    sort_below = pp.SORT_BELOW
    for name, mask, sort in (("mask+sort", "", sort_below), ("nomask+sort", "0", sort_below),
                             ("mask+topk", "", 0), ("nomask+topk", "0", 0)):
        os.environ["LIBREYOLO_NMS_MASK"] = mask
        pp.SORT_BELOW = sort
        try:
            model.release_graphs()
            for _ in range(5):
                model(frames, **kw)
            times = []
            for _ in range(n):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                res = model(frames, **kw)
                times.append((time.perf_counter() - t0) * 1e3)
            boxes = [r.boxes.data.cpu() for r in (res if isinstance(res, list) else [res])]
            first = boxes if first is None else first
            out[name] = round(statistics.median(times), 3)
            out[name + " same"] = all(torch.equal(a, b) for a, b in zip(first, boxes, strict=True))
        finally:
            os.environ.pop("LIBREYOLO_NMS_MASK", None)
            pp.SORT_BELOW = sort_below
    model.release_graphs()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared")
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import tempfile

    from serving_bench import frame, prepare_weights

    from libreyolo import LibreYOLO

    work = Path(tempfile.mkdtemp())
    files = prepare_weights(work, args.shared)
    record: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "command": " ".join(sys.argv), "host": {}, "select": {}, "device_tables": {}, "variants": {}}
    for workload in ("sparse", "dense"):
        model = LibreYOLO(files[workload], device="cuda")
        for half in (False, True):
            for b in (1, 32):
                frames = [frame() for _ in range(b)]
                key = f"{workload} {'fp16' if half else 'fp32'} b{b}"
                record["host"][key] = host_stages(model, frames, half, 0.25, args.n if b == 1 else args.n // 3)
                print("host", key, record["host"][key], flush=True)
        for half, b in ((False, 1), (True, 1), (True, 32)):
            frames = [frame() for _ in range(b)]
            key = f"{workload} {'fp16' if half else 'fp32'} b{b}"
            record["variants"][key] = variants(model, frames, half, 0.25, args.n if b == 1 else args.n // 3)
            print("variants", key, record["variants"][key], flush=True)
        for b in (1, 32):
            frames = [frame() for _ in range(b)]
            key = f"{workload} b{b}"
            record["select"][key] = selection(model, frames, 0.25)
            print("select", key, record["select"][key], flush=True)
        record["device_tables"][workload] = device_profile(model, [frame()], False, 0.25)
        print(f"--- detect_padded kernels, {workload} b1 fp32\n" + record["device_tables"][workload], flush=True)
        model.release_graphs()
    if args.json:
        args.json.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
