"""Video throughput end to end: decode + predict + track + write, with the share of each stage.

    PYTHONPATH=. python bench/video_bench.py --model LibreYOLO9s.pt --half --cuda-graph --frames 600
    PYTHONPATH=. python bench/video_bench.py --model LibreYOLO9s.pt --half --cuda-graph --reference .peer
    PYTHONPATH=. python bench/video_bench.py --model LibreYOLO9t-shapes.pt --imgsz 320 --frames 40   # CPU smoke

The video is ``--video`` or one made here: 1920x1080 H.264 (libx264, crf 23, 30 fps) of moving
shapes with occlusion, entry and exit (:func:`libreyolo.track.synth.synth_sequence`). Rows:

- ``track``: ``model.track(video, tracker=..., batch=1, save=True, stream=True)`` consumed to the end
  (decode on its thread, predict, the tracker on its thread, the annotated video written);
- ``predict``: the same without the tracker (``predict(video, save=True)``);
- ``decode``: the video decoded alone (:class:`libreyolo.data.video.VideoSource`), for its share.

Per stage, milliseconds a frame from each Results' ``speed`` (``preprocess`` is the wall time a
frame waits on the consumer thread besides the device's work, which includes waiting for decoded
frames; ``inference`` and ``postprocess`` are device time on CUDA; ``track`` is the tracker update on
its own thread; ``write`` is drawing and encoding) and the share of the frame's wall time. Decode
and track run on threads of their own, overlapped with the network: their share is their cost,
not their addition to the frame time. A warm-up pass of ``--warmup`` frames (graph capture) comes
first. ``--reference DIR`` runs the reference libreyolo 1.6.0 (its package unpacked in DIR) in a
subprocess on the same video and weights: its video predict (``model(source=video, stream=True,
save=True, cuda_graph=...)``) and its track (``model.track(source=video, save=True)``, under
``cuda_graph_scope`` when graphed); with ``--half`` it is cast by its own ``quantize(recipe="fp16",
calib=None)`` first (its predict treats ``half=`` as a no-op). The table gets a ratio column. Writes
JSON to ``bench/results/`` (device, torch, command) unless ``--json`` says where.
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STAGES = ("preprocess", "inference", "postprocess", "track", "write")


def make_video(path: Path, frames: int, width: int = 1920, height: int = 1080, fps: int = 30) -> Path:
    import av

    from libreyolo.track.synth import synth_sequence

    images, _ = synth_sequence(frames, width=width, height=height, n_objects=8, size=height // 8,
                               speed=width / 120, seed=0)
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=fps, options={"crf": "23", "preset": "veryfast"})
        s.width, s.height, s.pix_fmt = width, height, "yuv420p"
        for img in images:
            for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


def sync(model: Any) -> None:
    import torch

    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)


def timed_run(model: Any, video: Path, *, track: bool, args: argparse.Namespace, out: Path) -> dict:
    """One pass over the video: frames/s and each stage's ms a frame and share of the frame time."""
    kw = dict(imgsz=args.imgsz, half=args.half, cuda_graph=args.cuda_graph, batch=1, stream=True, save=True,
              save_dir=str(out), **({} if args.conf is None else {"conf": args.conf}))
    run = (lambda **k: model.track(str(video), tracker=args.tracker, **k)) if track else \
        (lambda **k: model.predict(str(video), **k))
    list(run(**{**kw, "end_frame": args.warmup}))  # capture graphs, allocate, start the encoder once
    sync(model)
    totals = dict.fromkeys(STAGES, 0.0)
    n = boxes = 0
    t0 = time.perf_counter()
    for r in run(**kw):
        n += 1
        boxes += len(r.boxes)
        for k in STAGES:
            totals[k] += r.speed.get(k, 0.0)
    sync(model)
    wall = time.perf_counter() - t0
    frame_ms = 1e3 * wall / n
    stages = {k: {"ms": round(v / n, 3), "share": round(v / n / frame_ms, 4)} for k, v in totals.items()
              if v or k != "track"}
    return {"row": "track" if track else "predict", "frames": n, "fps": round(n / wall, 2),
            "frame_ms": round(frame_ms, 3), "boxes_per_frame": round(boxes / n, 2), "stages": stages}


def decode_alone(video: Path) -> dict:
    from libreyolo.data.video import VideoSource

    src = VideoSource(str(video))
    t0 = time.perf_counter()
    n = sum(1 for _ in src.frames())
    wall = time.perf_counter() - t0
    return {"row": "decode", "frames": n, "fps": round(n / wall, 2), "frame_ms": round(1e3 * wall / n, 3)}


REFERENCE = r'''
import contextlib, json, sys, time, torch, libreyolo
cfg = json.loads(sys.argv[1])
m = libreyolo.LibreYOLO(cfg["weights"], device=cfg["device"])
sync = torch.cuda.synchronize if cfg["device"].startswith("cuda") else (lambda: None)
out = {"version": libreyolo.__version__, "rows": [], "half": False}
if cfg["half"]:  # its predict ignores half= (a no-op there); fp16 is its cast recipe, for predict and track alike
    try:
        m.quantize(recipe="fp16", calib=None, verbose=False)
        out["half"] = "quantize(recipe='fp16', calib=None)"
    except Exception as exc:
        out["half"] = f"not applied: {type(exc).__name__}: {exc}"[:300]

def predict(limit):
    kw = dict(source=cfg["video"], stream=True, save=True, output_path=cfg["out"] + "/ref-predict.mp4",
              imgsz=cfg["imgsz"], cuda_graph=cfg["cuda_graph"], **cfg["conf"])
    n = 0
    for r in m(**kw):
        n += 1
        if n >= limit:
            break
    return n

def track(limit):
    scope = m.cuda_graph_scope(True) if cfg["cuda_graph"] else contextlib.nullcontext()
    n = 0
    with scope:
        for r in m.track(source=cfg["video"], save=True, output_path=cfg["out"] + "/ref-track.mp4",
                         imgsz=cfg["imgsz"], tracker=cfg["tracker"], **cfg["conf"]):
            n += 1
            if n >= limit:
                break
    return n

for name, fn in (("predict", predict), ("track", track)):
    row = {"row": name}
    try:
        fn(cfg["warmup"])
        sync(); t = time.perf_counter()
        n = fn(10 ** 9)
        sync()
        wall = time.perf_counter() - t
        row.update(frames=n, fps=round(n / wall, 2), frame_ms=round(1e3 * wall / n, 3))
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    out["rows"].append(row)
print("REF_JSON " + json.dumps(out))
'''


def run_reference(args: argparse.Namespace, model: Any, video: Path, tmp: Path) -> dict:
    import os

    weights = str(Path(args.model).resolve()) if Path(args.model).is_file() else str(model.save(tmp / "weights.pt"))
    cfg = {"weights": weights, "video": str(video), "out": str(tmp), "imgsz": args.imgsz, "half": args.half,
           "cuda_graph": bool(args.cuda_graph), "device": str(model.device), "warmup": args.warmup,
           "tracker": args.tracker, "conf": {} if args.conf is None else {"conf": args.conf}}
    env = {**os.environ, "PYTHONPATH": str(Path(args.reference).resolve())}
    proc = subprocess.run([sys.executable, "-c", REFERENCE, json.dumps(cfg)], capture_output=True, text=True,
                          cwd=tmp, env=env)  # outside the checkout: its libreyolo, not ours
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("REF_JSON ")]
    if not line:
        return {"error": f"reference run failed (rc {proc.returncode}): {proc.stderr[-2000:]}"}
    return json.loads(line[-1][len("REF_JSON "):])


def table(rows: list[dict], ref: dict | None) -> str:
    ref_rows = {r["row"]: r for r in (ref or {}).get("rows", [])}
    head = f"{'row':<8}{'frames':>7}{'fps':>9}{'ms/frame':>10}" + (f"{'ref fps':>9}{'x ref':>7}" if ref else "")
    lines = [head, "-" * len(head)]
    for r in rows:
        line = f"{r['row']:<8}{r['frames']:>7}{r['fps']:>9.1f}{r['frame_ms']:>10.2f}"
        if ref:
            rr = ref_rows.get(r["row"], {})
            line += f"{rr['fps']:>9.1f}{r['fps'] / rr['fps']:>7.2f}" if "fps" in rr else f"{'-':>9}{'-':>7}"
        lines.append(line)
    for r in rows:
        if "stages" in r:
            lines.append(f"\n{r['row']}: stage     ms/frame  share of frame time")
            lines += [f"  {k:<16}{v['ms']:>8.2f}  {100 * v['share']:>6.1f}%" for k, v in r["stages"].items()]
    for name, rr in ref_rows.items():
        if "error" in rr:
            lines.append(f"reference {name}: {rr['error']}")
    if ref and "error" in ref:
        lines.append("reference: " + ref["error"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="checkpoint or artifact (e.g. LibreYOLO9s.pt)")
    ap.add_argument("--video", type=Path, help="a video to run (default: a 1080p H.264 clip made here)")
    ap.add_argument("--frames", type=int, default=300, help="frames of the made video")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--half", action="store_true", help="fp16 (CUDA)")
    ap.add_argument("--cuda-graph", action="store_true", help="replay the forward from CUDA graphs")
    ap.add_argument("--tracker", default="bytetrack")
    ap.add_argument("--conf", type=float, help="detection threshold (default: the model's); an untrained model "
                    "(a .yaml) gives the tracker few boxes unless it is low")
    ap.add_argument("--device", default=None)
    ap.add_argument("--warmup", type=int, default=10, help="frames of the warm-up pass")
    ap.add_argument("--reference", help="folder holding the unpacked reference libreyolo 1.6.0 package")
    ap.add_argument("--json", type=Path, help="where to write the JSON (default: bench/results/<date>-video-*.json)")
    args = ap.parse_args(argv)

    import torch

    from libreyolo import LibreYOLO
    from libreyolo.utils.atomic import atomic_write

    model = LibreYOLO(args.model, device=args.device)
    cuda = model.device.type == "cuda"
    with tempfile.TemporaryDirectory(prefix="video-bench-") as tmp:
        tmp = Path(tmp)
        video = args.video or make_video(tmp / "bench-1080p.mp4", args.frames)
        print(f"video ready: {video}", file=sys.stderr, flush=True)
        rows = [decode_alone(video)]
        for track in (False, True):
            print(f"done: {rows[-1]}", file=sys.stderr, flush=True)
            rows.append(timed_run(model, video, track=track, args=args, out=tmp / "out"))
        ref = run_reference(args, model, video, tmp) if args.reference else None
    result = {"command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
              "device": torch.cuda.get_device_name(model.device) if cuda else platform.processor() or "cpu",
              "torch": torch.__version__, "python": platform.python_version(), "model": args.model,
              "imgsz": args.imgsz, "conf": args.conf, "half": args.half,
              "cuda_graph": args.cuda_graph, "tracker": args.tracker,
              "video": str(args.video or f"made here: 1920x1080 H.264, {args.frames} frames"), "rows": rows,
              "reference": ref}
    print(table(rows, ref))
    dest = args.json or ROOT / "bench" / "results" / \
        f"{time.strftime('%Y-%m-%d')}-video-{'cuda' if cuda else 'cpu'}-{Path(args.model).stem}.json"
    atomic_write(dest, lambda p: p.write_text(json.dumps(result, indent=1) + "\n"))
    print(f"wrote {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
