"""Survey of the export validator's power: correct artifacts at many seeds and gains must pass,
every mutation must be refused. Prints a table and writes JSON (the figures in docs/export.md).

    python tools/validation_survey.py --seeds 3 --formats onnx --json bench/results/<date>-validation-survey-cpu.json

Per case it records the eager model's measured float32 drift (against float64) per output group,
the artifact's worst error relative to its allowance (``ratio``; > 1 is refused) and, for
correct artifacts, the largest ratio of the artifact's own float64 error to the eager model's
(what the multiple ``FLOAT32_MULTIPLE`` must cover).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    import torch

    from libreyolo import __version__
    from libreyolo.export.compare import compare
    from libreyolo.utils.tolerance import FLOAT32_MULTIPLE
    from tests import mutations

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3, help="seeds per family and gain")
    p.add_argument("--families", default=",".join(mutations.CASES))
    p.add_argument("--formats", default="onnx", help="onnx,executorch")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    suffix = {"onnx": ".onnx", "executorch": ".pte"}
    rows, start = [], time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in args.formats.split(","):
            for family in args.families.split(","):
                for seed in range(args.seeds):
                    for high in (False, True):
                        model = mutations.seeded(family, 100 + seed, high)
                        out = Path(tmp) / f"{family}-{seed}-{high}{suffix[fmt]}"
                        report = model.export(format=fmt, imgsz=model.imgsz, output=out, validate=False, verbose=False)
                        v = compare(model, report.path)
                        raw = [c for c in v.checks if "float64_error" in c]
                        own = max((c["float64_error"] / max(c["eager_float64_error"], 1e-30) for c in raw), default=0.0)
                        rows.append({"format": fmt, "family": family, "seed": 100 + seed, "high_gain": high,
                                     "case": "true weights", "status": v.status,
                                     "ratio": mutations.worst_ratio(v), "artifact_vs_eager_float64_error": own,
                                     "drift": v.drift.get("float32", {})})
                        print(_line(rows[-1]), flush=True)
                        for name, mutate in mutations.MODEL_MUTATIONS.items():
                            wrong = mutate(model)
                            bad = Path(tmp) / f"bad{suffix[fmt]}"
                            wrong.export(format=fmt, imgsz=model.imgsz, output=bad, validate=False, verbose=False)
                            v = compare(model, bad)
                            rows.append({"format": fmt, "family": family, "seed": 100 + seed, "high_gain": high,
                                         "case": name, "status": v.status, "ratio": mutations.worst_ratio(v),
                                         "decoded_failed": sum(not d["passed"] for d in v.detections)})
                            print(_line(rows[-1]), flush=True)
    true = [r for r in rows if r["case"] == "true weights"]
    wrong = [r for r in rows if r["case"] != "true weights"]
    summary = {"false_refusals": sum(r["status"] != "passed" for r in true), "correct_artifacts": len(true),
               "false_acceptances": sum(r["status"] != "failed" for r in wrong), "wrong_artifacts": len(wrong),
               "largest_true_ratio": max((r["ratio"] for r in true), default=0.0),
               "largest_own_error_ratio": max((r["artifact_vs_eager_float64_error"] for r in true), default=0.0),
               "smallest_wrong_ratio": min((r["ratio"] for r in wrong), default=0.0),
               "float32_multiple": FLOAT32_MULTIPLE}
    print(json.dumps(summary, indent=1))
    if args.json:
        record = {"command": " ".join(sys.argv), "machine": platform.processor() or platform.machine(),
                  "torch": torch.__version__, "libreyolo": __version__, "threads": torch.get_num_threads(),
                  "seconds": round(time.time() - start, 1), "summary": summary, "rows": rows}
        Path(args.json).write_text(json.dumps(record, indent=1, default=str))
    return 0 if summary["false_refusals"] == 0 and summary["false_acceptances"] == 0 else 1


def _line(r: dict) -> str:
    gain = "high" if r["high_gain"] else "normal"
    own = r.get("artifact_vs_eager_float64_error")
    extra = f"  own/eager float64 error {own:.2f}" if own is not None else ""
    return (f"{r['format']:<11}{r['family']:<8}{r['seed']:<5}{gain:<7}{r['case']:<28}{r['status']:<8}"
            f"ratio {r['ratio']:.3g}{extra}")


if __name__ == "__main__":
    raise SystemExit(main())
