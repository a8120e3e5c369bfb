"""SegFormer on CUDA: predict() eager vs cuda_graph, the bare forward, fused attention, and the reference.

    PYTHONPATH=. python3 bench/segformer_bench.py --json bench/results/<date>-segformer-h200.json
    PYTHONPATH=. python3 bench/segformer_bench.py --peer-python /tmp/peerpy --half --sizes b0 b2 ...
    PYTHONPATH=. python3 bench/segformer_bench.py --device cpu --quick --sizes b0 --imgsz 128   # smoke test

For each size (default b0 and b2; seeded untrained weights from
:func:`libreyolo.graphs.parity.seeded_model`), at the size's input (512; b5 640; ``--imgsz``
overrides) on the bundled sample image, letterboxed; a batch of 8 is the sample, mirrored,
flipped and transposed, twice:

- ``predict``: ``model.predict(images, batch=B)`` eager and with ``cuda_graph=True``, batch 1
  and 8, fp32 (``--half`` adds fp16): median ms per call and images/s, and whether the graphed
  masks equal the eager ones;
- ``forward``: the bare network, ``model._forward(x)`` against ``model.graph_forward(x, True)``
  (copy-in, replay, copy-out), and whether the graphed logits are bit-for-bit the eager ones;
- ``attention``: a copy of the network with every ``fused_attn`` flag on (SDPA) and off
  (matmul-softmax-matmul, the default), fp32 and fp16: forward ms, max abs logit difference,
  argmax agreement;
- ``peer`` (``--peer-python``): a child process of that interpreter builds the reference
  ``LibreSegformer`` of the same size from our weights (``model.save()`` writes the reference
  checkpoint format) and times its ``predict()`` eager and with ``cuda_graph=True``, batch 1 and
  8, fp32, same images; its argmax maps are compared with ours (pixel agreement).

SegFormer's ``SUPPORTS_CUDA_GRAPH`` is False until the parity matrix passes on a GPU; this
script forces it on for its own process (the JSON says so) to time the graphed path. On the CPU
(``--device cpu``, a smoke test) the graph rows run on the emulated backend: they check the code
path, not CUDA graphs, and their timings mean nothing.

Every stage is wrapped: a failure is recorded in the JSON (``errors`` and the row) and the run
goes on; stages are skipped once ``--budget-s`` is spent; the JSON is rewritten after each stage,
so a run killed by an outer ``timeout`` keeps what it measured. Each figure is the median of
``--n`` calls after ``--warmup``, host-timed around a device sync.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import platform
import shlex
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer_child import run_peer_child  # noqa: E402

FAMILY = "segformer"

PEER = r'''
import json, os, statistics, sys, time, traceback
cfg = json.load(open(sys.argv[1]))
deadline = time.time() + cfg["budget_s"]
out = {"sizes": {}}
def emit():
    print("PEER_JSON " + json.dumps(out), flush=True)
try:
    import numpy as np, torch, libreyolo
    from PIL import Image, ImageOps
    out["libreyolo"] = getattr(libreyolo, "__version__", None)
    out["torch"] = torch.__version__
    out["libreyolo_path"] = os.path.dirname(libreyolo.__file__)
except Exception as exc:
    out["error"] = f"import failed: {type(exc).__name__}: {exc}"
    emit(); sys.exit(0)
dev = cfg["device"]
cuda = dev.startswith("cuda")
def sync():
    if cuda:
        torch.cuda.synchronize()
img = ImageOps.exif_transpose(Image.open(cfg["image"])).convert("RGB")
views = [img, ImageOps.mirror(img), ImageOps.flip(img), img.transpose(Image.Transpose.TRANSPOSE)]
images = [views[i % len(views)] for i in range(max(cfg["batches"]))]
def masks_of(res):
    res = res if isinstance(res, list) else [res]
    return [np.asarray(torch.as_tensor(r.semantic_mask.data).cpu()).astype(np.int64) for r in res]
for size, spec in cfg["sizes"].items():
    row = out["sizes"].setdefault(size, {})
    try:
        m = libreyolo.LibreSegformer(spec["weights"], size=size, nb_classes=spec["nc"], device=dev)
        row["supports_cuda_graph"] = bool(getattr(m, "SUPPORTS_CUDA_GRAPH", False))
        row["input_size"] = spec["imgsz"]
    except Exception as exc:
        row["error"] = f"build failed: {type(exc).__name__}: {exc}"[:800]
        emit(); continue
    for b in cfg["batches"]:
        src = images[0] if b == 1 else images[:b]
        eager_masks = None
        for graph in (False, True):
            key = f"b{b}_{'cuda_graph' if graph else 'eager'}"
            if graph and not cuda:
                row[key] = "skipped: cuda_graph needs CUDA"; continue
            if time.time() > deadline:
                row[key] = "skipped: peer budget spent"; continue
            try:
                call = lambda: m(src, imgsz=spec["imgsz"], batch=b, cuda_graph=graph)
                got = masks_of(call())
                if not graph:
                    eager_masks = got
                    np.savez_compressed(os.path.join(cfg["mask_dir"], f"{size}_b{b}.npz"), *got)
                for _ in range(cfg["warmup"]):
                    call()
                times = []
                for _ in range(cfg["n"]):
                    sync(); t = time.perf_counter()
                    call()
                    sync(); times.append((time.perf_counter() - t) * 1e3)
                ms = statistics.median(times)
                row[key] = {"ms": ms, "images_per_s": b * 1e3 / ms}
                if graph and eager_masks is not None:
                    row[key]["masks_equal_eager"] = all(np.array_equal(a, e) for a, e in zip(got, eager_masks))
                if graph:
                    try:
                        info = m.graph_info()
                        keys = ("graph_count", "eager_fallbacks", "fallback_reason")
                        row[key]["graph_info"] = {k: info.get(k) for k in keys}
                    except Exception:
                        pass
            except Exception as exc:
                row[key] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:800]
    try:
        m.release_graphs()
    except Exception:
        pass
    del m
    if cuda:
        torch.cuda.empty_cache()
    emit()
emit()
'''


# --- helpers ---------------------------------------------------------------------------------
class Run:
    """The result dict, written after every stage; stages past the budget are skipped."""

    def __init__(self, args: argparse.Namespace, result: dict) -> None:
        self.args, self.result = args, result
        self.deadline = time.monotonic() + args.budget_s

    def save(self) -> None:
        if self.args.json:
            self.args.json.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.args.json.with_suffix(self.args.json.suffix + ".tmp")
            tmp.write_text(json.dumps(self.result, indent=1, default=str) + "\n")
            tmp.replace(self.args.json)

    def stage(self, name: str, fn, *a, **kw) -> Any:
        """``fn(*a, **kw)``, or None with the failure (or the skip) recorded."""
        if time.monotonic() > self.deadline:
            self.result["skipped"].append(f"{name}: --budget-s {self.args.budget_s} spent")
            print(f"[skip] {name}: budget spent", flush=True)
            return None
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        except Exception as exc:  # noqa: BLE001 - a failed stage is recorded, the run goes on
            msg = f"{type(exc).__name__}: {exc}"[:1000]
            self.result["errors"].append({"stage": name, "error": msg,
                                          "traceback": traceback.format_exc()[-3000:]})
            print(f"[error] {name}: {msg}", flush=True)
            return None
        finally:
            self.result.setdefault("stage_s", {})[name] = round(time.perf_counter() - t0, 2)
            self.save()


def make_sync(device: torch.device):
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def median_ms(fn, n: int, warmup: int, sync) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(n):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


@contextlib.contextmanager
def graph_support_forced(family: Any):
    """Let ``cuda_graph=True`` run for a family not yet declared graph-safe (this process only)."""
    had = "SUPPORTS_CUDA_GRAPH" in vars(family)
    old = family.SUPPORTS_CUDA_GRAPH
    family.SUPPORTS_CUDA_GRAPH = True
    try:
        yield bool(old)
    finally:
        if had:
            family.SUPPORTS_CUDA_GRAPH = old
        else:
            delattr(family, "SUPPORTS_CUDA_GRAPH")


def sample_images(n: int) -> list:
    """The sample, mirrored, flipped and transposed (different letterbox placements), repeated."""
    from PIL import Image, ImageOps

    from libreyolo.assets import SAMPLE_IMAGE

    img = ImageOps.exif_transpose(Image.open(SAMPLE_IMAGE)).convert("RGB")
    views = [img, ImageOps.mirror(img), ImageOps.flip(img), img.transpose(Image.Transpose.TRANSPOSE)]
    return [views[i % len(views)] for i in range(n)]


def masks_of(res) -> list:
    res = res if isinstance(res, list) else [res]
    return [r.semantic_mask.data.cpu() for r in res]


def logits_of(out) -> torch.Tensor:
    return out["logits"] if isinstance(out, dict) else out


def diff_stats(a: torch.Tensor, b: torch.Tensor) -> dict:
    from libreyolo.graphs.parity import bit_equal

    a, b = logits_of(a), logits_of(b)
    d = (a.double() - b.double()).abs()
    return {"bit_equal": bit_equal(a, b), "max_abs_diff": float(d.max()),
            "argmax_agreement_pct": 100.0 * float((a.argmax(1) == b.argmax(1)).double().mean()),
            "finite": bool(torch.isfinite(a).all() and torch.isfinite(b).all())}


# --- stages ----------------------------------------------------------------------------------
def bench_predict(model, images: list, imgsz: int, batches: list[int], dtypes: list[str], n: int, warmup: int,
                  sync, ours_masks: dict) -> list[dict]:
    rows = []
    for dt in dtypes:
        half = dt == "fp16"
        for b in batches:
            src = images[0] if b == 1 else images[:b]
            row = {"dtype": dt, "batch": b}
            eager_masks = None
            for mode in ("eager", "cuda_graph"):
                try:
                    def call(mode=mode, src=src, b=b, half=half):
                        return model.predict(src, imgsz=imgsz, batch=b, half=half, cuda_graph=mode == "cuda_graph")

                    got = masks_of(call())
                    if mode == "eager":
                        eager_masks = got
                        if dt == "fp32":
                            ours_masks[b] = got
                    ms = median_ms(call, n, warmup, sync)
                    row[f"{mode}_ms"] = ms
                    row[f"{mode}_images_per_s"] = b * 1e3 / ms
                    if mode == "cuda_graph" and eager_masks is not None:
                        pairs = zip(got, eager_masks, strict=True)
                        row["graph_masks_equal_eager"] = all(torch.equal(g, e) for g, e in pairs)
                except Exception as exc:  # noqa: BLE001 - one mode fails, the other is kept
                    row[f"{mode}_error"] = f"{type(exc).__name__}: {exc}"[:800]
            if "eager_ms" in row and "cuda_graph_ms" in row:
                row["graph_speedup"] = row["eager_ms"] / row["cuda_graph_ms"]
            print(f"  predict {dt} b{b}: " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                                       for k, v in row.items() if k not in ("dtype", "batch")),
                  flush=True)
            rows.append(row)
    info = model.graph_info()
    rows.append({"graph_info": {k: info.get(k) for k in ("captures", "failures", "eager_fallbacks", "pipeline")}})
    return rows


def letterboxed(model, images: list, imgsz: int, b: int, dtype: torch.dtype) -> torch.Tensor:
    from libreyolo.data.sources import load_sources

    tensors = [s.data.to(model.device) for s in load_sources(images[:b])]
    return model.family.letterbox(imgsz)(tensors, dtype=dtype)[0]


def bench_forward(model, images: list, imgsz: int, batches: list[int], dtypes: list[str], n: int, warmup: int,
                  sync) -> list[dict]:
    rows = []
    for dt in dtypes:
        dtype = torch.float16 if dt == "fp16" else torch.float32
        for b in batches:
            row = {"dtype": dt, "batch": b}
            try:
                x = letterboxed(model, images, imgsz, b, dtype)
                eager = model._forward(x)["logits"].clone()
                row["eager_ms"] = median_ms(lambda x=x: model._forward(x), n, warmup, sync)
                graphed = model.graph_forward(x, True)["logits"].clone()
                row.update({f"graph_{k}": v for k, v in diff_stats(graphed, eager).items()})
                row["graph_ms"] = median_ms(lambda x=x: model.graph_forward(x, True), n, warmup, sync)
                row["graph_speedup"] = row["eager_ms"] / row["graph_ms"]
                again = model._forward(x)["logits"]
                row["eager_deterministic"] = diff_stats(again, eager)["bit_equal"]
            except Exception as exc:  # noqa: BLE001
                row["error"] = f"{type(exc).__name__}: {exc}"[:800]
            print(f"  forward {dt} b{b}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                       for k, v in row.items() if k not in ("dtype", "batch")),
                  flush=True)
            rows.append(row)
    model.release_graphs()
    return rows


def bench_attention(model, images: list, imgsz: int, batches: list[int], dtypes: list[str], n: int, warmup: int,
                    sync) -> list[dict]:
    from libreyolo import set_fused_attention

    rows = []
    for dt in dtypes:
        dtype = torch.float16 if dt == "fp16" else torch.float32
        net = copy.deepcopy(model.net).eval().to(device=model.device, dtype=dtype)
        for b in sorted({batches[0], batches[-1]}):
            row = {"dtype": dt, "batch": b}
            try:
                x = letterboxed(model, images, imgsz, b, dtype)
                outs = {}
                with torch.inference_mode():
                    for fused in (True, False):
                        row["modules_switched"] = set_fused_attention(net, enabled=fused)
                        outs[fused] = net(x).clone()
                        key = f"{'fused' if fused else 'manual'}_ms"
                        row[key] = median_ms(lambda net=net, x=x: net(x), n, warmup, sync)
                row["speedup_fused"] = row["manual_ms"] / row["fused_ms"]
                st = diff_stats(outs[True], outs[False])
                row.update({"byte_exact": st["bit_equal"], "max_abs_diff": st["max_abs_diff"],
                            "argmax_agreement_pct": st["argmax_agreement_pct"], "finite": st["finite"]})
            except Exception as exc:  # noqa: BLE001
                row["error"] = f"{type(exc).__name__}: {exc}"[:800]
            print(f"  attention {dt} b{b}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                         for k, v in row.items() if k not in ("dtype", "batch")),
                  flush=True)
            rows.append(row)
        del net
    return rows


def run_peer(args, run: Run, specs: dict, batches: list[int], ours_masks: dict, workdir: Path) -> dict:
    from libreyolo.assets import SAMPLE_IMAGE

    mask_dir = workdir / "peer_masks"
    mask_dir.mkdir(exist_ok=True)
    cfg = {"device": args.device, "image": str(SAMPLE_IMAGE), "batches": batches, "n": args.n,
           "warmup": args.warmup, "mask_dir": str(mask_dir), "budget_s": max(10.0, args.peer_timeout - 30.0),
           "sizes": specs}
    cfg_path = workdir / "peer_cfg.json"
    cfg_path.write_text(json.dumps(cfg))
    peer = run_peer_child(args.peer_python, PEER, cfg_path, workdir, args.peer_timeout)
    # pixel agreement of the reference's argmax maps with ours (eager, fp32)
    import numpy as np

    for size, row in peer.get("sizes", {}).items():
        for b in batches:
            f = mask_dir / f"{size}_b{b}.npz"
            mine = ours_masks.get(size, {}).get(b)
            if not f.exists() or mine is None:
                why = "no reference masks" if not f.exists() else "no masks of ours"
                row[f"b{b}_agreement"] = f"not compared: {why}"
                continue
            with np.load(f) as z:
                theirs = [z[f"arr_{i}"] for i in range(len(z.files))]
            if len(theirs) != len(mine) or any(t.shape != tuple(m.shape) for t, m in zip(theirs, mine, strict=True)):
                row[f"b{b}_agreement"] = (f"shape mismatch: ours {[tuple(m.shape) for m in mine]}, "
                                          f"reference {[t.shape for t in theirs]}")
                continue
            per = [100.0 * float((t == m.numpy()).mean()) for t, m in zip(theirs, mine, strict=True)]
            row[f"b{b}_agreement"] = {"pixel_agreement_pct": sum(per) / len(per), "min_image_pct": min(per),
                                      "identical": all(p == 100.0 for p in per)}
    return peer


# --- report ----------------------------------------------------------------------------------
def _f(v: Any, fmt: str = ".2f") -> str:
    return format(v, fmt) if isinstance(v, (int, float)) and not isinstance(v, bool) else ("-" if v is None else "x")


def print_tables(result: dict) -> None:
    peer = result.get("peer") or {}
    print("\npredict (median ms per call; img/s; ratio = ours / reference, <1 is faster)")
    print(f"{'size':5} {'dt':5} {'B':>2} {'eager':>9} {'graph':>9} {'img/s e':>9} {'img/s g':>9} "
          f"{'ref eager':>9} {'ref graph':>9} {'eager ratio':>11} {'graph ratio':>11} {'agree%':>7}")
    for size, s in result["sizes"].items():
        pr = (peer.get("sizes") or {}).get(size, {})
        for r in s.get("predict") or []:
            if "batch" not in r:
                continue
            b = r["batch"]
            re_, rg = pr.get(f"b{b}_eager"), pr.get(f"b{b}_cuda_graph")
            re_ms = re_.get("ms") if isinstance(re_, dict) and r["dtype"] == "fp32" else None
            rg_ms = rg.get("ms") if isinstance(rg, dict) and r["dtype"] == "fp32" else None
            ag = pr.get(f"b{b}_agreement")
            ag = ag.get("pixel_agreement_pct") if isinstance(ag, dict) and r["dtype"] == "fp32" else None
            e, g = r.get("eager_ms"), r.get("cuda_graph_ms")
            print(f"{size:5} {r['dtype']:5} {b:>2} {_f(e):>9} {_f(g):>9} {_f(r.get('eager_images_per_s'), '.1f'):>9} "
                  f"{_f(r.get('cuda_graph_images_per_s'), '.1f'):>9} {_f(re_ms):>9} {_f(rg_ms):>9} "
                  f"{_f(e / re_ms if e and re_ms else None, '.3f'):>11} "
                  f"{_f(g / rg_ms if g and rg_ms else None, '.3f'):>11} "
                  f"{_f(ag, '.2f'):>7}")
    print("\nforward (median ms; graph bit-equal to eager)")
    for size, s in result["sizes"].items():
        for r in s.get("forward") or []:
            print(f"{size:5} {r['dtype']:5} b{r['batch']:<2} eager {_f(r.get('eager_ms')):>8}  graph "
                  f"{_f(r.get('graph_ms')):>8}  bit_equal={r.get('graph_bit_equal', r.get('error', '?'))}")
    print("\nattention fused (SDPA) vs manual (median forward ms)")
    for size, s in result["sizes"].items():
        for r in s.get("attention") or []:
            print(f"{size:5} {r['dtype']:5} b{r['batch']:<2} fused {_f(r.get('fused_ms')):>8}  manual "
                  f"{_f(r.get('manual_ms')):>8}  max|diff| {_f(r.get('max_abs_diff'), '.3g'):>9}  "
                  f"argmax {_f(r.get('argmax_agreement_pct'), '.3f')}%  {r.get('error', '')}")
    if result["errors"]:
        print(f"\n{len(result['errors'])} stage error(s): " + "; ".join(f"{e['stage']}: {e['error'][:160]}"
                                                                  for e in result["errors"]))
    if result["skipped"]:
        print("skipped: " + "; ".join(result["skipped"]))


# --- main ------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the results here (rewritten after every stage)")
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu for a smoke test")
    ap.add_argument("--sizes", nargs="+", default=["b0", "b2"], help="SegFormer sizes (b0..b5)")
    ap.add_argument("--imgsz", type=int, help="input size (default: the size's own, 512; b5 640)")
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--half", action="store_true", help="add fp16 rows (CUDA only)")
    ap.add_argument("--n", type=int, default=30, help="timed calls per figure")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="n=3, warmup=1: a smoke test of every stage")
    ap.add_argument("--skip", nargs="*", default=[], choices=["predict", "forward", "attention", "peer"])
    ap.add_argument("--peer-python", help="interpreter with the reference libreyolo 1.6.0 importable")
    ap.add_argument("--peer-timeout", type=float, default=240.0, help="seconds for the reference child process")
    ap.add_argument("--keep-workdir", action="store_true", help="keep the temporary checkpoints and masks")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="skip stages of ours that would start after this many seconds")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.warmup = min(args.n, 3), min(args.warmup, 1)
    device = torch.device(args.device)
    result: dict = {
        "schema": 1, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]), "argv": sys.argv[1:],
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" and torch.cuda.is_available() else None,
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "host": platform.node(), "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "graph_backend": "cuda" if device.type == "cuda" else "emulated (CPU smoke test: not CUDA graphs)",
        "sizes": {}, "errors": [], "skipped": []}
    if device.type == "cuda" and not torch.cuda.is_available():
        result["errors"].append({"stage": "setup", "error": "--device cuda but no CUDA device"})
        print("no CUDA device (use --device cpu --quick for a smoke test)", file=sys.stderr)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result, indent=1) + "\n")
        return 2
    run = Run(args, result)
    try:
        from libreyolo import __version__

        result["libreyolo"] = __version__
    except Exception:  # noqa: BLE001
        pass
    sync = make_sync(device)
    dtypes = ["fp32"] + (["fp16"] if args.half and device.type == "cuda" else [])
    if args.half and device.type != "cuda":
        result["skipped"].append("fp16: needs CUDA")
    images = run.stage("images", sample_images, max(args.batches)) or []
    workdir = Path(tempfile.mkdtemp(prefix="segformer_bench_"))
    result["workdir"] = str(workdir)
    ours_masks: dict[str, dict[int, list]] = {}
    specs: dict[str, dict] = {}
    from libreyolo.models.registry import get_family

    family = get_family(FAMILY)
    with graph_support_forced(family) as declared:
        result["supports_cuda_graph_declared"] = declared
        result["graph_support_forced"] = True
        for size in args.sizes:
            imgsz = args.imgsz or family.default_imgsz_for(size)
            s = result["sizes"].setdefault(size, {"imgsz": imgsz})
            print(f"segformer-{size} at {imgsz}", flush=True)

            def build(size=size, s=s):
                from libreyolo.graphs.parity import seeded_model

                t0 = time.perf_counter()
                m = seeded_model(FAMILY, size, seed=args.seed, device=device)
                if device.type != "cuda":
                    from libreyolo.graphs.backend import EmulatedGraphBackend

                    m._graph_backend = EmulatedGraphBackend()
                s["build_s"] = round(time.perf_counter() - t0, 2)
                s["params"] = sum(p.numel() for p in m.net.parameters())
                s["nc"] = m.nc
                return m

            model = run.stage(f"{size}/build", build)
            if model is None or not images:
                continue
            if "peer" not in args.skip and args.peer_python:
                path = workdir / f"LibreSegformer{size}-sem.pt"  # the reference's file-name pattern
                if run.stage(f"{size}/save", model.save, path) is not None:
                    specs[size] = {"weights": str(path), "nc": model.nc, "imgsz": imgsz}
            if "predict" not in args.skip:
                ours_masks[size] = {}
                s["predict"] = run.stage(f"{size}/predict", bench_predict, model, images, imgsz, args.batches,
                                         dtypes, args.n, args.warmup, sync, ours_masks[size])
                model.release_graphs()
            if "forward" not in args.skip:
                s["forward"] = run.stage(f"{size}/forward", bench_forward, model, images, imgsz, args.batches,
                                         dtypes, args.n, args.warmup, sync)
            if "attention" not in args.skip:
                s["attention"] = run.stage(f"{size}/attention", bench_attention, model, images, imgsz,
                                           args.batches, dtypes, args.n, args.warmup, sync)
            with contextlib.suppress(Exception):
                model.release_graphs()
            del model
            if device.type == "cuda":
                torch.cuda.empty_cache()
            run.save()
    if args.peer_python and "peer" not in args.skip:
        if specs:
            # the reference runs after ours, whatever our budget says: it has its own timeout
            run.deadline = float("inf")
            result["peer"] = run.stage("peer", run_peer, args, run, specs, args.batches, ours_masks, workdir)
        else:
            result["peer"] = {"error": "no checkpoint of ours was written"}
    else:
        result["peer"] = None
    if not args.keep_workdir:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
        result["workdir"] += " (removed)"
    run.save()
    print_tables(result)
    if args.json:
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
