"""Where the b32 throughput path and the DETR b1 graphed predict spend their time (finding, not reporting).

    PYTHONPATH=. python3 bench/throughput_profile.py --json bench/results/<date>-throughput-profile-h200.json

Sections (CUDA; ``--quick`` runs the host parts on the CPU as a smoke test):

- ``forward``: YOLOv9-t b32 fp16 at 640: our graphed forward (``model._forward(x, cuda_graph=True)``)
  with a contiguous and a channels-last input, the whole-pipeline graph replay, and a bare
  ``torch.cuda.CUDAGraph`` of the inference copy's module (the ceiling);
- ``host``: ``predict()`` over 256 host uint8 frames (480x640) at b32 fp16 graphed, plain path and
  streaming pipeline: images/s and the main thread's top functions by own time (cProfile);
- ``detr``: rtdetr-r34 and dfine-s at b1 fp32, graphed: predict() end to end with the whole-pipeline
  graph (top-k postprocessing captured) against the forward graph plus eager postprocessing (the
  family's ``SUPPORTS_PIPELINE_GRAPH`` switched off for the A/B), the graphed forward alone and
  host stages; the detections of both paths compared.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import platform
import pstats
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def timed(fn, n: int, warm: int = 3, cuda: bool = True) -> float:
    """Median ms of ``fn()`` over ``n`` calls, each ended by a device sync."""
    for _ in range(warm):
        fn()
    times = []
    for _ in range(n):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return round(statistics.median(times), 4)


def bare_graph(module, static: torch.Tensor):
    """A ``torch.cuda.CUDAGraph`` of ``module(static)`` after a warm-up on a side stream."""
    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                module(static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            module(static)
    return graph


def forward_section(model, batch: int, imgsz: int) -> dict:
    dev, dtype = model.device, torch.float16
    x = torch.rand(batch, 3, imgsz, imgsz, device=dev).to(dtype)
    xcl = x.contiguous(memory_format=torch.channels_last)
    out = {"graph_forward_ms": timed(lambda: model._forward(x, cuda_graph=True), 30),
           "graph_forward_cl_input_ms": timed(lambda: model._forward(xcl, cuda_graph=True), 30)}
    from libreyolo.ops.letterbox import LetterboxMeta

    metas = [LetterboxMeta((480, 640), 1.0, (0.0, 0.0))] * batch
    out["pipeline_graph_ms"] = timed(lambda: model.pipeline_forward(x, metas, True, conf=0.25, iou=0.45,
                                                                     max_det=300), 30)
    copy = model.inference_copy(dev, dtype)
    module = copy.module
    static = xcl.clone()
    g = bare_graph(module, static)
    out["bare_cudagraph_cl_ms"] = timed(g.replay, 30)
    # the same with cuDNN's autotuner choosing the convolution algorithms (a process-wide switch)
    torch.backends.cudnn.benchmark = True
    try:
        g2 = bare_graph(module, static)
        out["bare_cudagraph_cl_cudnn_benchmark_ms"] = timed(g2.replay, 30)

        def as_dict(o, name="out"):  # every tensor of a (nested) output, by path
            if isinstance(o, torch.Tensor):
                return {name: o}
            items = o.items() if isinstance(o, dict) else enumerate(o)
            return {k: v for key, sub in items for k, v in as_dict(sub, f"{name}.{key}").items()}

        with torch.inference_mode():
            tuned = {k: v.clone() for k, v in as_dict(module(static)).items()}
            torch.backends.cudnn.benchmark = False
            plain = as_dict(module(static))
        # do the autotuned algorithms change the numbers? (fp16: the largest output difference)
        out["cudnn_benchmark_max_abs_diff"] = max(float((tuned[k].float() - plain[k].float()).abs().max())
                                                  for k in plain)
    finally:
        torch.backends.cudnn.benchmark = False
    out["images_per_s"] = {k: round(batch / v * 1e3, 1) for k, v in out.items() if k.endswith("_ms")}
    return out


def host_section(model, frames: list, batch: int, half: bool, graph: bool, workers: list[int], cuda: bool) -> list:
    rows = []
    for w in workers:
        kw = {"batch": batch, "half": half, "cuda_graph": graph, "workers": w, "conf": 0.25}
        list(model.predict(frames, stream=True, **kw))  # warm-up: captures, staging
        t = []
        for _ in range(3):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _r in model.predict(frames, stream=True, **kw):
                pass
            if cuda:
                torch.cuda.synchronize()
            t.append(time.perf_counter() - t0)
        prof = cProfile.Profile()
        prof.enable()
        for _r in model.predict(frames, stream=True, **kw):
            pass
        if cuda:
            torch.cuda.synchronize()
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(22)
        row = {"workers": w, "images_per_s": round(len(frames) / statistics.median(t), 1),
               "profile": s.getvalue().split("\n", 6)[-1][:6000]}
        print(f"host workers={w}: {row['images_per_s']} images/s\n{row['profile']}", flush=True)
        rows.append(row)
    return rows


def detr_section(name: str, size: str, n: int) -> dict:
    from libreyolo import LibreYOLO
    from libreyolo.data.sources import open_sources

    model = LibreYOLO(_yaml(name, size), device="cuda")
    rng = np.random.RandomState(0)
    img = rng.randint(0, 255, (480, 640, 3), dtype=np.uint8)
    fam = type(model.family)
    out: dict = {"model": f"{model.family.name}-{size}"}
    x = torch.rand(1, 3, 640, 640, device="cuda")
    out["graph_forward_ms"] = timed(lambda: model._forward(x, cuda_graph=True), n)
    got = {}
    for label, flag in (("pipeline_graph", True), ("forward_graph_eager_post", False)):
        fam.SUPPORTS_PIPELINE_GRAPH = flag
        try:
            out[f"predict_{label}_ms"] = timed(lambda: model(img, conf=0.001, cuda_graph=True), n, warm=5)
            r = model(img, conf=0.001, cuda_graph=True)
            got[label] = (r.boxes.xyxy.cpu(), r.boxes.conf.cpu(), r.boxes.cls.cpu())
            out[f"{label}_info"] = model.graph_info()["pipeline"]
        finally:
            fam.SUPPORTS_PIPELINE_GRAPH = True
    a, b = got["pipeline_graph"], got["forward_graph_eager_post"]
    out["same_detections"] = all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    out["detections"] = int(a[1].numel())
    # host stages of the pipeline-graph call
    pre = model.family.letterbox(640)
    post = model.family.device_postprocess()
    chunk = next(iter(open_sources(img).batches(1, skip_unreadable=False)))
    stages = {k: [] for k in ("upload", "preprocess", "replay", "read")}
    for i in range(n + 5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        tensors = [im.to_device(model.device) for im in chunk]
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        batch, metas = pre(tensors)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        padded = model.pipeline_forward(batch, metas, True, conf=0.001, max_det=300)
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        post.read(padded)
        t4 = time.perf_counter()
        if i >= 5:
            for k, v in zip(stages, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                stages[k].append(v * 1e3)
    out["stages_ms"] = {k: round(statistics.median(v), 4) for k, v in stages.items()}
    print(json.dumps(out), flush=True)
    return out


def _yaml(name: str, size: str) -> str:
    return {"rtdetr": f"LibreRTDETR{size}.yaml", "dfine": f"LibreDFINE{size}.yaml"}[name]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--sections", nargs="+", default=["forward", "host", "detr"])
    ap.add_argument("--frames", type=int, default=256)
    ap.add_argument("--quick", action="store_true", help="CPU smoke: host section, 8 frames, b4, imgsz 64")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    from stream_bench import frames as make_frames
    from stream_bench import sparse_model

    result = {"device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
              "torch": torch.__version__, "command": " ".join(["python3", *sys.argv]),
              "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if args.quick or not cuda:
        model = sparse_model("cpu", 64)
        model.imgsz = 64
        result["host"] = host_section(model, make_frames(8, 60, 80), 4, False, False, [0, 2], False)
    else:
        model = sparse_model("cuda", 640)
        if "forward" in args.sections:
            result["forward"] = forward_section(model, 32, 640)
            print(json.dumps(result["forward"]), flush=True)
        if "host" in args.sections:
            result["host"] = host_section(model, make_frames(args.frames, 480, 640), 32, True, True, [0, 4], True)
        if "detr" in args.sections:
            result["detr"] = [detr_section("rtdetr", "r34", 40), detr_section("dfine", "s", 40)]
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
