"""The serving issue's Targets, each next to the reference's figure, from one recorded run's files.

    python3 bench/serving_targets.py --dir OUT --json OUT/<date>-serving-targets-<gpu>.json \\
        --md OUT/<date>-serving-targets-<gpu>.md

Reads what ``bash bench/run_h200.sh t26a|t26b|t26c OUT`` left in ``OUT`` (the newest file of each
kind): ``serving_bench`` (YOLOv9-t workloads and the families at batch 1, 8 and 32 with the reference),
``stream_bench`` (b32 fp16 ``stream=True`` from host arrays, sparse and dense, and from JPEG files, with
the reference), ``compile_bench`` (batch 1 fp16: graphs, ``compile=True``, both), ``aoti_autotune_bench``
(the autotuned ``.pt2``), the GPU tests' logs and the graph parity matrix. Each Target gets our figure,
the goal, the reference's figure where it has one, whether it is met, the floor under our figure where
one was measured (the network alone: what the rest of the pipeline cannot go below), and the file it
comes from. Nothing is measured here; a figure the run did not produce is ``None`` and its Target
"not measured", never met.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def newest(folder: Path, pattern: str) -> Path | None:
    files = sorted(folder.glob(pattern), key=lambda p: p.stat().st_mtime)
    return files[-1] if files else None


def load(path: Path | None) -> dict:
    return json.loads(path.read_text()) if path and path.is_file() else {}


def _round(v: float | None, nd: int = 3) -> float | None:
    return None if v is None else round(v, nd)


def _best(values: list[float | None], high: bool) -> float | None:
    known = [v for v in values if v is not None]
    return (max if high else min)(known) if known else None


class Targets:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, target: str, ours: float | None, goal: float | None, unit: str, *, higher: bool = False,
            reference: float | None = None, floor: float | None = None, source: str = "",
            note: str = "") -> None:
        met = None if ours is None or goal is None else (ours >= goal if higher else ours <= goal)
        self.rows.append({"target": target, "ours": ours, "goal": f"{'>=' if higher else '<='} {goal or '?'} {unit}",
                          "met": met, "reference": reference, "floor": floor, "unit": unit,
                          "source": source, "note": note})


def stream_targets(t: Targets, arrays: dict, dense: dict, jpeg: dict, names: dict[str, str]) -> None:
    for label, data, key in (("sparse", arrays, "arrays"), ("dense", dense, "dense")):
        rows = [r for r in data.get("rows", []) if r["source"] == "arrays" and r["cuda_graph"]]
        ref = [r.get("images_per_s") for r in data.get("peer", {}).get("rows", []) if r["source"] == "arrays"]
        t.add(f"yolo9-t {label}, b32 fp16, host uint8 arrays, stream=True end to end",
              _best([r["images_per_s"] for r in rows], True), 3000, "images/s", higher=True,
              reference=_best(ref, True), floor=(data.get("forward_images_per_s") or {}).get("graph=True"),
              source=names[key], note=", ".join(f"{r['path']} w{r['workers']}: {r['images_per_s']}" for r in rows))
    rows = [r for r in jpeg.get("rows", []) if r["source"].startswith("jpeg") and r["cuda_graph"]]
    ref = [r.get("images_per_s") for r in jpeg.get("peer", {}).get("rows", []) if r["source"] == "jpeg"]
    decode = jpeg.get("decode_alone", {})
    t.add("yolo9-t sparse, b32 fp16, JPEG files on disk, stream=True end to end",
          _best([r["images_per_s"] for r in rows], True), 2000, "images/s", higher=True,
          reference=_best(ref, True), floor=decode.get("decode_images_per_s"), source=names["jpeg"],
          note="floor: nvJPEG decoding alone; " + ", ".join(
              f"{r['source']} {r['path']} w{r['workers']}: {r['images_per_s']}" for r in rows))


def b1_targets(t: Targets, serving: dict, compiled: dict, aoti: dict, names: dict[str, str]) -> None:
    ours = {(r["workload"], r["precision"], r["batch"]): r for r in serving.get("ours", [])}
    ref = {(r["workload"], r["precision"], r["batch"]): r for r in serving.get("peer", {}).get("workloads", [])}
    s16 = ours.get(("sparse", "fp16", 1), {})
    ref16 = ref.get(("sparse", "fp16", 1), {}).get("predict_graph_ms")
    t.add("yolo9-t b1 fp16 graphed predict (not compiled)", s16.get("predict_graph_ms"), 3.0, "ms",
          reference=ref16, floor=s16.get("forward_graph_ms"), source=names["serving"],
          note=f"stages {s16.get('speed_graph_ms')}")
    crow = {(r["row"], r["batch"]): r for r in compiled.get("rows", [])}
    t.add("yolo9-t b1 fp16 compile=True (reduce-overhead, no cuda_graph)",
          crow.get(("compile:reduce-overhead", 1), {}).get("median_ms"), 2.0, "ms", reference=ref16,
          source=names["compile"], note=f"graph row in the same process: {crow.get(('graph', 1), {}).get('median_ms')}")
    t.add("yolo9-t b1 fp16 compile=True inside cuda_graph=True",
          crow.get(("graph+compile:default", 1), {}).get("median_ms"), 2.0, "ms", reference=ref16,
          source=names["compile"])
    rows = aoti.get("rows", {})
    t.add("autotuned .pt2 (yolo9-t sparse fp16 b1) predict replayed in our graph",
          rows.get("aoti_autotune_fp16_graph_ms"), 1.5, "ms", reference=ref16, source=names["aoti"],
          note=f"export {rows.get('export_s')} s (compile {rows.get('build', {}).get('compile_s')} s), validation "
               f"{rows.get('validation')}; through the package without our graph {rows.get('aoti_autotune_fp16_ms')}"
               f" ms; the eager model's graphed fp16 predict in that process {rows.get('eager_model_graph_fp16_ms')}"
               " ms; reference: its graphed fp16 b1 predict of the same weights")
    for key, r in sorted(ours.items()):
        if r["batch"] == 1 and r.get("predict_graph_ms") and r.get("forward_graph_ms"):
            t.add(f"yolo9-t {key[0]} {key[1]} b1: graphed predict <= 1.3x graphed forward", r["predict_graph_ms"],
                  round(1.3 * r["forward_graph_ms"], 3), "ms", floor=r["forward_graph_ms"], source=names["serving"])


def family_targets(t: Targets, serving: dict, names: dict[str, str]) -> None:
    ref = {(r["family"], r.get("precision", "fp32"), r.get("batch", 1)): r
           for r in serving.get("peer", {}).get("families", [])}
    wref = {(r["workload"], r["precision"], r["batch"]): r for r in serving.get("peer", {}).get("workloads", [])}
    rows = [(r["family"], r, ref.get((r["family"], r["precision"], r["batch"]), {}))
            for r in serving.get("ours_families", [])]
    rows += [(f"yolo9-t {r['workload']}", r, wref.get((r["workload"], r["precision"], r["batch"]), {}))
             for r in serving.get("ours", []) if r["workload"] in ("sparse", "dense")]
    for name, r, p in rows:
        g, rg, mode = r.get("predict_graph_ms"), p.get("predict_graph_ms"), "graphed"
        if rg is None and p.get("predict_graph_error") and p.get("predict_eager_ms"):
            rg, mode = p["predict_eager_ms"], "eager (its cuda_graph refused this family)"
        t.add(f"{name} {r['precision']} b{r['batch']} graphed predict <= 0.5x reference", g,
              round(rg / 2, 3) if rg else None, "ms", reference=rg, floor=r.get("forward_graph_ms"),
              source=names["serving"], note=f"ratio {_round(g / rg) if g and rg else None}; reference {mode}")
        if r["batch"] == 1 and g and r.get("forward_graph_ms") and "yolo9-t" not in name:
            t.add(f"{name} {r['precision']} b1: graphed predict <= 1.3x graphed forward", g,
                  round(1.3 * r["forward_graph_ms"], 3), "ms", floor=r["forward_graph_ms"], source=names["serving"])


def test_targets(t: Targets, folder: Path, parity: dict, names: dict[str, str]) -> None:
    for log in sorted(folder.glob("*gpu-tests*t26*.log")):
        text = log.read_text(errors="replace")
        summary = re.findall(r"^=*\s*(\d+ (?:passed|failed|errors?)\b.*?) in [\d.]+s", text, re.M)
        failed = re.search(r"(\d+) (failed|error)", summary[-1]) if summary else None
        t.rows.append({"target": f"GPU tests ({log.name})", "ours": summary[-1] if summary else "no summary",
                       "goal": "all pass", "met": bool(summary) and failed is None, "reference": None,
                       "floor": None, "unit": "", "source": log.name, "note": ""})
    if parity:
        results = [r["result"] for r in parity.get("rows", [])]
        bad = [f"{r['family']}-{r['size']} {r['check']}" for r in parity.get("rows", []) if r["result"] == "fail"]
        t.rows.append({"target": "graph parity matrix (replayed forward bit for bit eager)",
                       "ours": f"{results.count('pass')} pass, {results.count('skip')} skip, {len(bad)} fail",
                       "goal": "no fail", "met": bool(results) and not bad, "reference": None, "floor": None,
                       "unit": "", "source": names["parity"], "note": f"failed: {bad}" if bad else ""})


def markdown(rows: list[dict], header: dict) -> str:
    lines = [f"# Serving targets: {header.get('device')} (torch {header.get('torch')})", "",
             "| target | ours | goal | met | reference | floor (network alone) | source |",
             "|---|---:|---|---|---:|---:|---|"]
    for r in rows:
        met = {True: "met", False: "**missed**", None: "not measured"}[r["met"]]
        lines.append(f"| {r['target']} | {r['ours']} | {r['goal']} | {met} | {r['reference'] or '-'} | "
                     f"{r['floor'] or '-'} | {r['source']} |")
    notes = [f"- {r['target']}: {r['note']}" for r in rows if r.get("note")]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, required=True, help="the run's output folder")
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args(argv)
    files = {"serving": "*serving-t26*.json", "arrays": "*stream-t26-arrays*.json", "dense": "*stream-t26-dense*.json",
             "jpeg": "*stream-t26-jpeg*.json", "compile": "*compile-t26*.json", "aoti": "*aoti-autotune-t26*.json",
             "parity": "*graph-parity-t26*.json"}
    paths = {k: newest(args.dir, v) for k, v in files.items()}
    names = {k: p.name if p else f"(no {v})" for (k, v), p in zip(files.items(), paths.values(), strict=True)}
    data = {k: load(p) for k, p in paths.items()}
    t = Targets()
    stream_targets(t, data["arrays"], data["dense"], data["jpeg"], names)
    b1_targets(t, data["serving"], data["compile"], data["aoti"], names)
    family_targets(t, data["serving"], names)
    test_targets(t, args.dir, data["parity"], names)
    header = {k: data["serving"].get(k) for k in ("device", "torch", "cuda")}
    report = {**header, "files": names, "targets": t.rows,
              "summary": {"met": sum(r["met"] is True for r in t.rows),
                          "missed": sum(r["met"] is False for r in t.rows),
                          "not_measured": sum(r["met"] is None for r in t.rows)}}
    from bench.report_json import write_json

    write_json(args.json, report)
    if args.md:
        args.md.write_text(markdown(t.rows, header))
    for r in t.rows:
        flag = {True: "met", False: "MISSED", None: "n/a"}[r["met"]]
        print(f"{flag:>6}  {r['target']}: ours {r['ours']} (goal {r['goal']}; reference {r['reference']}; "
              f"floor {r['floor']})")
    print(report["summary"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
