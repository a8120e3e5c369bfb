"""Serving benchmark: YOLOv9-t on three workloads, every batch, precision and mode, against the reference.

    PYTHONPATH=. python3 bench/serving_bench.py --peer-python /path/to/ref/python \\
        --json bench/results/<date>-serving-h200.json

Workloads (YOLOv9-t at 640; each is one checkpoint file that both libraries load):

- ``sparse``: untrained weights with the usual class-bias prior (scores ~1e-3, as detectors are
  initialised for training): no box passes ``conf`` 0.25; the pipeline cost with nothing to keep;
- ``dense``: ``../shared/bench/dense-yolo9t.pt``, where every anchor scores above any ``conf``:
  the candidate cap and NMS at their worst;
- ``spread``: the compatibility fixture's reference-written yolo9-t checkpoint
  (``../shared/compat/checkpoints/yolo9-t-seed0.pt``), whose scores are spread out, at ``conf``
  0.25 (``spread``) and 0.001 (``spread-0.001``, the usual mAP setting).

Each is run at batch 1, 8 and 32, in fp32 and fp16, through our eager ``predict()``, our
graphed ``predict(cuda_graph=True)`` and our AOTInductor artifact (``format=aoti``, dynamic
batch, exported and validated here, one per weights and precision), and through the reference's
eager and graphed ``predict()`` in a child process of ``--peer-python`` (its own interpreter,
so the two packages never share a process). Also measured: our graphed network forward alone,
the postprocessing alone (the family's ``postprocess`` on the network's outputs, per image),
and, for the families rows, yolo9-s, yolox-s, vit-s (224), rtdetr-r18/r34 and dfine-n/s at each of
``--family-batches`` and ``--family-precisions`` (batch 1 fp32 by default; untrained weights, the same
file on both sides), with the graphed network forward alone next to each graphed predict.

Each figure is the median of ``--n`` calls (fewer for large batches) after a warm-up, timed on
the host around a device synchronisation: what a caller waits for. The Targets of the serving
issue are evaluated at the end (``targets``): each with our figure, the reference's, the goal
and whether it is met. On a machine without CUDA the graph and aoti modes are skipped (the
script still runs, for checking it).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORKLOADS = {  # name: (weights key, conf)
    "sparse": ("sparse", 0.25),
    "dense": ("dense", 0.25),
    "spread": ("spread", 0.25),
    "spread-0.001": ("spread", 0.001),
}
FAMILIES = (("yolo9-s", "LibreYOLO9s.pt", 640), ("yolox-s", "LibreYOLOXs.pt", 640), ("vit-s", "LibreViTs-cls.pt", 224),
            ("rtdetr-r18", "LibreRTDETRr18.pt", 640), ("rtdetr-r34", "LibreRTDETRr34.pt", 640),
            ("dfine-n", "LibreDFINEn.pt", 640), ("dfine-s", "LibreDFINEs.pt", 640))


def frame(h: int = 480, w: int = 640) -> np.ndarray:
    return (np.random.RandomState(0).rand(h, w, 3) * 255).astype(np.uint8)


def timed(fn: Callable[[], object], n: int, warmup: int, cuda: bool) -> float:
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times) * 1e3, 3)


def counts(n: int, warmup: int, batch: int) -> tuple[int, int]:
    scale = 1 if batch == 1 else (3 if batch <= 8 else 8)
    return max(5, n // scale), max(2, warmup // scale)


def n_det(results) -> int:
    results = results if isinstance(results, list) else [results]
    return sum(len(r) for r in results)


# --- the weights --------------------------------------------------------------------------------
def prepare_weights(work: Path, shared: Path, families: list[str] = ()) -> dict[str, str]:
    """Checkpoint files for every workload and family row (our untrained builds, saved in the
    reference's checkpoint format, which both libraries load)."""
    from libreyolo import LibreYOLO

    files = {"dense": str(shared / "bench" / "dense-yolo9t.pt"),
             "spread": str(shared / "compat" / "checkpoints" / "yolo9-t-seed0.pt")}
    for key in ("dense", "spread"):
        if not Path(files[key]).is_file():
            raise SystemExit(f"workload file missing: {files[key]} (pass --shared, the folder holding bench/ and "
                             "compat/checkpoints/)")
    sparse = LibreYOLO("LibreYOLO9t.yaml")
    head = sparse.net.head
    with torch.no_grad():
        for seq, stride in zip(head.cv3, (8, 16, 32), strict=True):
            seq[-1].bias.fill_(math.log(5 / sparse.nc / (640 / stride) ** 2))
    files["sparse"] = sparse.save(work / "LibreYOLO9t-sparse.pt")
    for name, file, _ in FAMILIES:
        if name in families:
            files[name] = LibreYOLO(file.replace(".pt", ".yaml")).save(work / file)
    return files


def export_aoti(path: str, half: bool, out: Path) -> dict:
    """One dynamic-batch CUDA package of ``path`` (run in a child process: compiles in parallel)."""
    from libreyolo import LibreYOLO

    t0 = time.perf_counter()
    report = LibreYOLO(path, device="cuda").export(format="aoti", device="cuda", half=half, dynamic=True,
                                                    output=out, verbose=False)
    return {"path": str(report.path), "validation": report.validation.status,
            "export_s": round(time.perf_counter() - t0, 1)}


def export_all(files: dict[str, str], precisions: list[str], work: Path,
               keys: list[str]) -> dict[tuple[str, str], dict]:
    jobs = {(key, p): (files[key], p == "fp16", work / f"{key}-{p}.pt2") for key in keys for p in precisions}
    done = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        futures = {pool.submit(_export_child, *args): job for job, args in jobs.items()}
        for fut in concurrent.futures.as_completed(futures):
            done[futures[fut]] = fut.result()
            print(f"aoti {futures[fut]}: {done[futures[fut]]}", flush=True)
    return done


def _export_child(path: str, half: bool, out: Path) -> dict:
    cmd = [sys.executable, __file__, "--export-one", path, str(out), "--half" if half else "--no-half"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("EXPORT_JSON ")]
    if proc.returncode or not line:
        return {"error": (proc.stderr or proc.stdout)[-1500:]}
    return json.loads(line[-1][len("EXPORT_JSON "):])


# --- ours -----------------------------------------------------------------------------------------
def bench_ours(files: dict[str, str], packages: dict, args: argparse.Namespace, device: str) -> list[dict]:
    from libreyolo import LibreYOLO

    cuda = device == "cuda"
    rows = []
    for workload, (key, conf) in WORKLOADS.items():
        if workload not in args.workloads:
            continue
        model = LibreYOLO(files[key], device=device)
        for precision in args.precisions:
            half = precision == "fp16"
            if half and not cuda:
                continue
            pkg = packages.get((key, precision), {})
            art = LibreYOLO(pkg["path"]) if pkg.get("validation") == "passed" else None
            for batch in args.batches:
                rows.append(_ours_row(model, art, pkg, workload, conf, precision, batch, args))
                print("ours " + json.dumps({k: v for k, v in rows[-1].items() if not isinstance(v, dict)}), flush=True)
            if art is not None:
                art.release_graphs()
        model.release_graphs()
        if cuda:
            torch.cuda.empty_cache()
    return rows


def _ours_row(model, art, pkg: dict, workload: str, conf: float, precision: str, batch: int,
              args: argparse.Namespace) -> dict:
    from libreyolo.data.sources import load_sources

    cuda = model.device.type == "cuda"
    half = precision == "fp16"
    n, warm = counts(args.n, args.warmup, batch)
    src = frame() if batch == 1 else [frame()] * batch
    row: dict = {"workload": workload, "conf": conf, "precision": precision, "batch": batch}
    kw = {"conf": conf, "half": half, "batch": batch}
    row["predict_eager_ms"] = timed(lambda: model(src, **kw), n, warm, cuda)
    eager = model(src, **kw)
    row["n_det"] = n_det(eager)
    first = eager[0] if isinstance(eager, list) else eager
    row["speed_eager_ms"] = {k: round(v, 3) for k, v in first.speed.items()}
    if cuda:
        row["predict_graph_ms"] = timed(lambda: model(src, **kw, cuda_graph=True), n, warm, cuda)
        graphed = model(src, **kw, cuda_graph=True)
        row["n_det_graph"] = n_det(graphed)
        graphed = graphed[0] if isinstance(graphed, list) else graphed
        row["speed_graph_ms"] = {k: round(v, 3) for k, v in graphed.speed.items()}
        x = torch.rand(batch, 3, 640, 640, device=model.device).to(torch.float16 if half else torch.float32)
        row["forward_graph_ms"] = timed(lambda: model._forward(x, cuda_graph=True), n, warm, cuda)
        row["graph_info"] = {k: v for k, v in model.graph_info().items() if isinstance(v, (int, float, str, bool))}
    if art is not None:
        akw = {"conf": conf, "batch": batch}
        row["predict_aoti_ms"] = timed(lambda: art(src, **akw), n, warm, cuda)
        row["n_det_aoti"] = n_det(art(src, **akw))
        if cuda:  # the compiled forward and the postprocessing replayed as one CUDA graph
            row["predict_aoti_graph_ms"] = timed(lambda: art(src, **akw, cuda_graph=True), n, warm, cuda)
            row["n_det_aoti_graph"] = n_det(art(src, **akw, cuda_graph=True))
            row["aoti_graph_info"] = {k: v for k, v in art.graph_info().items()
                                      if isinstance(v, (int, float, str, bool))}
    elif pkg:
        row["aoti_error"] = pkg.get("error", f"validation {pkg.get('validation')}")[-300:]
    # the postprocessing alone, on this batch's network outputs (per image)
    img = load_sources(src if batch == 1 else src[0])[0]
    xb, metas = model.family.letterbox(640)([img.to_device(model.device)] * batch,
                                            dtype=torch.float16 if half else torch.float32)
    outs = model._forward(xb)
    post = lambda: model.family.postprocess(outs, metas, conf=conf, iou=0.45, max_det=300, classes=None)  # noqa: E731
    row["postprocess_ms_per_image"] = round(timed(post, n, warm, cuda) / batch, 3)
    return row


def bench_ours_families(files: dict[str, str], args: argparse.Namespace, device: str) -> list[dict]:
    from libreyolo import LibreYOLO

    cuda = device == "cuda"
    rows = []
    for name, _, imgsz in FAMILIES:
        if name not in args.families:
            continue
        model = LibreYOLO(files[name], device=device)
        for precision in args.family_precisions:
            if precision == "fp16" and not cuda:
                continue
            for batch in args.family_batches:
                try:
                    rows.append(_family_row(model, name, imgsz, precision, batch, args, cuda))
                except Exception as exc:  # noqa: BLE001 - one failing row is reported, the run goes on
                    rows.append({"family": name, "imgsz": imgsz, "precision": precision, "batch": batch,
                                 "error": f"{type(exc).__name__}: {exc}"[:300]})
                print("ours " + json.dumps(rows[-1]), flush=True)
        model.release_graphs()
        del model
        if cuda:
            torch.cuda.empty_cache()
    return rows


def _family_row(model, name: str, imgsz: int, precision: str, batch: int, args: argparse.Namespace,
                cuda: bool) -> dict:
    half = precision == "fp16"
    n, warm = counts(args.n, args.warmup, batch)
    src = frame() if batch == 1 else [frame()] * batch
    kw = {"conf": 0.25, "half": half, "batch": batch}
    row: dict = {"family": name, "imgsz": imgsz, "precision": precision, "batch": batch}
    row["predict_eager_ms"] = timed(lambda: model(src, **kw), n, warm, cuda)
    if cuda:
        row["predict_graph_ms"] = timed(lambda: model(src, **kw, cuda_graph=True), n, warm, cuda)
        first = model(src, **kw, cuda_graph=True)
        first = first[0] if isinstance(first, list) else first
        row["speed_graph_ms"] = {k: round(v, 3) for k, v in first.speed.items()}
        row["graph_supported"] = bool(model.graph_info().get("supported"))
        x = torch.rand(batch, 3, imgsz, imgsz, device=model.device).to(torch.float16 if half else torch.float32)
        try:  # the network alone, replayed (the floor under the graphed predict)
            row["forward_graph_ms"] = timed(lambda: model._forward(x, cuda_graph=True), n, warm, cuda)
        except Exception as exc:  # noqa: BLE001 - reported in the row, the run goes on
            row["forward_graph_error"] = f"{type(exc).__name__}: {exc}"[:300]
    model.release_graphs()
    return row


# --- the reference (child process of its own interpreter) ---------------------------------------
PEER = r'''
import json, statistics, sys, time, numpy as np, torch, libreyolo
cfg = json.loads(sys.argv[1])
cuda = cfg["device"] == "cuda"
sync = torch.cuda.synchronize if cuda else (lambda: None)
def frame():
    return (np.random.RandomState(0).rand(480, 640, 3) * 255).astype(np.uint8)
def timed(fn, n, warm):
    for _ in range(warm):
        fn()
    sync(); times = []
    for _ in range(n):
        t = time.perf_counter(); fn(); sync(); times.append(time.perf_counter() - t)
    return round(statistics.median(times) * 1e3, 3)
def counts(batch):
    scale = 1 if batch == 1 else (3 if batch <= 8 else 8)
    return max(5, cfg["n"] // scale), max(2, cfg["warmup"] // scale)
def ndet(r):
    r = r if isinstance(r, list) else [r]
    return sum(len(x) if x.boxes is not None else 0 for x in r) if hasattr(r[0], "boxes") else None
def measure(m, src, kw, n, warm, row, key):
    try:
        row[key] = timed(lambda: m(src, **kw), n, warm)
    except Exception as exc:
        msg = str(exc).splitlines()[0] if str(exc) else ""
        row[key.replace("_ms", "_error")] = f"{type(exc).__name__}: {msg}"[:300]
out = {"workloads": [], "families": [], "version": libreyolo.__version__, "file": libreyolo.__file__}
for wl in cfg["workloads"]:
    m = libreyolo.LibreYOLO(wl["path"], device=cfg["device"])
    for precision in cfg["precisions"]:
        half = precision == "fp16"
        for batch in cfg["batches"]:
            n, warm = counts(batch)
            src = frame() if batch == 1 else [frame()] * batch
            kw = {"conf": wl["conf"], **({"half": True} if half else {})}
            row = {"workload": wl["name"], "precision": precision, "batch": batch}
            measure(m, src, kw, n, warm, row, "predict_eager_ms")
            try:
                row["n_det"] = ndet(m(src, **kw))
            except Exception:
                pass
            if cuda:
                measure(m, src, {**kw, "cuda_graph": True}, n, warm, row, "predict_graph_ms")
            out["workloads"].append(row)
            print("peer " + json.dumps(row), file=sys.stderr, flush=True)
    del m
for fam in cfg["families"]:
    m = libreyolo.LibreYOLO(fam["path"], device=cfg["device"])
    for precision in cfg["family_precisions"]:
        kw = {"conf": 0.25, **({"half": True} if precision == "fp16" else {})}
        for batch in cfg["family_batches"]:
            n, warm = counts(batch)
            src = frame() if batch == 1 else [frame()] * batch
            row = {"family": fam["name"], "precision": precision, "batch": batch}
            measure(m, src, kw, n, warm, row, "predict_eager_ms")
            if cuda:
                measure(m, src, {**kw, "cuda_graph": True}, n, warm, row, "predict_graph_ms")
            out["families"].append(row)
            print("peer " + json.dumps(row), file=sys.stderr, flush=True)
    del m
    if cuda:
        torch.cuda.empty_cache()
print("PEER_JSON " + json.dumps(out))
'''


def bench_peer(files: dict[str, str], args: argparse.Namespace, device: str) -> dict:
    cfg = {"device": device, "n": args.n, "warmup": args.warmup, "batches": args.batches,
           "precisions": [p for p in args.precisions if device == "cuda" or p == "fp32"],
           "workloads": [{"name": w, "path": files[k], "conf": c} for w, (k, c) in WORKLOADS.items()
                         if w in args.workloads],
           "families": [{"name": name, "path": files[name]} for name, _, _ in FAMILIES
                        if name in args.families and not args.no_families],
           "family_batches": args.family_batches,
           "family_precisions": [p for p in args.family_precisions if device == "cuda" or p == "fp32"]}
    with tempfile.TemporaryDirectory() as tmp:  # outside the checkout: its libreyolo, not ours
        proc = subprocess.run([args.peer_python, "-c", PEER, json.dumps(cfg)], capture_output=True, text=True,
                              cwd=tmp)
    sys.stdout.write("".join(ln + "\n" for ln in proc.stderr.splitlines() if ln.startswith("peer ")))
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("PEER_JSON ")]
    if not line:
        return {"error": f"reference run failed (rc {proc.returncode}): {proc.stderr[-2000:]}"}
    return json.loads(line[-1][len("PEER_JSON "):])


# --- the report -----------------------------------------------------------------------------------
def _ratio(a, b):
    return round(a / b, 3) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0 else None


def table(ours: list[dict], peer: dict) -> str:
    index = {(r["workload"], r["precision"], r["batch"]): r for r in peer.get("workloads", [])}
    head = ["workload", "prec", "b", "det", "eager", "graph", "aoti", "aoti graph", "fwd graph", "post/img",
            "ref eager", "ref graph", "eager x", "graph x", "aoti x"]
    lines = [" | ".join(f"{h:>10}" for h in head)]
    for r in ours:
        p = index.get((r["workload"], r["precision"], r["batch"]), {})
        cells = [r["workload"], r["precision"], r["batch"], r["n_det"], r["predict_eager_ms"],
                 r.get("predict_graph_ms", "-"), r.get("predict_aoti_ms", "-"), r.get("predict_aoti_graph_ms", "-"),
                 r.get("forward_graph_ms", "-"),
                 r["postprocess_ms_per_image"], p.get("predict_eager_ms", "-"), p.get("predict_graph_ms", "-"),
                 _ratio(r["predict_eager_ms"], p.get("predict_eager_ms")) or "-",
                 _ratio(r.get("predict_graph_ms"), p.get("predict_graph_ms")) or "-",
                 _ratio(r.get("predict_aoti_graph_ms", r.get("predict_aoti_ms")), p.get("predict_graph_ms")) or "-"]
        lines.append(" | ".join(f"{c!s:>10}" for c in cells))
    fam = {(r["family"], r.get("precision", "fp32"), r.get("batch", 1)): r for r in peer.get("families", [])}
    for r in ours_families_rows:
        p = fam.get((r["family"], r["precision"], r["batch"]), {})
        eager = r.get("predict_eager_ms", r.get("error"))
        lines.append(f"{r['family']:>10} | {r['precision']} b{r['batch']} eager {eager} graph "
                     f"{r.get('predict_graph_ms', '-')} (forward {r.get('forward_graph_ms', '-')})"
                     f" | ref eager {p.get('predict_eager_ms', p.get('predict_eager_error', '-'))} graph "
                     f"{p.get('predict_graph_ms', p.get('predict_graph_error', '-'))} | graph x "
                     f"{_ratio(r.get('predict_graph_ms'), p.get('predict_graph_ms')) or '-'}")
    return "\n".join(lines)


ours_families_rows: list[dict] = []


def targets(ours: list[dict], peer: dict, families: list[dict] | None = None) -> list[dict]:
    """The serving issue's Targets, each with our figure, the reference's, the goal and the verdict."""
    idx = {(r["workload"], r["precision"], r["batch"]): r for r in ours}
    ref = {(r["workload"], r["precision"], r["batch"]): r for r in peer.get("workloads", [])}
    out = []

    def add(name, value, goal, met, reference=None, needs_reference=False):
        known = value is not None and (reference is not None or not needs_reference)
        out.append({"target": name, "ours": value, "reference": reference, "goal": goal,
                    "met": bool(met) if known else None})

    for w in WORKLOADS:
        o, p = idx.get((w, "fp32", 1), {}), ref.get((w, "fp32", 1), {})
        g, rg = o.get("predict_graph_ms"), p.get("predict_graph_ms")
        add(f"{w}: b1 fp32 graphed predict <= 0.5x reference", g, f"<= {round(rg / 2, 3) if rg else '?'} ms",
            g is not None and rg is not None and g <= rg / 2, rg, needs_reference=True)
        e, re_ = o.get("predict_eager_ms"), p.get("predict_eager_ms")
        add(f"{w}: b1 fp32 eager predict <= 0.8x reference", e, f"<= {round(re_ * 0.8, 3) if re_ else '?'} ms",
            e is not None and re_ is not None and e <= 0.8 * re_, re_, needs_reference=True)
        for prec in ("fp32", "fp16"):
            for b in (1, 8, 32):
                r = idx.get((w, prec, b))
                if r and r.get("predict_graph_ms") and r.get("forward_graph_ms"):
                    add(f"{w}: {prec} b{b} graphed predict <= 1.25x graphed forward", r["predict_graph_ms"],
                        f"<= {round(1.25 * r['forward_graph_ms'], 3)} ms",
                        r["predict_graph_ms"] <= 1.25 * r["forward_graph_ms"])
        for b in (1, 8, 32):
            f32, f16 = idx.get((w, "fp32", b), {}), idx.get((w, "fp16", b), {})
            if f32.get("predict_graph_ms") and f16.get("predict_graph_ms"):
                add(f"{w}: b{b} graphed fp16 not slower than fp32", f16["predict_graph_ms"],
                    f"<= {f32['predict_graph_ms']} ms (fp32)", f16["predict_graph_ms"] <= f32["predict_graph_ms"])
    s = idx.get(("sparse", "fp16", 1), {})
    add("sparse: b1 fp16 graphed predict <= 3.0 ms", s.get("predict_graph_ms"), "<= 3.0 ms",
        (s.get("predict_graph_ms") or 1e9) <= 3.0)
    aoti = [idx.get(("sparse", p, 1), {}).get(k) for p in ("fp32", "fp16")
            for k in ("predict_aoti_ms", "predict_aoti_graph_ms")]
    best = min([v for v in aoti if v is not None], default=None)
    add("sparse: aoti artifact predict b1 <= 1.5 ms (best of fp32/fp16, graphed or not)", best, "<= 1.5 ms",
        (best or 1e9) <= 1.5)
    d = idx.get(("dense", "fp32", 1), {})
    add("dense: postprocessing b1 <= 1 ms per image (fp32)", d.get("postprocess_ms_per_image"), "<= 1 ms",
        (d.get("postprocess_ms_per_image") or 1e9) <= 1.0)
    for w, goal in (("sparse", 3000), ("dense", 1500)):
        r = idx.get((w, "fp16", 32), {})
        ips = round(32e3 / r["predict_graph_ms"], 1) if r.get("predict_graph_ms") else None
        p = ref.get((w, "fp16", 32), {})
        rips = round(32e3 / p["predict_graph_ms"], 1) if p.get("predict_graph_ms") else None
        add(f"{w}: b32 fp16 graphed predict >= {goal} images/s", ips, f">= {goal} images/s", (ips or 0) >= goal, rips)
    fam = {(r["family"], r.get("precision", "fp32"), r.get("batch", 1)): r for r in peer.get("families", [])}
    for r in families if families is not None else ours_families_rows:
        g = r.get("predict_graph_ms")
        rg = fam.get((r["family"], r["precision"], r["batch"]), {}).get("predict_graph_ms")
        add(f"{r['family']}: {r['precision']} b{r['batch']} graphed predict <= 0.5x reference", g,
            f"<= {round(rg / 2, 3) if rg else '?'} ms", g is not None and rg is not None and g <= rg / 2, rg,
            needs_reference=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write results here")
    ap.add_argument("--peer-python", help="interpreter with the reference libreyolo 1.6.0 importable")
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared",
                    help="the shared folder (bench/dense-yolo9t.pt, compat/checkpoints/yolo9-t-seed0.pt)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "fp16"], choices=["fp32", "fp16"])
    ap.add_argument("--n", type=int, default=40, help="timed calls per figure at batch 1 (fewer for large batches)")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--no-aoti", action="store_true", help="skip the AOTInductor packages")
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--aoti-weights", nargs="+", default=["sparse", "dense", "spread"],
                    choices=["sparse", "dense", "spread"], help="the weights an AOTInductor package is made of")
    ap.add_argument("--no-families", action="store_true", help="skip the yolo9-s/yolox/vit/rtdetr/dfine rows")
    ap.add_argument("--families", nargs="+", default=[name for name, _, _ in FAMILIES],
                    choices=[name for name, _, _ in FAMILIES], help="the families rows to run")
    ap.add_argument("--family-batches", type=int, nargs="+", default=[1])
    ap.add_argument("--family-precisions", nargs="+", default=["fp32"], choices=["fp32", "fp16"])
    ap.add_argument("--export-one", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--half", action=argparse.BooleanOptionalAction, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.export_one:
        print("EXPORT_JSON " + json.dumps(export_aoti(args.export_one[0], bool(args.half), Path(args.export_one[1]))))
        return 0
    device = "cuda" if torch.cuda.is_available() else "cpu"
    env = {"device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
           "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
           "command": " ".join(["python3", *sys.argv]), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
                      if k not in ("json", "export_one", "half")}}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        families = [] if args.no_families else args.families
        files = prepare_weights(work, args.shared.resolve(), families)  # absolute: the reference runs elsewhere
        packages = ({} if args.no_aoti or device != "cuda"
                    else export_all(files, args.precisions, work, args.aoti_weights))
        ours = bench_ours(files, packages, args, device)
        if not args.no_families:
            ours_families_rows.extend(bench_ours_families(files, args, device))
        peer = bench_peer(files, args, device) if args.peer_python else {}
    result = {**env, "aoti_packages": {f"{k}-{p}": v for (k, p), v in packages.items()}, "ours": ours,
              "ours_families": ours_families_rows, "peer": peer, "targets": targets(ours, peer)}
    print(table(ours, peer))
    if peer.get("error"):
        print("reference:", peer["error"])
    for t in result["targets"]:
        flag = {True: "met", False: "MISSED", None: "n/a"}[t["met"]]
        print(f"{flag:>6}  {t['target']}: ours {t['ours']} (goal {t['goal']}; reference {t['reference']})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
