"""RTMDet and SwinIR on CUDA: predict eager vs graphed, fused vs manual attention, the training
step and the share of it a training graph covers, against the reference library in the same run.

    PYTHONPATH=. python3 bench/rtmdet_swinir_bench.py --peer-python /tmp/peerpy \
        --json bench/results/<date>-rtmdet-swinir-h200.json
    PYTHONPATH=. python3 bench/rtmdet_swinir_bench.py --device cpu --quick   # smoke test, CPU

Weights are seeded and untrained (:func:`libreyolo.graphs.parity.seeded_model`; RTMDet's class
predictors rescaled to unit logit spread, :func:`spread_class_logits`); the reference loads the
same weights from the checkpoint ``model.save()`` writes (its own format).

- ``predict``: RTMDet-t and -s at 640 (``--rtmdet-sizes``), batch 1, on the bundled sample image,
  fp32: ``model.predict(img)`` eager and with ``cuda_graph=True`` (RTMDet: the pipeline graph,
  network and decoding and NMS in one replay); median ms per call and whether the graphed
  detections equal the eager ones bit for bit. SwinIR-s on the sample's central 256x256 crop
  (output 1024x1024), eager and graphed, with the attention modules fused (SDPA) and manual
  (the family default): median ms and whether the graphed image equals the eager one.
- ``peer`` (``--peer-python``): the reference's ``LibreRTMDet``/``LibreSwinIR`` built from our
  checkpoints in a child process, same images: ``predict`` eager and ``cuda_graph=True``
  (SwinIR also with its ``set_fused_attention`` on and off, where it has one); its detections
  (from the image file, at a ``conf`` that 1000 candidates pass: :func:`agreement_conf`) are
  matched with ours as sets, its restored pixels compared with ours.
- ``train``: one AMP training step (forward, loss with the assigner, backward, SGD step) of
  RTMDet-t and YOLOv9-t at 640, batch 8, seeded synthetic batches, eager and with the training
  graph; and the parts of the eager step: the network's forward and backward alone (what the
  training graph captures; gradient of ones into its outputs), the loss forward (assigner and
  losses, no backward). ``graph share`` = network forward+backward / whole eager step: the
  design's claim is 26% for RTMDet-t and 84% for YOLOv9-t.

Each figure is the median of ``--n`` calls after ``--warmup``, host-timed around a device sync.
A failed stage is recorded in the JSON (``errors``) and the run goes on; the JSON is rewritten
after every stage.
"""
from __future__ import annotations

import argparse
import contextlib
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from peer_child import run_peer_child  # noqa: E402

PEER = r'''
import json, os, statistics, sys, time
cfg = json.load(open(sys.argv[1]))
out = {"rtmdet": {}, "swinir": {}}
def emit():
    print("PEER_JSON " + json.dumps(out), flush=True)
try:
    import numpy as np, torch, libreyolo
    from PIL import Image
    out["libreyolo"] = getattr(libreyolo, "__version__", None)
    out["libreyolo_path"] = os.path.dirname(libreyolo.__file__)
    out["torch"] = torch.__version__
except Exception as exc:
    out["error"] = f"import failed: {type(exc).__name__}: {exc}"; emit(); sys.exit(0)
dev = cfg["device"]; cuda = dev.startswith("cuda")
def sync():
    if cuda: torch.cuda.synchronize()
def median_ms(fn):
    for _ in range(cfg["warmup"]): fn()
    ts = []
    for _ in range(cfg["n"]):
        sync(); t = time.perf_counter(); fn(); sync(); ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)
def fail(exc):
    return f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:600]
det_img = np.asarray(Image.open(cfg["det_image"]).convert("RGB"))[:, :, ::-1].copy()  # BGR (timed calls)
sr_img = np.asarray(Image.open(cfg["sr_image"]).convert("RGB"))[:, :, ::-1].copy()
def boxes_of(r):
    r = r[0] if isinstance(r, list) else r
    b = r.boxes
    return np.concatenate([np.asarray(torch.as_tensor(b.xyxy).cpu(), dtype=np.float64),
                           np.asarray(torch.as_tensor(b.conf).cpu(), dtype=np.float64)[:, None],
                           np.asarray(torch.as_tensor(b.cls).cpu(), dtype=np.float64)[:, None]], 1)
def restored_of(r):
    r = r[0] if isinstance(r, list) else r
    x = getattr(r, "restored", None)
    x = getattr(x, "data", x)
    if x is None and isinstance(r, dict):
        x = r.get("restored")
    return np.asarray(torch.as_tensor(x).cpu())
for size, path in cfg["rtmdet"].items():
    row = out["rtmdet"].setdefault(size, {})
    try:
        m = libreyolo.LibreRTMDet(path, size=size, nb_classes=cfg["nc"], device=dev)
    except Exception as exc:
        row["error"] = "build " + fail(exc); emit(); continue
    for graph in (False, True):
        key = "cuda_graph" if graph else "eager"
        try:
            call = lambda: m(det_img, conf=cfg["conf"], imgsz=cfg["det_imgsz"], cuda_graph=graph)
            got = boxes_of(call())
            # agreement: the image file itself, so that no library's array convention is in play
            from_file = boxes_of(m(cfg["det_image"], conf=cfg["agreement_conf"][size], imgsz=cfg["det_imgsz"],
                                   cuda_graph=graph))
            np.save(os.path.join(cfg["dir"], f"peer_rtmdet_{size}_{key}.npy"), from_file)
            row[key] = {"ms": median_ms(call), "detections": int(got.shape[0])}
        except Exception as exc:
            row[key] = fail(exc)
    del m; emit()
for size, path in cfg["swinir"].items():
    row = out["swinir"].setdefault(size, {})
    try:
        m = libreyolo.LibreSwinIR(path, size=size, device=dev)
    except Exception as exc:
        row["error"] = "build " + fail(exc); emit(); continue
    switch = None
    for where in ("libreyolo", "libreyolo.kernels.attention.sdpa", "libreyolo.kernels"):
        try:
            mod = __import__(where, fromlist=["set_fused_attention"])
            switch = getattr(mod, "set_fused_attention"); break
        except Exception:
            pass
    modes = [None] if switch is None else [True, False]
    row["has_set_fused_attention"] = switch is not None
    for fused in modes:
        tag = "default" if fused is None else ("fused" if fused else "manual")
        if fused is not None:
            try:
                row[f"{tag}_switched"] = switch(m.model, enabled=fused)
            except Exception as exc:
                row[f"{tag}_switched"] = fail(exc)
        for graph in (False, True):
            key = f"{tag}_{'cuda_graph' if graph else 'eager'}"
            try:
                call = lambda: m(sr_img, cuda_graph=graph)
                got = restored_of(call())
                np.save(os.path.join(cfg["dir"], f"peer_swinir_{size}_{key}.npy"), got)
                row[key] = {"ms": median_ms(call), "shape": list(got.shape)}
            except Exception as exc:
                row[key] = fail(exc)
    del m; emit()
emit()
'''


class Run:
    """The result dict, written after every stage; a failed stage is recorded and the run goes on."""

    def __init__(self, path: Path | None, result: dict) -> None:
        self.path, self.result = path, result

    def save(self) -> None:
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(self.path.suffix + ".tmp")
            tmp.write_text(json.dumps(self.result, indent=1, default=str) + "\n")
            tmp.replace(self.path)

    def stage(self, name: str, fn, *a, **kw) -> Any:
        t0 = time.perf_counter()
        print(f"[{name}]", flush=True)
        try:
            return fn(*a, **kw)
        except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
            msg = f"{type(exc).__name__}: {exc}"[:1000]
            self.result["errors"].append({"stage": name, "error": msg, "traceback": traceback.format_exc()[-3000:]})
            print(f"[error] {name}: {msg}", flush=True)
            return None
        finally:
            self.result.setdefault("stage_s", {})[name] = round(time.perf_counter() - t0, 2)
            self.save()


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


def _emulate_if_cpu(model, device: torch.device) -> None:
    if device.type != "cuda":
        from libreyolo.graphs.backend import EmulatedGraphBackend

        model._graph_backend = EmulatedGraphBackend()


def det_tensor(res) -> torch.Tensor:
    b = res.boxes
    return torch.cat([b.xyxy.double().cpu(), b.conf.double().cpu()[:, None], b.cls.double().cpu()[:, None]], 1)


def spread_class_logits(model, imgsz: int, device: torch.device) -> float:
    """Rescale the seeded class predictors so the sample's class logits have unit spread: seeded
    at unit scale they reach |logit| > 17 and most scores are 1.0 in fp32, ties no comparison
    of detections can order. Returns the spread it divided by."""
    from libreyolo.graphs.parity import _sample_batch

    with torch.inference_mode():
        x = _sample_batch(model.family, imgsz, 1, device, torch.float32)
        logits = torch.cat([t.flatten() for t in model.net.eval()(x)[0]])
        std = float(logits.std())
        for conv in model.net.head.rtm_cls:
            conv.weight.div_(std)
            conv.bias.div_(std)
    model.release_graphs()
    return std


def agreement_conf(model, imgsz: int, device: torch.device, k: int = 1000) -> float:
    """A score threshold that ``k`` (class, anchor) candidates of the sample pass. Untrained
    weights score most of the 8400 x 80 candidates alike, so at a low ``conf`` which 300 come out
    depends on each library's candidate caps (the reference keeps a top-k per level, as
    mmdetection does) rather than on the network; above this threshold no cap binds."""
    from libreyolo.graphs.parity import _sample_batch

    with torch.inference_mode():
        x = _sample_batch(model.family, imgsz, 1, device, torch.float32)
        preds = model.family.export_outputs(model.net.eval()(x))[0]
    scores = preds[0, 4:].flatten().float().sort(descending=True).values
    return float(scores[min(k, scores.numel() - 1)])


def bench_rtmdet_predict(args, device, sync, workdir: Path, images: dict) -> dict:
    from libreyolo.graphs.parity import seeded_model

    rows = {}
    for size in args.rtmdet_sizes:
        model = seeded_model("rtmdet", size, seed=args.seed, device=device)
        row_spread = spread_class_logits(model, args.det_imgsz, device)
        _emulate_if_cpu(model, device)
        path = workdir / f"LibreRTMDet{size}.pt"
        model.save(path)
        row = {"imgsz": args.det_imgsz, "batch": 1, "dtype": "fp32", "checkpoint": path.name}
        row["class_logit_std_before_spread"] = row_spread
        row["agreement_conf"] = agreement_conf(model, args.det_imgsz, device)
        eager = None
        for graph in (False, True):
            key = "cuda_graph" if graph else "eager"

            def call(graph=graph, model=model):
                return model.predict(images["det_bgr"], imgsz=args.det_imgsz, conf=args.conf, cuda_graph=graph)

            got = det_tensor(call())
            from_file = det_tensor(model.predict(str(workdir / "det.png"), imgsz=args.det_imgsz,
                                                 conf=row["agreement_conf"], cuda_graph=graph))
            torch.save(from_file, workdir / f"ours_rtmdet_{size}_{key}.pt")
            row[f"{key}_agreement_detections"] = int(from_file.shape[0])
            row[f"{key}_ms"] = median_ms(call, args.n, args.warmup, sync)
            row[f"{key}_detections"] = int(got.shape[0])
            if graph:
                row["graph_detections_equal_eager"] = bool(torch.equal(got, eager))
                info = model.graph_info()
                row["graph_info"] = {k: info.get(k) for k in ("captures", "failures", "eager_fallbacks", "pipeline")}
            else:
                eager = got
        row["graph_speedup"] = row["eager_ms"] / row["cuda_graph_ms"]
        print(f"  rtmdet-{size}: " + json.dumps({k: v for k, v in row.items() if k != "graph_info"}), flush=True)
        rows[size] = row
        model.release_graphs()
        model = None
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def bench_swinir_predict(args, device, sync, workdir: Path, images: dict) -> dict:
    from libreyolo import set_fused_attention
    from libreyolo.graphs.parity import seeded_model

    rows = {}
    for size in args.swinir_sizes:
        model = seeded_model("swinir", size, seed=args.seed, device=device)
        _emulate_if_cpu(model, device)
        path = workdir / f"LibreSwinIR{size}.pt"
        model.save(path)
        row: dict[str, Any] = {"input": list(images["sr"].size[::-1]), "batch": 1, "dtype": "fp32",
                               "checkpoint": path.name}
        outs = {}
        for fused in (True, False):
            tag = "fused" if fused else "manual"
            row[f"{tag}_modules_switched"] = set_fused_attention(model, enabled=fused)
            model.release_graphs()
            for graph in (False, True):
                key = f"{tag}_{'cuda_graph' if graph else 'eager'}"

                def call(graph=graph, model=model):
                    return model.predict(images["sr_bgr"], cuda_graph=graph)

                got = call().restored.data.cpu()
                outs[key] = got
                torch.save(got, workdir / f"ours_swinir_{size}_{key}.pt")
                row[f"{key}_ms"] = median_ms(call, args.n_sr, args.warmup, sync)
            row[f"{tag}_graph_equal_eager"] = bool(torch.equal(outs[f"{tag}_cuda_graph"], outs[f"{tag}_eager"]))
            row[f"{tag}_graph_speedup"] = row[f"{tag}_eager_ms"] / row[f"{tag}_cuda_graph_ms"]
        row["output_shape"] = list(outs["manual_eager"].shape)
        d = (outs["fused_eager"].int() - outs["manual_eager"].int()).abs()
        row["fused_vs_manual_max_grey"] = int(d.max())
        row["fused_vs_manual_pixels_equal_pct"] = 100.0 * float((d == 0).double().mean())
        set_fused_attention(model, enabled=False)  # back to the family default
        print(f"  swinir-{size}: " + json.dumps(row), flush=True)
        rows[size] = row
        model.release_graphs()
        model = None
    return rows


def match_detections(mine: torch.Tensor, theirs: torch.Tensor, px: float = 0.01, conf: float = 1e-4) -> dict:
    """Detections as sets (rows ``x1 y1 x2 y2 conf cls``; untrained weights tie many scores, so
    order says nothing): the share of ours with a reference detection of the same class whose box
    is within ``px`` pixels (every coordinate) and whose score is within ``conf``, and back."""
    if not mine.numel() or not theirs.numel():
        return {"matched_pct_ours": None, "matched_pct_reference": None}
    box = torch.cdist(mine[:, :4], theirs[:, :4], p=float("inf"))
    same = (mine[:, None, 5] == theirs[None, :, 5]) & ((mine[:, None, 4] - theirs[None, :, 4]).abs() <= conf)
    close = same & (box <= px)
    nearest = torch.where(same, box, torch.full_like(box, float("inf"))).min(1).values
    return {"matched_pct_ours": 100.0 * float(close.any(1).double().mean()),
            "matched_pct_reference": 100.0 * float(close.any(0).double().mean()),
            "match_px": px, "match_conf": conf,
            "median_nearest_same_class_px": float(nearest[torch.isfinite(nearest)].median())
            if torch.isfinite(nearest).any() else None}


def run_peer(args, workdir: Path, images: dict, rtmdet: dict, swinir: dict) -> dict:
    cfg = {"device": args.device, "n": args.n, "warmup": args.warmup, "conf": args.conf, "nc": 80,
           "det_imgsz": args.det_imgsz, "det_image": str(workdir / "det.png"), "sr_image": str(workdir / "sr.png"),
           "dir": str(workdir), "rtmdet": {s: str(workdir / r["checkpoint"]) for s, r in (rtmdet or {}).items()},
           "agreement_conf": {s: r["agreement_conf"] for s, r in (rtmdet or {}).items()},
           "swinir": {s: str(workdir / r["checkpoint"]) for s, r in (swinir or {}).items()}}
    (workdir / "peer.json").write_text(json.dumps(cfg))
    peer = run_peer_child(args.peer_python, PEER, workdir / "peer.json", workdir, args.peer_timeout)
    import numpy as np

    # agreement with ours: detections as sorted rows (the reference's boxes against our eager ones)
    for size in rtmdet or {}:
        f = workdir / f"peer_rtmdet_{size}_eager.npy"
        if f.exists():
            theirs = torch.from_numpy(np.load(f))
            mine = torch.load(workdir / f"ours_rtmdet_{size}_eager.pt")
            row = peer["rtmdet"].setdefault(size, {})
            row["detections_ours_vs_reference"] = [int(mine.shape[0]), int(theirs.shape[0])]
            row.update(match_detections(mine, theirs))
    for size in swinir or {}:
        row = peer["swinir"].setdefault(size, {})
        for tag in ("default", "manual", "fused"):
            f = workdir / f"peer_swinir_{size}_{tag}_eager.npy"
            if f.exists():
                theirs = torch.from_numpy(np.load(f)).int()
                ours = "manual" if tag == "default" else tag
                mine = torch.load(workdir / f"ours_swinir_{size}_{ours}_eager.pt").int()
                if theirs.shape == mine.shape:
                    d = (theirs - mine).abs()
                    row[f"{tag}_vs_ours_max_grey"] = int(d.max())
                    row[f"{tag}_vs_ours_pixels_equal_pct"] = 100.0 * float((d == 0).double().mean())
                else:
                    row[f"{tag}_vs_ours"] = f"shape {tuple(theirs.shape)} vs ours {tuple(mine.shape)}"
    return peer


def bench_train(args, device, sync) -> list[dict]:
    return [_train_row(name, size, args, device, sync) for name, size in (("rtmdet", "t"), ("yolo9", "t"))]


def _train_row(name: str, size: str, args, device, sync) -> dict:
    from libreyolo.engine.model import Model
    from libreyolo.models.registry import get_family
    from libreyolo.train.graph import TrainGraphs, synthetic_batches
    from libreyolo.train.loss import loss_for
    from libreyolo.train.trainer import TrainForward

    sys.path.insert(0, str(ROOT / "bench"))
    from train_bench import _time_steps

    family = get_family(name)
    nc = 8
    model = Model(family, size, nc=nc, names={i: str(i) for i in range(nc)}, imgsz=args.train_imgsz).to(device)
    images, targets = synthetic_batches(model, 1, args.train_batch, args.train_imgsz, device=str(device))[0]
    scale = 255.0 * family.export.input_scale
    images = family.network_input((images / scale * 255.0).clamp(0, 255).to(torch.uint8))  # as the trainer feeds
    data = (images, targets)
    criterion = loss_for(name, model.task, nc)
    row: dict[str, Any] = {"family": f"{name}-{size}", "imgsz": args.train_imgsz, "batch": args.train_batch,
                           "amp": device.type == "cuda", "train_capture": family.train_capture}
    start = {k: v.clone() for k, v in model.net.state_dict().items()}
    if device.type == "cuda":
        for graph in (False, True):
            model.net.load_state_dict(start)
            ms, replays = _time_steps(model, data, criterion, graph, args.n, args.warmup)
            row["graph_step_ms" if graph else "eager_step_ms"] = ms
            if graph:
                row["replays"] = replays
        row["graph_step_speedup"] = row["eager_step_ms"] / row["graph_step_ms"]
    net = model.net.train()
    autocast = torch.autocast(device.type) if device.type == "cuda" else contextlib.nullcontext()

    def net_only(encode) -> None:
        net.zero_grad(set_to_none=True)
        with autocast:
            feats = encode(images)
        flat = [t for t in torch.utils._pytree.tree_leaves(feats)
                if isinstance(t, torch.Tensor) and t.requires_grad]
        torch.autograd.backward(flat, [torch.ones_like(t) for t in flat])

    model.net.load_state_dict(start)
    row["eager_network_fwd_bwd_ms"] = median_ms(lambda: net_only(lambda x: family.train_encode(net, x)),
                                                args.n, args.warmup, sync)
    with torch.no_grad(), autocast:
        out = TrainForward(family, net)(*data)
    row["eager_loss_forward_ms"] = median_ms(lambda: criterion(out, targets), args.n, args.warmup, sync)
    if device.type == "cuda":
        model.net.load_state_dict(start)
        graphs = TrainGraphs(family, net, amp=True, capture_after=1)
        row["graph_network_fwd_bwd_ms"] = median_ms(lambda: net_only(graphs.encode), args.n, args.warmup, sync)
        row["graph_share_of_eager_step_pct"] = 100.0 * row["eager_network_fwd_bwd_ms"] / row["eager_step_ms"]
        row["graph_share_of_graphed_step_pct"] = 100.0 * row["graph_network_fwd_bwd_ms"] / row["graph_step_ms"]
        row["loss_share_of_eager_step_pct"] = 100.0 * row["eager_loss_forward_ms"] / row["eager_step_ms"]
    print("  " + json.dumps(row), flush=True)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def _f(v: Any, fmt: str = ".2f") -> str:
    return format(v, fmt) if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"


def _ms(v: Any) -> Any:
    return v.get("ms") if isinstance(v, dict) else None


def print_tables(result: dict) -> None:
    peer = result.get("peer") or {}
    print("\nRTMDet predict, batch 1, fp32 (median ms per call; ratio = reference / ours, >1: we are faster)")
    print(f"{'size':5} {'eager':>8} {'graph':>8} {'ref eager':>10} {'ref graph':>10} {'eager x':>8} {'graph x':>8} "
          f"{'graph==eager':>12} {'dets ours/ref, matched':>24}")
    for size, r in (result.get("rtmdet_predict") or {}).items():
        pr = (peer.get("rtmdet") or {}).get(size, {})
        re_, rg = _ms(pr.get("eager")), _ms(pr.get("cuda_graph"))
        e, g = r.get("eager_ms"), r.get("cuda_graph_ms")
        dets = pr.get("detections_ours_vs_reference")
        dets = f"{dets} {_f(pr.get('matched_pct_ours'), '.1f')}%" if dets else dets
        print(f"{size:5} {_f(e):>8} {_f(g):>8} {_f(re_):>10} {_f(rg):>10} {_f(re_ / e if re_ and e else None):>8} "
              f"{_f(rg / g if rg and g else None):>8} {str(r.get('graph_detections_equal_eager')):>12} "
              f"{str(dets):>24}")
    print("\nSwinIR predict, 256x256 in, 1024x1024 out, fp32 (median ms; ratio = reference / ours)")
    print(f"{'size':5} {'attn':7} {'eager':>8} {'graph':>8} {'ref eager':>10} {'ref graph':>10} {'eager x':>8} "
          f"{'graph x':>8} {'graph==eager':>12}")
    for size, r in (result.get("swinir_predict") or {}).items():
        pr = (peer.get("swinir") or {}).get(size, {})
        for tag in ("fused", "manual"):
            ref_tag = tag if pr.get("has_set_fused_attention") else "default"
            re_, rg = _ms(pr.get(f"{ref_tag}_eager")), _ms(pr.get(f"{ref_tag}_cuda_graph"))
            e, g = r.get(f"{tag}_eager_ms"), r.get(f"{tag}_cuda_graph_ms")
            print(f"{size:5} {tag:7} {_f(e):>8} {_f(g):>8} {_f(re_):>10} {_f(rg):>10} "
                  f"{_f(re_ / e if re_ and e else None):>8} {_f(rg / g if rg and g else None):>8} "
                  f"{str(r.get(f'{tag}_graph_equal_eager')):>12}")
    for size, pr in (peer.get("swinir") or {}).items():
        if pr.get("fused_switched") == 0 and pr.get("manual_switched") == 0:
            print(f"(reference swinir-{size}: its set_fused_attention switches 0 modules; both rows are its one path)")
    print("\nTraining step, AMP (median ms; graph share = network forward+backward / whole step)")
    print(f"{'family':9} {'B':>2} {'eager':>8} {'graph':>8} {'x':>5} {'net f+b':>8} {'loss fwd':>9} "
          f"{'share eager':>11} {'share graphed':>13}")
    for r in result.get("train") or []:
        print(f"{r['family']:9} {r['batch']:>2} {_f(r.get('eager_step_ms')):>8} {_f(r.get('graph_step_ms')):>8} "
              f"{_f(r.get('graph_step_speedup')):>5} {_f(r.get('eager_network_fwd_bwd_ms')):>8} "
              f"{_f(r.get('eager_loss_forward_ms')):>9} {_f(r.get('graph_share_of_eager_step_pct'), '.1f'):>10}% "
              f"{_f(r.get('graph_share_of_graphed_step_pct'), '.1f'):>12}%")
    if result["errors"]:
        print(f"\n{len(result['errors'])} stage error(s): "
              + "; ".join(f"{e['stage']}: {e['error'][:200]}" for e in result["errors"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rtmdet-sizes", nargs="+", default=["t", "s"])
    ap.add_argument("--swinir-sizes", nargs="+", default=["s"])
    ap.add_argument("--det-imgsz", type=int, default=640)
    ap.add_argument("--sr-size", type=int, default=256, help="side of the SwinIR input crop")
    ap.add_argument("--conf", type=float, default=0.25)
    ap.add_argument("--train-imgsz", type=int, default=640)
    ap.add_argument("--train-batch", type=int, default=8)
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--n-sr", type=int, default=10, help="timed SwinIR calls per figure")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sections", default="rtmdet,swinir,train,peer")
    ap.add_argument("--peer-python", help="interpreter that imports the reference libreyolo 1.6.0")
    ap.add_argument("--peer-timeout", type=float, default=240.0)
    ap.add_argument("--quick", action="store_true", help="a smoke test: tiny sizes, n=2")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.n_sr, args.warmup = 2, 2, 1
        args.det_imgsz, args.sr_size, args.train_imgsz, args.train_batch = 160, 32, 160, 2
        args.rtmdet_sizes = args.rtmdet_sizes[:1]
    sections = set(args.sections.split(","))
    device = torch.device(args.device)
    result: dict[str, Any] = {
        "schema": 1, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" and torch.cuda.is_available() else None,
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "graph_backend": "cuda" if device.type == "cuda" else "emulated (CPU smoke test: not CUDA graphs)",
        "errors": []}
    from libreyolo import __version__

    result["libreyolo"] = __version__
    run = Run(args.json, result)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    workdir = Path(tempfile.mkdtemp(prefix="rtmdet_swinir_bench_"))
    from PIL import Image

    from libreyolo.assets import SAMPLE_IMAGE

    det = Image.open(SAMPLE_IMAGE).convert("RGB")
    w, h = det.size
    s = min(args.sr_size, w, h)
    sr = det.crop(((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s))
    det.save(workdir / "det.png")
    sr.save(workdir / "sr.png")
    import numpy as np

    # timed calls take what numpy callers pass, a BGR array (the reference's child the same)
    images = {"det": det, "sr": sr, "det_bgr": np.ascontiguousarray(np.asarray(det)[:, :, ::-1]),
              "sr_bgr": np.ascontiguousarray(np.asarray(sr)[:, :, ::-1])}
    if "rtmdet" in sections:
        result["rtmdet_predict"] = run.stage("rtmdet_predict", bench_rtmdet_predict, args, device, sync, workdir,
                                             images)
    if "swinir" in sections:
        result["swinir_predict"] = run.stage("swinir_predict", bench_swinir_predict, args, device, sync, workdir,
                                             images)
    if "peer" in sections and args.peer_python:
        result["peer"] = run.stage("peer", run_peer, args, workdir, images, result.get("rtmdet_predict"),
                                   result.get("swinir_predict"))
    if "train" in sections:
        result["train"] = run.stage("train", bench_train, args, device, sync)
    run.save()
    print_tables(result)
    if args.json:
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
