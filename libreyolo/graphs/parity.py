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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

CHECKS = ("eager_deterministic", "probe_uniform", "probe_normal", "probe_ramps", "probe_image", "second_replay",
          "outputs_kept", "interleaved", "batch2", "fp16", "invalidation")


CALIBRATION_SIZE = 256  # large enough that the stride-32 maps are 8x8, small enough for a CPU


def seed_weights(net: torch.nn.Module, seed: int, calibration: torch.Tensor | None = None) -> None:
    """Deterministic weights whose outputs are finite, spread out and depend on the input.

    Random convolutions with made-up BatchNorm statistics either blow up through deep residual
    stacks (Kaiming gain 2 took yolo9-t's neck to 1e7, fp16 to inf) or wash the input out (unit
    gain: outputs for different probes differed by 1e-4). So, given a ``calibration`` batch,
    the BatchNorm running statistics are measured on it (training-mode forward, cumulative
    average): every normalised layer then sees unit-scale activations at any depth.
    """
    g = torch.Generator().manual_seed(seed)
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
            t.copy_(v.to(t.dtype))
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
    seed_weights(model.net, seed, calibration)
    return {k: v.clone() for k, v in model.net.state_dict().items()}


def probes(family, imgsz: int, *, batch: int = 1, device: torch.device, dtype: torch.dtype = torch.float32,
           seed: int = 0) -> dict[str, torch.Tensor]:
    """Inputs from different distributions, each (batch, 3, imgsz, imgsz) in [0, 1]."""
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
    out = {k: v.to(device=device, dtype=dtype) for k, v in out.items()}
    out["image"] = _sample_batch(family, imgsz, batch, device, dtype)
    return out


def _sample_batch(family, imgsz: int, batch: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    from libreyolo import SAMPLE_IMAGE
    from libreyolo.data.sources import load_sources

    img = load_sources(SAMPLE_IMAGE)[0].data.to(device)
    views = [img, img.flip(-1), img.flip(-2), img.transpose(-1, -2)]
    images = [views[i % len(views)].contiguous() for i in range(batch)]
    return family.letterbox(imgsz)(images, dtype=dtype)[0]


_INT_OF = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16,
           torch.float64: torch.int64}


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns: unlike ``torch.equal`` on floats, the same NaN equals itself and
    -0.0 differs from 0.0."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    bits = _INT_OF.get(a.dtype)
    return torch.equal(a.view(bits), b.view(bits)) if bits is not None else torch.equal(a, b)


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[bool, str]:
    if a.keys() != b.keys():
        return False, f"output names differ: {sorted(a)} vs {sorted(b)}"
    diffs = []
    for k in a:
        if a[k].shape != b[k].shape or a[k].dtype != b[k].dtype:
            diffs.append(f"{k}: {tuple(a[k].shape)} {a[k].dtype} vs {tuple(b[k].shape)} {b[k].dtype}")
        elif b[k].is_floating_point() and not bool(torch.isfinite(b[k]).all()):
            # not a graph fault, but a NaN/inf probe proves nothing: fix the weights or the probe
            diffs.append(f"{k}: eager output has {int((~torch.isfinite(b[k])).sum())} non-finite values")
        elif not bit_equal(a[k], b[k]):
            diffs.append(f"{k}: max abs diff {(a[k].double() - b[k].double()).abs().max().item():.3g}")
    return not diffs, "; ".join(diffs)


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
    try:
        model = seeded_model(family_name, size, seed=seed, device=device)
        if backend is not None:
            model._graph_backend = backend
        big, small = imgszs[0], imgszs[-1]

        def eager(x):
            return model._forward(x)

        def graph(x):
            return model._graph_forward(x, True)

        p = {s: probes(family, s, device=device, seed=seed) for s in {big, small}}
        ref = {s: {n: eager(x) for n, x in p[s].items()} for s in p}
        again = [_equal(eager(x), ref[big][n]) for n, x in p[big].items()]
        record("eager_deterministic", all(ok for ok, _ in again), "; ".join(d for _, d in again if d))

        first = None
        for name in ("uniform", "normal", "ramps", "image"):
            out = graph(p[big][name])
            first = out if name == "image" else first
            record(f"probe_{name}", *_equal(out, ref[big][name]))

        checks = [_equal(graph(p[big][n]), ref[big][n]) for n in ("normal", "image", "image", "uniform")]
        record("second_replay", all(ok for ok, _ in checks), "; ".join(d for _, d in checks if d))
        record("outputs_kept", *_equal(first, ref[big]["image"]))

        order = [(small, "image"), (big, "normal"), (small, "ramps"), (big, "image"), (small, "uniform"),
                 (big, "ramps")]
        checks = [_equal(graph(p[s][n]), ref[s][n]) for s, n in order]
        n_graphs = len(model.graph_info()["graphs"])
        ok = all(c for c, _ in checks) and n_graphs == len({big, small})
        record("interleaved", ok, "; ".join(d for _, d in checks if d) or f"{n_graphs} graphs")

        pb = probes(family, small, batch=2, device=device, seed=seed + 1)
        xb = torch.cat([pb["image"][:1], pb["normal"][1:]])
        record("batch2", *_equal(graph(xb), eager(xb)))

        before = model.graph_info()["invalidations"]
        if device.type == "cuda":
            model.half()
            ph = {n: x.half() for n, x in p[small].items()}
            checks = [_equal(graph(ph[n]), eager(ph[n])) for n in ("image", "normal", "image")]
            record("fp16", all(ok for ok, _ in checks), "; ".join(d for _, d in checks if d))
        else:
            record("fp16", None, "fp16 needs CUDA")
            model.net.double()  # any dtype round trip moves every tensor
        model.float()
        moved = model.graph_info()["invalidations"] > before
        # the precision round trip rounded the weights: compare with eager on the new weights
        ok, detail = _equal(graph(p[big]["image"]), eager(p[big]["image"]))
        record("invalidation", moved and ok,
               detail or ("" if moved else "graphs were not dropped after a dtype change"))
    except Exception as exc:  # noqa: BLE001 - a crash is a failed row, the matrix goes on
        record("error", False, f"{type(exc).__name__}: {exc}"[:500])
    finally:
        if model is not None:
            model.release_graphs()
        model = None  # noqa: F841 - drop the network before the next size
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def environment() -> dict[str, Any]:
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
           "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
           "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    from libreyolo import __version__

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
            got = check_family_size(name, size, device=device, imgszs=imgszs, seed=seed,
                                    backend=backend_factory() if backend_factory else None)
            fails = [r["check"] for r in got if r["result"] == "fail"]
            log(f"{name}-{size}: {'FAIL ' + ', '.join(fails) if fails else 'all checks pass'} "
                f"({time.perf_counter() - t0:.1f} s)")
            fam_rows += got
        rows += fam_rows
        verified = bool(fam_rows) and all(r["result"] != "fail" for r in fam_rows)
        verdict[name] = {"task": fam.task, "declared": bool(fam.SUPPORTS_CUDA_GRAPH), "verified": verified}
    return {"schema": 1, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": " ".join(sys.argv),
            "backend": "emulated" if backend_factory else "cuda", "device": str(device), "imgsz": list(imgszs),
            "seed": seed, "environment": environment(), "families": verdict, "rows": rows}


def to_markdown(matrix: dict) -> str:
    env = matrix["environment"]
    lines = ["# CUDA graph parity matrix", "",
             f"Generated by `{matrix['command']}` on {matrix['created']} ({matrix['backend']} backend, "
             f"device {matrix['device']}).", "",
             f"torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, GPU {env['gpu']}, "
             f"libreyolo {env['libreyolo']}; input sizes {matrix['imgsz']}, seed {matrix['seed']}.", "",
             "Each cell: graph output bit-for-bit equal to eager output (pass), not equal (FAIL), "
             "or not run here (skip). Checks are described in `libreyolo/graphs/parity.py`.", ""]
    if matrix["backend"] != "cuda":
        lines += ["**Emulated backend: this verifies the harness only, not CUDA graphs.**", ""]
    checks = [c for c in CHECKS if any(r["check"] == c for r in matrix["rows"])]
    checks += sorted({r["check"] for r in matrix["rows"]} - set(checks))
    mark = {"pass": "pass", "fail": "FAIL", "skip": "skip"}
    lines.append("| family | size | task | " + " | ".join(checks) + " |")
    lines.append("|---" * (3 + len(checks)) + "|")
    cells: dict[tuple, dict[str, str]] = {}
    for r in matrix["rows"]:
        cells.setdefault((r["family"], r["size"], r["task"]), {})[r["check"]] = mark[r["result"]]
    for (fam, size, task), got in cells.items():
        lines.append(f"| {fam} | {size} | {task} | " + " | ".join(got.get(c, "") for c in checks) + " |")
    lines += ["", "| family | SUPPORTS_CUDA_GRAPH | verified here |", "|---|---|---|"]
    for fam, v in matrix["families"].items():
        lines.append(f"| {fam} | {v['declared']} | {'yes' if v['verified'] else 'NO'} |")
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
        print("no CUDA device: the parity matrix needs a GPU (use --emulate to check the harness on the CPU)")
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
    return 0 if all(v["verified"] for v in matrix["families"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
