"""bench/int8_bench.py's report: the summary of one run against the INT8 goals, and its printed table."""
from __future__ import annotations

import math
from typing import Any

GOAL = {"size_ratio": 3.5, "speed_ratio": 1.5, "max_map_drop": 0.02}


def _ms(row: dict | None, key: str) -> float | None:
    r = (row or {}).get(key)
    return r.get("median_ms") if isinstance(r, dict) else None


def _init_mib(row: dict | None) -> float | None:
    a = (row or {}).get("anatomy")
    return sum(a["initializer_mib"].values()) if isinstance(a, dict) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def summary(rows: dict, trained: bool) -> dict[str, Any]:
    f, q, o = rows.get("onnx fp32"), rows.get("onnx int8"), rows.get("ort quantize_static")
    pf, pq = rows.get("pte fp32"), rows.get("pte int8")
    s: dict[str, Any] = {
        "onnx_size_ratio": _ratio((f or {}).get("mib"), (q or {}).get("mib")),
        "onnx_initializer_ratio": _ratio(_init_mib(f), _init_mib(q)),  # weights alone, without the graph
        "onnx_predict_speed_ratio": _ratio(_ms(f, "predict"), _ms(q, "predict")),
        "onnx_raw_speed_ratio": _ratio(_ms(f, "raw_session_run"), _ms(q, "raw_session_run")),
        "ort_static_size_ratio": _ratio((f or {}).get("mib"), (o or {}).get("mib")),
        "ort_static_raw_speed_ratio": _ratio(_ms(f, "raw_session_run"), _ms(o, "raw_session_run")),
        "ort_static_predict_speed_ratio": _ratio(_ms(f, "predict"), _ms(o, "predict")),
        "pte_size_ratio": _ratio((pf or {}).get("mib"), (pq or {}).get("mib")),
        "pte_predict_speed_ratio": _ratio(_ms(pf, "predict"), _ms(pq, "predict")),
    }
    if trained and f and q and isinstance(f.get("mAP50-95"), float) and isinstance(q.get("mAP50-95"), float):
        s["onnx_map_drop"] = f["mAP50-95"] - q["mAP50-95"]
    if trained and f and o and isinstance(f.get("mAP50-95"), float) and isinstance(o.get("mAP50-95"), float):
        s["ort_static_map_drop"] = f["mAP50-95"] - o["mAP50-95"]
    goal: dict[str, Any] = {}
    if s["onnx_size_ratio"] is not None:
        goal["size"] = s["onnx_size_ratio"] >= GOAL["size_ratio"]
    if s["onnx_predict_speed_ratio"] is not None:
        goal["speed"] = s["onnx_predict_speed_ratio"] >= GOAL["speed_ratio"]
    if "onnx_map_drop" in s:
        goal["accuracy"] = s["onnx_map_drop"] <= GOAL["max_map_drop"]
    elif not trained:
        goal["accuracy"] = "n/a (untrained: the gate compares mAP 0 with 0)"
    s["goal_met"] = goal
    return s


# --- output -------------------------------------------------------------------------------------
def _f(v: Any, fmt: str = ".2f") -> str:
    return format(v, fmt) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else "-"


def print_table(result: dict) -> None:
    print(f"\nINT8 on the CPU ({result['cpu']['model']}, {result['threads']['requested']} thread(s)), "
          f"imgsz {result['settings']['imgsz']}, batch 1; latency ms (median / p90)\n")
    print("| model | artifact | MiB | predict() med | p90 | pre / inf / post | raw run med | p90 | mAP50-95 | note |")
    print("|---|---|---:|---:|---:|---|---:|---:|---:|---|")
    for key, m in result["models"].items():
        for tag, r in m.get("rows", {}).items():
            if "not_available" in r:
                print(f"| {key} | {tag} | - | - | - | - | - | - | - | not available: {r['not_available'][:160]} |")
                continue
            p = r.get("predict") or {}
            raw = r.get("raw_session_run") or r.get("raw_method_execute") or {}
            st = p.get("stages_median_ms")
            stages = " / ".join(_f(st.get(k), ".1f") for k in ("preprocess", "inference", "postprocess")) if st else "-"
            note = ""
            gate = r.get("export_gate")
            if gate:
                note = f"gate {gate.get('float', 0):.3f}->{gate.get('int8', 0):.3f}"
                if not m["trained"]:
                    note += " (untrained: 0 vs 0)"
            if str(r.get("validation", "")).startswith("FAILED"):
                note = (note + "; " if note else "") + "validation FAILED: measured unvalidated"
            if tag == "ort quantize_static" and "predict" not in r:
                note = "predict(): not loadable"
            print(f"| {key} | {tag} | {_f(r.get('mib'))} | {_f(p.get('median_ms'), '.1f')} | "
                  f"{_f(p.get('p90_ms'), '.1f')} | {stages} | {_f(raw.get('median_ms'), '.1f')} | "
                  f"{_f(raw.get('p90_ms'), '.1f')} | {_f(r.get('mAP50-95'), '.4f') if m['trained'] else 'n/a'} | "
                  f"{note} |")
    print("\n| model | size fp32/int8 | predict() fp32/int8 | raw fp32/int8 | ORT static: size, raw | mAP drop "
          "(ours, ORT static) | pte size, predict() | goal met (size, speed, acc) |")
    print("|---|---:|---:|---:|---|---|---|---|")
    for key, m in result["models"].items():
        s = m.get("summary") or {}
        g = s.get("goal_met") or {}
        acc = g.get("accuracy")
        print(f"| {key} | {_f(s.get('onnx_size_ratio'))}x | {_f(s.get('onnx_predict_speed_ratio'))}x | "
              f"{_f(s.get('onnx_raw_speed_ratio'))}x | {_f(s.get('ort_static_size_ratio'))}x, "
              f"{_f(s.get('ort_static_raw_speed_ratio'))}x | {_f(s.get('onnx_map_drop'), '+.4f')}, "
              f"{_f(s.get('ort_static_map_drop'), '+.4f')} | {_f(s.get('pte_size_ratio'))}x, "
              f"{_f(s.get('pte_predict_speed_ratio'))}x | {g.get('size', '-')}, {g.get('speed', '-')}, "
              f"{acc if isinstance(acc, bool) else 'n/a'} |")
    print(f"\ngoal: size >= {GOAL['size_ratio']}x, predict() >= {GOAL['speed_ratio']}x faster, mAP50-95 drop <= "
          f"{GOAL['max_map_drop']} (ratios are fp32/int8; untrained YOLOv9-t: speed and size only)")
    errors = [(k, e) for k, m in result["models"].items() for e in m.get("errors", [])]
    if errors:
        print(f"\n{len(errors)} failed step(s): "
              + "; ".join(f"{k} {e['step']}: {e['error'][:200]}" for k, e in errors))
