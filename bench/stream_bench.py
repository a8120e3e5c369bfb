"""Streaming throughput of predict(): many frames end to end, the plain path against the pipeline.

    PYTHONPATH=. python3 bench/stream_bench.py --json bench/results/<date>-stream-h200.json
    PYTHONPATH=. python3 bench/stream_bench.py --quick          # a smoke run on the CPU

YOLOv9-t (untrained, 80 classes; the usual class-bias prior, so few boxes pass ``conf``), batch 32,
fp16 on CUDA (fp32 on the CPU), ``predict(..., stream=True)`` consumed to the end, from two
sources:

- ``arrays``: ``--n`` host uint8 HWC frames (480x640 BGR) in a list, as a video decoder gives;
- ``jpeg``: the same frames written as JPEG files (quality 90) to a folder on disk;
- ``jpeg-cuda``: that folder with ``decode="cuda"`` (the files read on the workers, decoded by nvJPEG on
  the GPU a batch at a time), with the decoders' agreement (nvJPEG against Pillow, and each against the
  frames before compression) on the first batch's files.

Each source is run with ``workers=0`` (the plain path: one batch decoded when it comes, in the
calling thread, uploaded through pinned staging (per-image pageable uploads before 2026-12-04),
read back before the next batch is enqueued) and with each ``--workers`` value (decode threads, pinned
staging, side-stream upload, deferred read-back; :mod:`libreyolo.engine.stream`), eager and
with ``cuda_graph=True``. Reported: images/s (median of ``--repeats`` full passes after a
warm-up pass), and the graphed network forward alone at the same batch for reference (the
ceiling the pipeline approaches). ``--compile true`` runs it all with the compiled network in the
graphs. ``--compute-stream side`` also runs every row with a CUDA stream of its own current instead of
the legacy default stream (a library call that synchronises with the legacy stream, e.g. a synchronous
copy inside a decoder, then does not wait for the forward); with ``jpeg-cuda``, the reading and the
nvJPEG decoding of the files are also timed alone (``decode_alone``). ``--peer-python`` also times the
reference 1.6.0 (a child process of that interpreter, the same weights saved as a checkpoint) on the first
``--peer-frames`` frames of each source, as its users would run it: ``model(list of batch frames or
file paths, half=True)``, eager and with ``cuda_graph=True``. Prints a table and writes JSON (device,
torch, command).
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def frames(n: int, h: int, w: int) -> list[np.ndarray]:
    """``n`` distinct frames (a moving gradient plus noise: compresses like a photo, not like noise)."""
    rng = np.random.RandomState(0)
    yy, xx = np.mgrid[0:h, 0:w]
    out = []
    for i in range(n):
        base = ((xx + 3 * i) % 256 + (yy // 2)) % 256
        img = np.stack([base, (base + 85) % 256, (base + 170) % 256], -1).astype(np.int16)
        img += rng.randint(-12, 13, size=img.shape, dtype=np.int16)
        out.append(np.clip(img, 0, 255).astype(np.uint8))
    return out


def write_jpegs(images: list[np.ndarray], folder: Path) -> Path:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for i, img in enumerate(images):
        Image.fromarray(img[:, :, ::-1]).save(folder / f"f{i:05d}.jpg", quality=90)
    return folder


def sparse_model(device: str, imgsz: int):
    """YOLOv9-t with the detection prior of an untrained detector (scores ~1e-3: little NMS work)."""
    from libreyolo import LibreYOLO

    model = LibreYOLO("LibreYOLO9t.yaml", device=device)
    with torch.no_grad():
        for seq, stride in zip(model.net.head.cv3, (8, 16, 32), strict=True):
            seq[-1].bias.fill_(math.log(5 / model.nc / (imgsz / stride) ** 2))
    return model


def run_pass(model, source, kw: dict, cuda: bool, stream: Any = None) -> tuple[float, int]:
    """Seconds to consume ``predict(source, stream=True)`` completely, and the images seen; with
    ``stream``, the calls run with that CUDA stream current (not the legacy default stream)."""
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    n = 0
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        for r in model.predict(source, stream=True, **kw):
            n += 1
            del r
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0, n


def forward_rate(model, batch: int, imgsz: int, half: bool, graph: bool, repeats: int) -> float | None:
    """Images/s of the network forward alone (graph replay or eager) on a device-resident batch."""
    if model.device.type != "cuda":
        return None
    x = torch.rand(batch, 3, imgsz, imgsz, device=model.device).to(torch.float16 if half else torch.float32)
    for _ in range(3):
        model._forward(x, cuda_graph=graph)
    torch.cuda.synchronize()
    times = []
    for _ in range(max(5, repeats * 5)):
        t0 = time.perf_counter()
        for _ in range(10):
            model._forward(x, cuda_graph=graph)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / 10)
    return round(batch / statistics.median(times), 1)


def decode_rate(files: list[Path], batch: int, device: torch.device, repeats: int) -> dict:
    """Images/s of ``decode="cuda"``'s two steps alone, batch by batch: reading the files (header
    checks included) on this thread, and nvJPEG decoding a batch already read."""
    from libreyolo.data.device_decode import decode_on_device, read_for_device

    chunks = [files[i:i + batch] for i in range(0, len(files), batch)]
    read_s, decode_s = [], []
    for _ in range(repeats + 1):  # the first pass warms nvJPEG up
        t0 = time.perf_counter()
        items = [[read_for_device(f) for f in c] for c in chunks]
        t1 = time.perf_counter()
        for it in items:
            decode_on_device(it, device)
        torch.cuda.synchronize()
        read_s.append(t1 - t0)
        decode_s.append(time.perf_counter() - t1)
    return {"read_images_per_s": round(len(files) / statistics.median(read_s[1:]), 1),
            "decode_images_per_s": round(len(files) / statistics.median(decode_s[1:]), 1)}


def decode_agreement(files: list[Path], images: list[np.ndarray], device: torch.device) -> dict:
    """nvJPEG's pixels against Pillow's for ``files`` (mean and max absolute difference, share of equal
    values), next to each decoder's distance from the frames before compression (the codec's own error)."""
    from libreyolo.data.device_decode import decode_on_device, read_for_device
    from libreyolo.data.sources import read_image_file

    gpu = [img.pixels.permute(1, 2, 0).cpu().numpy().astype(np.int16)
           for img in decode_on_device([read_for_device(f) for f in files], device)]
    pil = [read_image_file(f).astype(np.int16) for f in files]
    src = [img[:, :, ::-1].astype(np.int16) for img in images[:len(files)]]  # the frames are BGR

    def diff(a: list[np.ndarray], b: list[np.ndarray]) -> dict:
        d = np.concatenate([np.abs(x - y).ravel() for x, y in zip(a, b, strict=True)])
        return {"mean_abs": round(float(d.mean()), 4), "max_abs": int(d.max()),
                "equal_share": round(float((d == 0).mean()), 4)}

    return {"files": len(files), "nvjpeg_vs_pillow": diff(gpu, pil), "pillow_vs_source": diff(pil, src),
            "nvjpeg_vs_source": diff(gpu, src)}


PEER = r'''
import json, statistics, sys, time, numpy as np, torch, libreyolo
cfg = json.loads(sys.argv[1])
m = libreyolo.LibreYOLO(cfg["weights"], device=cfg["device"])
sync = torch.cuda.synchronize if cfg["device"] == "cuda" else (lambda: None)
arrays = list(np.load(cfg["arrays"]))
files = sorted(str(p) for p in __import__("pathlib").Path(cfg["jpeg"]).iterdir())[:len(arrays)] if cfg["jpeg"] else []
out = {"version": libreyolo.__version__, "rows": []}
for name, items in (("arrays", arrays), ("jpeg", files)):
    if not items:
        continue
    chunks = [items[i:i + cfg["batch"]] for i in range(0, len(items), cfg["batch"])]
    for graph in (False, True) if cfg["device"].startswith("cuda") else (False,):
        row = {"source": name, "cuda_graph": graph, "frames": len(items)}
        try:
            times = []
            for rep in range(cfg["repeats"] + 1):  # the first pass warms up (captures, allocations)
                sync(); t = time.perf_counter()
                for c in chunks:
                    m(c, conf=cfg["conf"], half=cfg["half"], **({"cuda_graph": True} if graph else {}))
                sync()
                if rep:
                    times.append(time.perf_counter() - t)
            row["images_per_s"] = round(len(items) / statistics.median(times), 1)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        out["rows"].append(row)
        print("peer " + json.dumps(row), file=sys.stderr, flush=True)
print("PEER_JSON " + json.dumps(out))
'''


def bench_peer(args: argparse.Namespace, model, images: list[np.ndarray], folder: Path | None, tmp: Path) -> dict:
    """The reference's images/s on the first ``--peer-frames`` frames of each source (its own process)."""
    import subprocess

    weights = args.model and str(Path(args.model).resolve()) or str(model.save(tmp / "weights.pt"))
    arrays = tmp / "frames.npy"
    np.save(arrays, np.stack(images[:args.peer_frames]))
    cfg = {"weights": weights, "arrays": str(arrays), "batch": args.batch, "conf": args.conf,
           "device": str(model.device), "half": model.device.type == "cuda", "repeats": args.repeats,
           "jpeg": str(folder) if folder and "jpeg" in args.sources else None}
    proc = subprocess.run([args.peer_python, "-c", PEER, json.dumps(cfg)], capture_output=True, text=True,
                          cwd=tmp)  # outside the checkout: its libreyolo, not ours
    sys.stdout.write("".join(ln + "\n" for ln in proc.stderr.splitlines() if ln.startswith("peer ")))
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("PEER_JSON ")]
    if not line:
        return {"error": f"reference run failed (rc {proc.returncode}): {proc.stderr[-2000:]}"}
    return json.loads(line[-1][len("PEER_JSON "):])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write results here")
    ap.add_argument("--n", type=int, default=1024, help="frames per pass")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--workers", type=int, nargs="+", default=[4, 8], help="pipeline decode threads to try")
    ap.add_argument("--repeats", type=int, default=3, help="timed passes per row (median)")
    ap.add_argument("--sources", nargs="+", default=["arrays", "jpeg", "jpeg-cuda"],
                    choices=["arrays", "jpeg", "jpeg-cuda"])
    ap.add_argument("--graphs", nargs="+", default=["false", "true"], choices=["false", "true"])
    ap.add_argument("--conf", type=float, default=0.25)
    ap.add_argument("--compile", default=None,
                    help="model.compile(MODE) ('true' for the default): the graphs hold the compiled network; "
                         "Inductor's compile workers are ended after each row's warm-up pass")
    ap.add_argument("--model", default=None, help="a checkpoint instead of the sparse YOLOv9-t (e.g. the dense one)")
    ap.add_argument("--compute-stream", nargs="+", default=["default"], choices=["default", "side"],
                    help="run predict() with the legacy default stream current, or a stream of its own")
    ap.add_argument("--peer-python", help="interpreter with the reference libreyolo 1.6.0 importable (CUDA only)")
    ap.add_argument("--peer-frames", type=int, default=256, help="frames per pass for the reference")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 12 small frames, batch 4, imgsz 64")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.batch, args.imgsz, args.repeats, args.workers = 12, 4, 64, 1, [2]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = device == "cuda"
    half = cuda
    graphs = [g == "true" for g in args.graphs] if cuda else [False]
    h, w = (480, 640) if not args.quick else (60, 80)
    env = {"device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
           "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
           "cpus": __import__("os").cpu_count(), "command": " ".join(["python3", *sys.argv]),
           "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "json"}}
    if args.model:
        from libreyolo import LibreYOLO

        model = LibreYOLO(args.model, device=device)
    else:
        model = sparse_model(device, args.imgsz)
    if args.compile:
        model.compile(True if args.compile == "true" else args.compile)
    images = frames(args.n, h, w)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        jpeg = any(name.startswith("jpeg") for name in args.sources)
        folder = write_jpegs(images, Path(tmp) / "jpeg") if jpeg else None
        sources = [name for name in args.sources if cuda or name != "jpeg-cuda"]
        if "jpeg-cuda" in sources:
            env["decode_agreement"] = decode_agreement(sorted(folder.iterdir())[:args.batch], images, model.device)
            print("decode agreement " + json.dumps(env["decode_agreement"]), flush=True)
            env["decode_alone"] = decode_rate(sorted(folder.iterdir()), args.batch, model.device, args.repeats)
            print("decode alone " + json.dumps(env["decode_alone"]), flush=True)
        for source_name in sources:
            source = images if source_name == "arrays" else str(folder)
            for graph, on, workers in itertools.product(graphs, args.compute_stream if cuda else ["default"],
                                                        [0, *args.workers]):
                    stream = torch.cuda.Stream() if on == "side" else None
                    kw = {"imgsz": args.imgsz, "batch": args.batch, "half": half, "conf": args.conf,
                          "cuda_graph": graph, "workers": workers,
                          "decode": "cuda" if source_name == "jpeg-cuda" else "cpu"}
                    run_pass(model, source, kw, cuda, stream)  # warm-up: captures, copies, staging buffers
                    if args.compile:  # (compiled in the warm-up; its worker pool slows the host while it lives)
                        from libreyolo.engine.compiled import end_compile_workers

                        end_compile_workers()
                    times = []
                    for _ in range(args.repeats):
                        seconds, seen = run_pass(model, source, kw, cuda, stream)
                        assert seen == args.n, (seen, args.n)
                        times.append(seconds)
                    med = statistics.median(times)
                    row = {"source": source_name, "cuda_graph": graph, "workers": workers, "compute_stream": on,
                           "path": "plain" if workers == 0 else "pipeline", "images_per_s": round(args.n / med, 1),
                           "ms_per_batch": round(med / math.ceil(args.n / args.batch) * 1e3, 3),
                           "passes_s": [round(t, 4) for t in times]}
                    if cuda and workers:
                        pool = model._staging_pool()
                        row["staging"] = {"allocations": pool.allocations, "bytes": pool.nbytes}
                    rows.append(row)
                    print("row " + json.dumps(row), flush=True)
        if args.peer_python:
            env["peer"] = bench_peer(args, model, images, folder, Path(tmp))
    forward = {f"graph={g}": forward_rate(model, args.batch, args.imgsz, half, g, args.repeats) for g in graphs}
    result = {**env, "precision": "fp16" if half else "fp32", "rows": rows, "forward_images_per_s": forward}
    if args.compile:
        result["compile_info"] = model.compile_info()
    plain = {(r["source"], r["cuda_graph"], r["compute_stream"]): r["images_per_s"] for r in rows if r["workers"] == 0}
    print(f"\n{args.model or 'YOLOv9-t (sparse)'} b{args.batch} {result['precision']} imgsz {args.imgsz}, "
          f"{args.n} frames of {w}x{h}, "
          f"stream=True ({env['device']}, torch {env['torch']})")
    print(f"{'source':>9} | {'graph':>5} | {'stream':>7} | {'workers':>7} | {'path':>8} | {'images/s':>9} | "
          f"{'x plain':>7}")
    for r in rows:
        base = plain[(r["source"], r["cuda_graph"], r["compute_stream"])]
        print(f"{r['source']:>9} | {r['cuda_graph']!s:>5} | {r['compute_stream']:>7} | {r['workers']:>7} | "
              f"{r['path']:>8} | {r['images_per_s']:>9} | {round(r['images_per_s'] / base, 2) if base else '-':>7}")
    print("network forward alone (images/s):", forward)
    for r in env.get("peer", {}).get("rows", []):
        print(f"reference {r['source']} cuda_graph={r['cuda_graph']} ({r['frames']} frames): "
              f"{r.get('images_per_s', r.get('error'))} images/s")
    if env.get("peer", {}).get("error"):
        print("reference:", env["peer"]["error"])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
