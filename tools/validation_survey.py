"""Survey of the export validator's power: correct artifacts at many seeds and gains must pass,
every mutation must be refused. Prints a table and writes JSON (the figures in docs/export.md).

    python tools/validation_survey.py --seeds 3 --formats onnx --json bench/results/<date>-validation-survey-cpu.json
    python tools/validation_survey.py --formats aoti --device cuda --half --mutations scale  # fp16 on a GPU
    python tools/validation_survey.py --checkpoints a.pt,b.pt --imgsz 320 ...  # checkpoints instead

Per case it records the eager model's measured float32 drift (against float64) per output group,
the artifact's worst error relative to its allowance (``ratio``; > 1 is refused), split into the
element-by-element checks and the error-distribution checks over all probes, and, for correct
artifacts, the largest ratio of the artifact's own float64 error to the eager model's (what the
multiple ``ELEMENT_MULTIPLE`` must cover). Wrong artifacts: the model mutations (a re-export each)
and, with no re-export, the correct artifact's outputs scaled by 1.001 and 1.0001 at run time.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    import torch

    from libreyolo import __version__
    from libreyolo.export.compare import compare
    from libreyolo.export.formats import FORMAT_TABLE
    from libreyolo.utils.tolerance import ELEMENT_MULTIPLE, FLOAT32_MULTIPLE
    from tests import mutations

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3, help="seeds per family and gain")
    p.add_argument("--families", default=",".join(mutations.CASES))
    p.add_argument("--first-seed", type=int, default=100)
    p.add_argument("--formats", default="onnx", help="onnx,executorch,aoti")
    p.add_argument("--device", default="cpu")
    p.add_argument("--half", action="store_true", help="fp16 artifacts (CUDA)")
    p.add_argument("--gains", default="normal,high")
    p.add_argument("--mutations", default="all", help="all (model mutations and output scales), scale, or none")
    p.add_argument("--checkpoints", default=None,
                   help="comma list of checkpoints to survey instead of the seeded untrained models (e.g. the "
                        "compatibility fixtures: untrained seeded models can leave float16's range)")
    p.add_argument("--imgsz", type=int, default=None, help="with --checkpoints: export size (default: the model's)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    suffix = {f.name: f.suffix for f in FORMAT_TABLE}  # the format table
    kw = {"device": args.device, **({"half": True} if args.half else {})}
    rows, start = [], time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in args.formats.split(","):
            for family, seed, high, model in _models(args, mutations):
                imgsz = args.imgsz if args.checkpoints and args.imgsz else model.imgsz
                out = Path(tmp) / f"{family}-{seed}-{high}{suffix[fmt]}"
                report = model.export(format=fmt, imgsz=imgsz, output=out, validate=False, verbose=False,
                                      **kw)
                v = compare(model, report.path)
                # the artifact's error in units of the eager model's drift (the floor included,
                # so an upper bound): what ELEMENT_MULTIPLE must cover
                own = _verdict(v)["element_ratio"] * ELEMENT_MULTIPLE
                case = {"format": fmt, "family": family, "seed": seed, "high_gain": high,
                        "device": args.device, "half": args.half}
                rows.append({**case, "case": "true weights", **_verdict(v),
                             "artifact_vs_eager_float64_error": own, "drift": v.drift})
                print(_line(rows[-1]), flush=True)
                wrongs = []
                if args.mutations in ("all", "scale"):
                    wrongs += [(f"outputs x{1 + eps:g}", _scaled(report.path, args.device, eps))
                               for eps in (1e-3, 1e-4)]
                if args.mutations == "all":
                    for name, mutate in mutations.MODEL_MUTATIONS.items():
                        bad = Path(tmp) / f"bad-{len(wrongs)}{suffix[fmt]}"
                        mutate(model).export(format=fmt, imgsz=imgsz, output=bad, validate=False,
                                             verbose=False, **kw)
                        wrongs.append((name, bad))
                for name, artifact in wrongs:
                    rows.append({**case, "case": name, **_verdict(compare(model, artifact))})
                    print(_line(rows[-1]), flush=True)
    true = [r for r in rows if r["case"] == "true weights"]
    wrong = [r for r in rows if r["case"] != "true weights"]
    summary = {"false_refusals": sum(r["status"] != "passed" for r in true), "correct_artifacts": len(true),
               "false_acceptances": sum(r["status"] != "failed" for r in wrong), "wrong_artifacts": len(wrong),
               "largest_true_ratio": max((r["ratio"] for r in true), default=0.0),
               "largest_own_error_ratio": max((r["artifact_vs_eager_float64_error"] for r in true), default=0.0),
               "smallest_wrong_ratio": min((r["ratio"] for r in wrong), default=0.0),
               "largest_true_below_top_ratio": max((r["below_top_ratio"] for r in true), default=0.0),
               "element_multiple": ELEMENT_MULTIPLE, "float32_multiple": FLOAT32_MULTIPLE}
    print(json.dumps(summary, indent=1))
    if args.json:
        gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else None
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), None) if Path("/proc/cpuinfo").exists() else None
        versions = {}
        for name in ("onnxruntime", "executorch"):
            try:
                versions[name] = package_version(name)
            except PackageNotFoundError:
                pass
        record = {"command": " ".join(sys.argv), "machine": platform.processor() or platform.machine(), "cpu": cpu,
                  "gpu": gpu, **versions,
                  "torch": torch.__version__, "libreyolo": __version__, "threads": torch.get_num_threads(),
                  "seconds": round(time.time() - start, 1), "summary": summary, "rows": rows}
        Path(args.json).write_text(json.dumps(record, indent=1, default=str))
    return 0 if summary["false_refusals"] == 0 and summary["false_acceptances"] == 0 else 1


def _models(args, mutations):
    """(family, seed or checkpoint name, high gain, model) of each case: the seeded untrained models,
    or the checkpoints given."""
    if args.checkpoints:
        from libreyolo.api import LibreYOLO

        for path in args.checkpoints.split(","):
            model = LibreYOLO(path, device=args.device)
            yield model.family.name, Path(path).stem, False, model
        return
    for family in args.families.split(","):
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for high in [g == "high" for g in args.gains.split(",")]:
                yield family, seed, high, mutations.seeded(family, seed, high).to(args.device)


def _verdict(v) -> dict:
    """Status, worst ratio (all checks, then element-by-element and error-distribution checks apart)
    and the count of failed decoded comparisons of a report."""
    from tests import mutations

    dist = [c for c in v.checks if c.get("probe") == "all probes"]
    return {"status": v.status, "ratio": mutations.worst_ratio(v),
            "element_ratio": max((c.get("ratio", 0.0) for c in v.checks if c not in dist), default=0.0),
            "distribution_ratio": max((c.get("ratio", 0.0) for c in dist), default=0.0),
            # the quantiles below the largest element (the stable part of the distribution)
            "below_top_ratio": max((r for c in dist for q, r in c.get("quantile_ratios", {}).items() if q < 1.0),
                                   default=0.0),
            "decoded_failed": sum(not d["passed"] for d in v.detections)}


def _scaled(path: Path, device: str, eps: float):
    """The artifact at ``path`` loaded, every floating output multiplied by ``1 + eps`` at run time."""
    from libreyolo.api import LibreYOLO

    runtime = LibreYOLO(path, device=device)
    real = runtime._forward

    def forward(batch, **kw):
        return {k: v * (1 + eps) if v.is_floating_point() else v for k, v in real(batch, **kw).items()}
    runtime._forward = forward
    return runtime


def _line(r: dict) -> str:
    gain = "high" if r["high_gain"] else "normal"
    own = r.get("artifact_vs_eager_float64_error")
    extra = f"  artifact error / eager drift <= {own:.2f}" if own is not None else ""
    return (f"{r['format']:<11}{r['family']:<10}{str(r['seed']):<5} {gain:<7}{r['case']:<28}{r['status']:<8}"
            f"ratio {r['ratio']:.3g} (elements {r['element_ratio']:.3g}, distribution {r['distribution_ratio']:.3g}"
            f" / {r['below_top_ratio']:.3g} below the top, "
            f"decoded failed {r['decoded_failed']}){extra}")


if __name__ == "__main__":
    raise SystemExit(main())
