"""Training on a GPU: eager against CUDA-graph parity, step times, and epoch time against the reference.

    PYTHONPATH=. python3 bench/train_bench.py --json bench/results/train-h200.json \
        [--peer-python /tmp/peerpy --peer-script .gpushared/peer_train_bench.py] [--sections parity,steps,epoch]

- ``parity``: per family with a training capture spec (smallest size, seeded synthetic batches):
  two eager runs (A, A') and one graphed run (G, captured on the first batch) of ``--steps`` SGD
  steps each, in fp32 and AMP. Step 0 of G is a replay: its loss, BatchNorm buffers and gradients
  are compared bit for bit with A. Later steps: the largest loss and final-parameter differences
  A-A' (eager's own run-to-run noise: non-deterministic kernels) next to A-G. Class ``bitwise``
  when G equals A at every step, ``eager noise`` when A-G is within 10x of A-A' (or A-A' is
  itself non-zero and A-G the same order), ``DIFFERS`` otherwise.
- ``steps``: median ms per training step (forward, loss, backward, SGD step; AMP as the trainer
  uses on CUDA) eager and graphed on synthetic batches: YOLOv9-t at 640 with batch 2, 8 and 16,
  the other families at batch 8, RT-DETR-r18 at batch 2 and 8.
- ``loop``: ms per step inside a whole ``train()`` (loader, loss, optimizer, EMA: everything), ours
  and the reference's (``bench/peer_train_steps.py``, its own ``train()`` as a black box) on the
  same tiny dataset: YOLOv9-t at 640 with batch 2, 8 and 16, YOLOX-n and D-FINE-n at batch 8
  (the families the reference trains without downloads), eager and graphed, 3 epochs; the mean of
  epochs 2-3 over the batches per epoch (epoch 1 holds warm-up and capture).
- ``epoch``: our ``model.train()`` on the reference's own timing set-up
  (``../shared/bench/peer_train_bench.py``: its tiny dataset of 256 images, YOLOv9-t, batch 8,
  640, 3 epochs, 4 workers, no validation), eager and ``cuda_graph=True``, and the reference's
  script run in the same job by ``--peer-python``; wall seconds of the whole ``train()`` call.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from libreyolo.engine.model import Model  # noqa: E402
from libreyolo.models.registry import get_family  # noqa: E402
from libreyolo.train.graph import TrainGraphs, run_steps  # noqa: E402
from libreyolo.train.graph import synthetic_batches as batches  # noqa: E402

PARITY = [("yolo9", "t", 320, 4), ("yolox", "n", 320, 4), ("vit", "ti", 224, 8), ("deit", "t", 224, 8),
          ("swin", "t", 224, 4), ("rtdetr", "r18", 320, 4), ("dfine", "n", 320, 4)]
STEPS = [("yolo9", "t", 640, 2), ("yolo9", "t", 640, 8), ("yolo9", "t", 640, 16), ("yolox", "n", 640, 8),
         ("vit", "ti", 224, 8), ("deit", "t", 224, 8), ("swin", "t", 224, 8), ("rtdetr", "r18", 640, 2),
         ("rtdetr", "r18", 640, 8), ("dfine", "n", 640, 8)]


def model_of(name: str, size: str, imgsz: int, nc: int = 8) -> Model | None:
    family = get_family(name)
    if family.training is None or family.train_capture is None:
        return None
    return Model(family, size, nc=nc, names={i: str(i) for i in range(nc)}, imgsz=imgsz).to("cuda")


def _maxdiff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].is_floating_point()),
               default=0.0)


def parity(steps: int) -> list[dict]:
    rows = []
    for name, size, imgsz, b in PARITY:
        for amp in (False, True):
            model = model_of(name, size, imgsz)
            if model is None:
                rows.append({"family": f"{name}-{size}", "amp": amp, "skipped": "no training capture spec"})
                continue
            start = {k: v.clone() for k, v in model.net.state_dict().items()}
            data = batches(model, steps, b, imgsz)
            runs = {}
            for tag, graph in (("A", False), ("A2", False), ("G", True)):
                model.net.load_state_dict(start)
                runs[tag] = run_steps(model, data, graph=graph, amp=amp, capture_after=1)
            A, A2, G = runs["A"], runs["A2"], runs["G"]
            loss_noise = max(abs(float(x) - float(y)) for x, y in zip(A["losses"], A2["losses"], strict=True))
            loss_graph = max(abs(float(x) - float(y)) for x, y in zip(A["losses"], G["losses"], strict=True))
            p_noise, p_graph = _maxdiff(A["params"], A2["params"]), _maxdiff(A["params"], G["params"])
            bitwise = all(torch.equal(x, y) for x, y in zip(A["losses"], G["losses"], strict=True)) and p_graph == 0
            if bitwise:
                cls = "bitwise"
            elif p_graph <= 10 * max(p_noise, 1e-12) and loss_graph <= 10 * max(loss_noise, 1e-12):
                cls = "eager noise"
            else:
                cls = "DIFFERS"
            row = {"family": f"{name}-{size}", "imgsz": imgsz, "batch": b, "amp": amp, "steps": steps,
                   "step0_loss_bitwise": bool(torch.equal(A["losses"][0], G["losses"][0])),
                   "step0_buffers_equal": all(torch.equal(A["buffers"][k], G["buffers"][k]) for k in A["buffers"]),
                   "step0_grads_equal": all(torch.equal(A["grads"][k], G["grads"][k]) for k in A["grads"]),
                   "loss_maxdiff_eager_vs_eager": loss_noise, "loss_maxdiff_eager_vs_graph": loss_graph,
                   "param_maxdiff_eager_vs_eager": p_noise, "param_maxdiff_eager_vs_graph": p_graph,
                   "later_steps": cls, "graph": G["graph"]}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "graph"}), flush=True)
            del model
            torch.cuda.empty_cache()
    return rows


def step_times(n: int, warmup: int) -> list[dict]:
    from libreyolo.train.loss import loss_for

    rows = []
    for name, size, imgsz, b in STEPS:
        model = model_of(name, size, imgsz)
        if model is None:
            rows.append({"family": f"{name}-{size}", "batch": b, "skipped": "no training capture spec"})
            continue
        data = batches(model, 1, b, imgsz)[0]
        criterion = loss_for(name, model.task, model.nc)
        row = {"family": f"{name}-{size}", "imgsz": imgsz, "batch": b, "amp": True}
        start = {k: v.clone() for k, v in model.net.state_dict().items()}
        for graph in (False, True):
            model.net.load_state_dict(start)
            ms, replays = _time_steps(model, data, criterion, graph, n, warmup)
            row["graph_ms" if graph else "eager_ms"] = ms
            if graph:
                row["replays"] = replays
        row["speedup"] = round(row["eager_ms"] / row["graph_ms"], 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
        del model
        torch.cuda.empty_cache()
    return rows


def _time_steps(model: Model, data: tuple, criterion, graph: bool, n: int, warmup: int) -> tuple[float, int]:
    """Median ms of one AMP training step (forward, loss, backward, scaled SGD step)."""
    from libreyolo.train.trainer import TrainForward

    net = model.net.train()
    opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")
    graphs = TrainGraphs(model.family, net, amp=True, capture_after=1) if graph else None
    forward = TrainForward(model.family, net, graphs.encode if graphs else None)
    times = []
    for k in range(warmup + n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda"):
            out = forward(*data)
        loss, _ = criterion(out, data[1])
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        torch.cuda.synchronize()
        if k >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    return round(statistics.median(times), 3), graphs.replays if graphs else 0


LOOP = "yolo9:t:2,yolo9:t:8,yolo9:t:16,yolox:n:8,dfine:n:8"
FAMILY_CONFIG = {"yolo9": "LibreYOLO9{}.yaml", "yolox": "LibreYOLOX{}.yaml", "dfine": "LibreDFINE{}.yaml",
                 "rtmdet": "LibreRTMDet{}.yaml"}


def loop_times(peer_python: str | None, peer: str, tiny: str, runs: str = LOOP, images: int = 256,
               epochs: int = 3, imgsz: int = 640, device: str = "cuda", workers: int = 4,
               who: str = "both") -> list[dict]:
    """ms per step of whole ``train()`` runs, ours then the reference's (same dataset writer, same settings)."""
    import math

    from libreyolo import LibreYOLO

    tmp = tempfile.mkdtemp()
    yaml = subprocess.check_output([sys.executable, tiny, os.path.join(tmp, "ds"), str(images)]).decode().strip()
    rows = []
    for spec in runs.split(",") if who in ("both", "ours") else []:
        family, size, batch = spec.split(":")
        for graph in (False, True):
            row = {"who": "ours", "family": f"{family}-{size}", "batch": int(batch), "imgsz": imgsz,
                   "cuda_graph": graph, "images": images, "epochs": epochs}
            m = LibreYOLO(FAMILY_CONFIG[family].format(size), device=device)
            t = time.time()
            s = m.train(data=yaml, epochs=epochs, batch=int(batch), imgsz=imgsz, cuda_graph=graph,
                        workers=workers, project=tmp, name=f"{family}{size}-b{batch}-g{int(graph)}",
                        device=device, plots=False, val=False, seed=0)
            row["wall_s"] = round(time.time() - t, 2)
            with open(Path(s["save_dir"]) / "results.json") as f:
                epochs_run = json.load(f)
            secs = [r["seconds"] for r in epochs_run]
            row["epoch_s"] = secs
            row["data_s"] = [r.get("data_seconds") for r in epochs_run]
            row["step_ms"] = round(sum(secs[1:]) / len(secs[1:]) / math.ceil(images / int(batch)) * 1e3, 2)
            row["graph"] = {k: s["graph"].get(k) for k in ("captured_shapes", "replays", "eager_batches", "failures")}
            rows.append(row)
            print(json.dumps(row), flush=True)
            del m
            torch.cuda.empty_cache()
    if peer_python and who in ("both", "reference"):
        script = str(Path(__file__).resolve().parent / "peer_train_steps.py")
        rows += _reference_rows([peer_python, script, "--peer", peer, "--tiny", tiny, "--runs", runs,
                                 "--images", str(images), "--epochs", str(epochs), "--imgsz", str(imgsz),
                                 "--device", device, "--workers", str(workers)], timeout=1500)
    _loop_table(rows)
    return rows


def _loop_table(rows: list[dict]) -> None:
    ours = {(r["family"], r["batch"], r["cuda_graph"]): r for r in rows if r.get("who") == "ours"}
    ref = {(r["family"], r["batch"], r["cuda_graph"]): r for r in rows if r.get("who") == "reference" and "family" in r}
    print(f"{'family':>10} {'batch':>5} {'graph':>5} {'ours ms':>9} {'ref ms':>9} {'ratio':>6}")
    for key, r in ours.items():
        other = ref.get(key, {})
        mine, theirs = r.get("step_ms"), other.get("step_ms")
        ratio = f"{mine / theirs:.2f}" if mine and theirs else other.get("error", "-")[:40]
        print(f"{key[0]:>10} {key[1]:>5} {str(key[2]):>5} {mine!s:>9} {theirs!s:>9} {ratio:>6}")


def epoch_times(peer_python: str | None, peer_script: str | None, tiny: str) -> list[dict]:
    from libreyolo import LibreYOLO

    tmp = tempfile.mkdtemp()
    yaml = subprocess.check_output([sys.executable, tiny, os.path.join(tmp, "ds"), "256"]).decode().strip()
    rows = []
    for graph in (False, True):
        m = LibreYOLO("LibreYOLO9t.yaml", device="cuda")
        t = time.time()
        s = m.train(data=yaml, epochs=3, batch=8, imgsz=640, cuda_graph=graph, workers=4, project=tmp,
                    name=f"g{int(graph)}", plots=False, val=False, seed=0)
        wall = time.time() - t
        with open(Path(s["save_dir"]) / "results.json") as f:
            epochs = [r["seconds"] for r in json.load(f)]
        rows.append({"who": "ours", "cuda_graph": graph, "images": 256, "batch": 8, "epochs": 3,
                     "wall_s": round(wall, 1), "epoch_s": epochs, "graph": s.get("graph")})
        print(json.dumps(rows[-1]), flush=True)
    if peer_python and peer_script:
        rows += _reference_rows([peer_python, peer_script], timeout=900)
    return rows


def _reference_rows(command: list[str], timeout: float) -> list[dict]:
    """Run a reference-library script; its JSON lines become rows (``who: reference``), a failure one more."""
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    rows = []
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            rows.append({"who": "reference", **json.loads(line)})
            print(json.dumps(rows[-1]), flush=True)
    if proc.returncode:
        rows.append({"who": "reference", "error": proc.stderr[-1500:]})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True)
    p.add_argument("--sections", default="parity,steps,epoch")
    p.add_argument("--steps", type=int, default=6, help="parity: steps per run")
    p.add_argument("--n", type=int, default=20, help="steps: timed steps")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--peer-python", default=None)
    p.add_argument("--peer-script", default=None, help="the reference's timing script (peer_train_bench.py)")
    p.add_argument("--tiny", default=".gpushared/make_tiny_dataset.py", help="the reference bench's dataset writer")
    p.add_argument("--peer", default=".peer", help="loop: the reference's unpacked package folder")
    p.add_argument("--loop-runs", default=LOOP, help="loop: family:size:batch,...")
    p.add_argument("--loop-who", default="both", choices=("both", "ours", "reference"),
                   help="loop: whose runs (split across jobs when one job's time is limited)")
    a = p.parse_args()
    want = a.sections.split(",")
    out = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "python": platform.python_version(),
           "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if "parity" in want:
        out["parity"] = parity(a.steps)
    if "steps" in want:
        out["steps"] = step_times(a.n, a.warmup)
    if "loop" in want:
        out["loop"] = loop_times(a.peer_python, a.peer, a.tiny, a.loop_runs, who=a.loop_who)
    if "epoch" in want:
        out["epoch"] = epoch_times(a.peer_python, a.peer_script, a.tiny)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=1, default=str))
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
