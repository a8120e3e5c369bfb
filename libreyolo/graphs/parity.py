"""The graph parity matrix: is a family's replayed forward bit-for-bit its eager forward?

A family may set ``SUPPORTS_CUDA_GRAPH = True`` only if every check passes for every size:

- ``eager_deterministic``: eager twice on the same input is identical (else nothing can match);
- ``probe_<name>``: graph == eager on probes from different distributions (uniform noise,
  clipped normal noise, smooth ramps, the letterboxed sample image), all through one graph;
- ``second_replay``: replaying again after other inputs (stale static buffers) is still exact;
- ``outputs_kept``: an output handed out earlier is not overwritten by later replays;
- ``interleaved``: two shapes (two graphs sharing one memory pool) alternated, all exact;
- ``batch2``: a batch of two different images;
- ``fp16``: the same after ``half()`` (CUDA only);
- ``invalidation``: ``half()`` then ``float()`` drops the graphs, and the recapture is exact.

A family may set ``SUPPORTS_PIPELINE_GRAPH = True`` (one graph from the letterboxed batch to
padded detections: forward, decoding, candidate selection, NMS) only if, in addition, every
``pipeline_*`` check passes. Each compares the graph's padded output with the same function run
eagerly, and its per-image detections with what eager ``predict()`` computes (the forward, then
the family's ``postprocess``), all bit for bit:

- ``pipeline_probes``: the four probes through one graph, each with its own ``conf`` (chosen
  from the eager scores so that about a thousand pairs pass: never vacuous; a run where no
  probe gives a detection fails), so thresholds written before a replay are honoured;
- ``pipeline_thresholds``: one input with other ``conf``/``iou``/``classes``: no recapture;
- ``pipeline_second_replay``, ``pipeline_interleaved``, ``pipeline_batch2`` (two images with
  different letterbox placements), ``pipeline_fp16`` (CUDA only): as above.

Equality is bit-for-bit (:func:`bit_equal`), never a tolerance; a probe whose eager output is
not finite fails, since NaN parity proves nothing. Weights are seeded, so runs repeat.

    python -m libreyolo.graphs.parity --json parity.json --md docs/graph_parity.md
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import platform
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from libreyolo.comparison.exact import bit_equal, equal_outputs
from libreyolo.kernels import KernelWarning

CHECKS = ("eager_deterministic", "probe_uniform", "probe_normal", "probe_ramps", "probe_image", "second_replay",
          "outputs_kept", "interleaved", "batch2", "fp16", "invalidation", "kernels_kept")
PIPELINE_CHECKS = ("pipeline_probes", "pipeline_thresholds", "pipeline_second_replay", "pipeline_interleaved",
                   "pipeline_batch2", "pipeline_fp16")


CALIBRATION_SIZE = 256  # large enough that the stride-32 maps are 8x8, small enough for a CPU


def seed_weights(net: torch.nn.Module, seed: int, calibration: torch.Tensor | None = None,
                 gains: dict[str, float] | None = None) -> None:
    """Deterministic weights whose outputs are finite, spread out and depend on the input.

    Random convolutions with made-up BatchNorm statistics either blow up through deep residual
    stacks (Kaiming gain 2 took yolo9-t's neck to 1e7, fp16 to inf) or wash the input out (unit
    gain: outputs for different probes differed by 1e-4). So, given a ``calibration`` batch,
    the BatchNorm running statistics are measured on it (training-mode forward, cumulative
    average): every normalised layer then sees unit-scale activations at any depth.
    ``gains``: state-dict name prefixes whose seeded values are multiplied (a family's
    ``parity_seed_gains``, e.g. YOLOX's box-size logits, which it exponentiates: at unit scale
    their noise-probe outliers overflow fp16).
    """
    g = torch.Generator().manual_seed(seed)
    # buffers other than BatchNorm statistics are built from the architecture (SwinIR's
    # shifted-window masks): their values are drawn, to keep every family's stream, but not stored
    fixed = {name for name, _ in net.named_buffers() if name.rsplit(".", 1)[-1] not in ("running_mean", "running_var")}
    with torch.no_grad():
        for name, t in net.state_dict().items():
            if not t.is_floating_point():
                continue
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "running_var":
                v = 0.6 + 0.8 * torch.rand(t.shape, generator=g)
            elif leaf == "running_mean":
                v = 0.1 * torch.randn(t.shape, generator=g)
            elif t.ndim > 1:
                v = torch.randn(t.shape, generator=g) / math.sqrt(max(1, t[0].numel()))
            elif leaf == "weight":
                v = 0.8 + 0.4 * torch.rand(t.shape, generator=g)
            else:
                v = 0.1 * torch.randn(t.shape, generator=g)
            if name in fixed:
                continue
            gain = next((g for prefix, g in (gains or {}).items() if name.startswith(prefix)), 1.0)
            t.copy_((v * gain).to(t.dtype))
        norms = [m for m in net.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
        if calibration is None or not norms:
            return
        saved = [(m.momentum, m.training) for m in norms]
        for m in norms:
            m.reset_running_stats()
            m.momentum = None  # cumulative average over the calibration batch
            m.train()
        net(calibration)
        for m, (momentum, training) in zip(norms, saved, strict=True):
            m.momentum = momentum
            m.train(training)


def seeded_model(family_name: str, size: str, *, seed: int = 0, device: str | torch.device = "cuda"):
    """A fresh model of ``family_name``/``size`` with :func:`seed_weights` weights, on ``device``."""
    from libreyolo.engine.model import Model
    from libreyolo.models.registry import get_family

    family = get_family(family_name)
    model = Model(family, size, nc=80, names={i: str(i) for i in range(80)}, imgsz=family.default_imgsz)
    model.net.load_state_dict(_seeded_state(family_name, size, seed))
    return model.to(device)


@functools.lru_cache(maxsize=2)
def _seeded_state(family_name: str, size: str, seed: int) -> dict[str, torch.Tensor]:
    from libreyolo.engine.model import Model
    from libreyolo.models.registry import get_family

    family = get_family(family_name)
    model = Model(family, size, nc=80, names={i: str(i) for i in range(80)}, imgsz=family.default_imgsz)
    calibration = torch.cat(list(probes(family, CALIBRATION_SIZE, device=torch.device("cpu"), seed=seed + 7).values()))
    seed_weights(model.net, seed, calibration, gains=family.parity_seed_gains)
    return {k: v.clone() for k, v in model.net.state_dict().items()}


def probes(family, imgsz: int, *, batch: int = 1, device: torch.device, dtype: torch.dtype = torch.float32,
           seed: int = 0) -> dict[str, torch.Tensor]:
    """Inputs from different distributions, each (batch, 3, imgsz, imgsz), in the range the
    network takes (pixels times the family's ``input_scale``: [0, 1] or [0, 255])."""
    g = torch.Generator().manual_seed(seed + imgsz + 1000 * batch)
    shape = (batch, 3, imgsz, imgsz)
    yy, xx = torch.meshgrid(torch.linspace(0, 1, imgsz), torch.linspace(0, 1, imgsz), indexing="ij")
    freq = 1 + 4 * torch.rand(batch, 3, 2, generator=g)
    phase = 6.28 * torch.rand(batch, 3, generator=g)
    ramps = 0.5 + 0.5 * torch.sin(6.28 * (freq[..., 0, None, None] * xx + freq[..., 1, None, None] * yy)
                                  + phase[..., None, None])
    out = {
        "uniform": torch.rand(shape, generator=g),
        "normal": (0.5 + 0.25 * torch.randn(shape, generator=g)).clamp(0, 1),
        "ramps": ramps,
    }
    # in the network's own input range, like the letterboxed image: pixels times the family's
    # input_scale (0-1 for most families, 0-255 for YOLOX), unless a mean/std normalisation
    # follows (classifiers: their normalised inputs are around [-2, 2], so 0-1 stays)
    box = family.letterbox(imgsz)
    std = box.normalization().get("std", [1.0] * 3) if hasattr(box, "normalization") else [1.0] * 3
    scale = 255.0 * family.export.input_scale if all(float(v) == 1.0 for v in std) else 1.0
    out = {k: (v * scale).to(device=device, dtype=dtype) for k, v in out.items()}
    out["image"] = _sample_batch(family, imgsz, batch, device, dtype)
    return out


def _sample_batch(family, imgsz: int, batch: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    from libreyolo.assets import SAMPLE_IMAGE
    from libreyolo.data.sources import load_sources

    pre = family.letterbox(imgsz)
    img = load_sources(SAMPLE_IMAGE)[0].data.to(device)
    if hasattr(pre, "export_sample"):  # a preprocessor that keeps an image's size: its imgsz crop, like export
        img = pre.export_sample(img)
    views = [img, img.flip(-1), img.flip(-2), img.transpose(-1, -2)]
    images = [views[i % len(views)].contiguous() for i in range(batch)]
    return pre(images, dtype=dtype)[0]


def check_family_size(family_name: str, size: str, *, device: str | torch.device = "cuda",
                      imgszs: Sequence[int] = (640, 320), seed: int = 0, backend: Any = None) -> list[dict]:
    """Run every check for one (family, size); one row per check."""
    from libreyolo.models.registry import get_family

    family = get_family(family_name)
    device = torch.device(device)
    rows: list[dict] = []

    def record(check: str, ok: bool | None, detail: str = "") -> None:
        result = "skip" if ok is None else ("pass" if ok else "fail")
        rows.append({"family": family_name, "size": size, "task": family.task, "check": check,
                     "result": result, "detail": detail})

    model = None
    caught = warnings.catch_warnings(record=True)
    seen = caught.__enter__()
    warnings.simplefilter("always", KernelWarning)
    try:
        model = seeded_model(family_name, size, seed=seed, device=device)
        if backend is not None:
            model.set_graph_backend(backend)
        big, small = imgszs[0], imgszs[-1]

        def eager(x):
            return model.network_outputs(x)

        def graph(x):
            return model.graph_forward(x, True)

        p = {s: probes(family, s, device=device, seed=seed) for s in {big, small}}
        ref = {s: {n: eager(x) for n, x in p[s].items()} for s in p}
        again = [equal_outputs(eager(x), ref[big][n]) for n, x in p[big].items()]
        record("eager_deterministic", all(ok for ok, _ in again), "; ".join(d for _, d in again if d))

        first = None
        for name in ("uniform", "normal", "ramps", "image"):
            out = graph(p[big][name])
            first = out if name == "image" else first
            record(f"probe_{name}", *equal_outputs(out, ref[big][name]))

        checks = [equal_outputs(graph(p[big][n]), ref[big][n]) for n in ("normal", "image", "image", "uniform")]
        record("second_replay", all(ok for ok, _ in checks), "; ".join(d for _, d in checks if d))
        record("outputs_kept", *equal_outputs(first, ref[big]["image"]))

        order = [(small, "image"), (big, "normal"), (small, "ramps"), (big, "image"), (small, "uniform"),
                 (big, "ramps")]
        checks = [equal_outputs(graph(p[s][n]), ref[s][n]) for s, n in order]
        n_graphs = len(model.graph_info()["graphs"])
        ok = all(c for c, _ in checks) and n_graphs == len({big, small})
        record("interleaved", ok, "; ".join(d for _, d in checks if d) or f"{n_graphs} graphs")

        pb = probes(family, small, batch=2, device=device, seed=seed + 1)
        xb = torch.cat([pb["image"][:1], pb["normal"][1:]])
        record("batch2", *equal_outputs(graph(xb), eager(xb)))
        _pipeline_checks(model, p, big, small, record)

        if device.type == "cuda":
            model.half()  # selects the float16 inference copy; the master stays float32
            ph = {n: x.half() for n, x in p[small].items()}
            checks = [equal_outputs(graph(ph[n]), eager(ph[n])) for n in ("image", "normal", "image")]
            record("fp16", all(ok for ok, _ in checks), "; ".join(d for _, d in checks if d))
        else:
            record("fp16", None, "fp16 needs CUDA")
        before = model.graph_info()["invalidations"]
        model.net.double()  # a dtype round trip of the master moves every tensor: its copies go stale
        model.float()
        moved = model.graph_info()["invalidations"] > before
        # compare with eager on the weights as they are now
        ok, detail = equal_outputs(graph(p[big]["image"]), eager(p[big]["image"]))
        record("invalidation", moved and ok,
               detail or ("" if moved else "graphs were not dropped after a dtype change"))
    except Exception as exc:  # noqa: BLE001 - a crash is a failed row, the matrix goes on
        record("error", False, f"{type(exc).__name__}: {exc}"[:500])
    finally:
        caught.__exit__(None, None, None)
        # a kernel provider that failed (e.g. inside a capture) is disabled for the whole process: the
        # rows above then compared another implementation than the one eager started with, and every
        # later family would run without it; the run is not a verdict on the forward users get
        lost = [str(w.message) for w in seen if issubclass(w.category, KernelWarning)]
        record("kernels_kept", not lost, "; ".join(lost)[:500])
        if model is not None:
            model.release_graphs()
        model = None  # noqa: F841 - drop the network before the next size
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def _pipeline_checks(model, p: dict[int, dict[str, torch.Tensor]], big: int, small: int,
                     record: Callable[..., None]) -> None:
    """The ``pipeline_*`` rows (module docstring); nothing for a family without ``device_postprocess()``."""
    from libreyolo.ops.letterbox import LetterboxMeta

    family = model.family
    post = family.device_postprocess()
    if post is None:
        return
    found = [0]

    def metas_of(x: torch.Tensor) -> list[LetterboxMeta]:
        # different source sizes and placements per image, so mapping and clipping differ
        size = x.shape[-1]
        return [LetterboxMeta((size - 24 * i - 8, size - 16 * i), 1.0 - 0.25 * i, (4.0 * i, 2.0 * i))
                for i in range(x.shape[0])]

    def conf_for(x: torch.Tensor) -> float:
        flat = post.scores(model.network_outputs(x)).float().flatten()
        return float(flat.topk(min(1000, flat.numel())).values[-1]) * 0.999

    def same(x: torch.Tensor, **kw: Any) -> tuple[bool, str]:
        metas = metas_of(x)
        graphed = model.pipeline_forward(x, metas, True, **kw)
        eager_padded = model.pipeline_forward(x, metas, False, **kw)
        ok, detail = equal_outputs(graphed, eager_padded)
        got = post.read(graphed)
        want = family.postprocess(model.network_outputs(x), metas, **kw)  # what eager predict() computes
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            found[0] += int(w["conf"].shape[0])
            bad = [k for k in w if not bit_equal(g[k], w[k])]
            if bad:
                ok, detail = False, f"{detail}; image {i}: {bad} differ from eager predict".lstrip("; ")
        return ok, detail

    def run(name: str, calls: list[tuple[torch.Tensor, dict]]) -> None:
        try:
            checks = [same(x, **kw) for x, kw in calls]
            record(name, all(ok for ok, _ in checks), "; ".join(d for _, d in checks if d))
        except Exception as exc:  # noqa: BLE001 - a crash fails this row only
            record(name, False, f"{type(exc).__name__}: {exc}"[:500])

    base = {"iou": 0.45, "max_det": 300}
    probes_big = [(p[big][n], {**base, "conf": conf_for(p[big][n])}) for n in ("uniform", "normal", "ramps", "image")]
    before = model.graph_info()["captures"]
    run("pipeline_probes", probes_big)
    if not found[0]:
        record("pipeline_probes", False, "no probe gave a detection: parity would be vacuous")
    x, kw = probes_big[-1]
    variants = [{**kw, "iou": 0.3}, {**kw, "conf": min(1.0, kw["conf"] * 1.5), "iou": 0.7},
                {**kw, "classes": list(range(0, 80, 3))}]
    run("pipeline_thresholds", [(x, v) for v in variants])
    graphs = [g for g in model.graph_info()["graphs"] if g.get("program") == "pipeline"]
    if len(graphs) != 1 or model.graph_info()["captures"] - before != 1:
        record("pipeline_thresholds", False, f"{len(graphs)} pipeline graphs after new thresholds (want 1)")
    run("pipeline_second_replay", [probes_big[1], probes_big[3], probes_big[0]])
    small_calls = [(p[small][n], {**base, "conf": conf_for(p[small][n])}) for n in ("image", "uniform")]
    run("pipeline_interleaved", [small_calls[0], probes_big[2], small_calls[1], probes_big[3]])
    pb = probes(family, small, batch=2, device=p[small]["image"].device, seed=5)
    xb = torch.cat([pb["image"][:1], pb["ramps"][1:]])
    run("pipeline_batch2", [(xb, {**base, "conf": conf_for(xb)})])
    if x.device.type == "cuda":
        run("pipeline_fp16", [(xh, {**kw, "conf": conf_for(xh)}) for xh, kw in
                              ((p[small][n].half(), base) for n in ("image", "normal"))])
    else:
        record("pipeline_fp16", None, "fp16 needs CUDA")


def environment() -> dict[str, Any]:
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
           "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
           "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    from libreyolo._version import __version__

    env["libreyolo"] = __version__
    return env


def run_matrix(families: Sequence[str] | None = None, sizes: Sequence[str] | None = None, *,
               device: str | torch.device = "cuda", imgszs: Sequence[int] = (640, 320), seed: int = 0,
               backend_factory: Callable[[], Any] | None = None, log: Callable[[str], None] = print) -> dict:
    """Every (family, size) of the registry (or the ones named); returns the matrix as a dict."""
    from libreyolo.models.registry import families as all_families

    registry = all_families()
    names = list(families) if families else sorted(registry)
    rows: list[dict] = []
    verdict: dict[str, dict] = {}
    for name in names:
        fam = registry[name]
        fam_rows = []
        for size in (s for s in fam.sizes if not sizes or s in sizes):
            t0 = time.perf_counter()
            # a network that takes one input size only is checked at that size
            at = (fam.fixed_imgsz,) * 2 if fam.fixed_imgsz else imgszs
            got = check_family_size(name, size, device=device, imgszs=at, seed=seed,
                                    backend=backend_factory() if backend_factory else None)
            fails = [r["check"] for r in got if r["result"] == "fail"]
            log(f"{name}-{size}: {'FAIL ' + ', '.join(fails) if fails else 'all checks pass'} "
                f"({time.perf_counter() - t0:.1f} s)")
            fam_rows += got
        rows += fam_rows
        forward = [r for r in fam_rows if not r["check"].startswith("pipeline_")]
        pipeline = [r for r in fam_rows if r["check"].startswith("pipeline_")]
        verified = bool(forward) and all(r["result"] != "fail" for r in forward)
        verdict[name] = {"task": fam.task, "declared": bool(fam.SUPPORTS_CUDA_GRAPH), "verified": verified,
                         "pipeline_declared": bool(getattr(fam, "SUPPORTS_PIPELINE_GRAPH", False)),
                         "pipeline_verified": verified and any(r["result"] == "pass" for r in pipeline)
                         and all(r["result"] != "fail" for r in pipeline)}
    return {"schema": 1, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": " ".join(sys.argv),
            "backend": "emulated" if backend_factory else "cuda", "device": str(device), "imgsz": list(imgszs),
            "seed": seed, "environment": environment(), "families": verdict, "rows": rows}


def to_markdown(matrix: dict) -> str:
    env = matrix["environment"]
    lines = ["# CUDA graph parity matrix", "",
             f"Generated by `{matrix['command']}` on {matrix['created']} ({matrix['backend']} backend, "
             f"device {matrix['device']}).", "",
             f"torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, GPU {env['gpu']}, "
             f"libreyolo {env['libreyolo']}; input sizes {matrix['imgsz']} (a family whose network takes one "
             f"size only, e.g. vit, deit and swin at 224, is checked at that size), seed {matrix['seed']}.", "",
             "Each cell: graph output bit-for-bit equal to eager output (pass), not equal (FAIL), "
             "or not run here (skip). Checks are described in `libreyolo/graphs/parity.py`.", ""]
    if matrix["backend"] != "cuda":
        lines += ["**Emulated backend: this verifies the harness only, not CUDA graphs.**", ""]
    checks = [c for c in CHECKS + PIPELINE_CHECKS if any(r["check"] == c for r in matrix["rows"])]
    checks += sorted({r["check"] for r in matrix["rows"]} - set(checks))
    mark = {"pass": "pass", "fail": "FAIL", "skip": "skip"}
    lines.append("| family | size | task | " + " | ".join(checks) + " |")
    lines.append("|---" * (3 + len(checks)) + "|")
    cells: dict[tuple, dict[str, str]] = {}
    for r in matrix["rows"]:
        cells.setdefault((r["family"], r["size"], r["task"]), {})[r["check"]] = mark[r["result"]]
    for (fam, size, task), got in cells.items():
        lines.append(f"| {fam} | {size} | {task} | " + " | ".join(got.get(c, "") for c in checks) + " |")
    lines += ["", "| family | SUPPORTS_CUDA_GRAPH | verified here | SUPPORTS_PIPELINE_GRAPH | pipeline verified here |",
              "|---|---|---|---|---|"]
    for fam, v in matrix["families"].items():
        lines.append(f"| {fam} | {v['declared']} | {'yes' if v['verified'] else 'NO'} | "
                     f"{v.get('pipeline_declared', False)} | {'yes' if v.get('pipeline_verified') else 'NO'} |")
    failed = [r for r in matrix["rows"] if r["result"] == "fail"]
    if failed:
        lines += ["", "Failures:", ""] + [f"- {r['family']}-{r['size']} {r['check']}: {r['detail']}" for r in failed]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m libreyolo.graphs.parity", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the matrix as JSON here")
    ap.add_argument("--md", type=Path, help="write the matrix as a Markdown table here")
    ap.add_argument("--family", nargs="*", help="families to check (default: all registered)")
    ap.add_argument("--sizes", nargs="*", help="sizes to check (default: all)")
    ap.add_argument("--imgsz", nargs=2, type=int, default=[640, 320], metavar=("BIG", "SMALL"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--emulate", action="store_true",
                    help="run on the CPU with the emulated backend (checks the harness, not CUDA)")
    args = ap.parse_args(argv)
    factory = None
    device = "cuda"
    if args.emulate:
        from libreyolo.graphs.backend import EmulatedGraphBackend

        factory, device = EmulatedGraphBackend, "cpu"
    elif not torch.cuda.is_available():
        print("no CUDA device: the parity matrix needs a GPU (use --emulate to check the harness on the CPU)",
              file=sys.stderr)
        return 2
    matrix = run_matrix(args.family, args.sizes, device=device, imgszs=args.imgsz, seed=args.seed,
                        backend_factory=factory)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(matrix, indent=1) + "\n")
    md = to_markdown(matrix)
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(md)
    print(md)
    return 0 if all(v["verified"] and (v["pipeline_verified"] or not v["pipeline_declared"])
                    for v in matrix["families"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
