"""What an export reports: where the artifact is, and how it compared with eager."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# what to do when raw outputs differ but every decoded prediction matches
_ADVICE_RAW_ONLY = (
    "every decoded prediction matches the eager model; only raw outputs are beyond the measured float32 noise. "
    "Keep the file, run `libreyolo compare model=<checkpoint> artifact=<file>` for the full report, and report "
    "both to the LibreYOLO issue tracker (`validate=False` writes the artifact unchecked, at your own risk)")
_ADVICE_DECODED = ("the artifact's predictions differ from the eager model's: do not ship it. Check that it was "
                   "exported from this checkpoint (`libreyolo compare model=<checkpoint> artifact=<file>`), and "
                   "report a reproducible case if it was")


@dataclass(init=False)
class ValidationReport:
    """``status``: "passed", "failed", "not validated" (the runtime cannot run here) or "skipped".

    ``checks``: one entry per probe, output and output group (raw outputs against a float64 copy of
    the eager model, :mod:`libreyolo.utils.tolerance`); ``decoded``: decoded comparisons by the
    task's matcher (``detections`` is the same list, its name from before tasks were plugins);
    ``drift``: the eager model's measured drift per group ("float32" against float64, and "fp16"
    against float32 for fp16 artifacts), relative to each element's scale.
    """

    status: str
    reason: str = ""
    runtime: str = ""
    checks: list[dict[str, Any]] = field(default_factory=list)      # raw output comparisons
    decoded: list[dict[str, Any]] = field(default_factory=list)  # decoded comparisons (the task's matcher)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    drift: dict[str, dict[str, float]] = field(default_factory=dict)

    def __init__(self, status: str, reason: str = "", runtime: str = "", checks: list | None = None,
                 decoded: list | None = None, notes: list | None = None, seconds: float = 0.0,
                 drift: dict | None = None, *, detections: list | None = None) -> None:
        self.status, self.reason, self.runtime, self.seconds = status, reason, runtime, seconds
        self.checks = list(checks or [])
        self.decoded = list(decoded if decoded is not None else detections or [])
        self.notes = list(notes or [])
        self.drift = dict(drift or {})
        self.extra_lines: list[str] = []  # lines of further checks (the INT8 accuracy gate)
        self.findings: dict[str, Any] = {}  # measurements a format adds (Exporter.after_validation)

    @property
    def detections(self) -> list[dict[str, Any]]:
        """The decoded comparisons (:attr:`decoded`), under their name from before tasks were plugins."""
        return self.decoded

    @detections.setter
    def detections(self, value: list[dict[str, Any]]) -> None:
        self.decoded = value

    @classmethod
    def not_run(cls, reason: str) -> ValidationReport:
        return cls("not validated", reason=reason)

    @classmethod
    def skipped(cls) -> ValidationReport:
        return cls("skipped", reason="validate=False was passed")

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def _raw(self) -> list[dict[str, Any]]:
        return [c for c in self.checks if c.get("kind") != "input"]

    def worst_check(self) -> dict[str, Any] | None:
        """The raw check nearest to (or furthest past) its allowance: failed checks first."""
        raw = self._raw()
        if not raw:
            return None
        return max(raw, key=lambda c: (not c["passed"], _num(c.get("ratio", 0.0))))

    def worst(self) -> dict[str, float]:
        """Largest errors and smallest cosine over all raw checks: ``max_abs_error`` (artifact against
        eager float32), ``artifact_float64_error`` / ``eager_float64_error`` (each against the float64
        copy), ``worst_ratio`` (the largest error relative to its allowance)."""
        raw = self._raw()
        if not raw:  # embedded NMS: the outputs are compared as matched detections
            if not self.decoded:
                return {}
            return {"max_abs_error": max(d.get("max_box_error", 0.0) for d in self.decoded),
                    "max_conf_diff": max(d["max_conf_diff"] for d in self.decoded)}
        worst_ratio = max(_num(c.get("ratio", 0.0)) for c in raw)
        raw = [c for c in raw if "max_abs_error" in c] or raw  # INT8 error distributions carry a ratio only
        out = {"max_abs_error": max(c.get("max_abs_error", 0.0) for c in raw),
               "min_cosine": min(c.get("cosine", 1.0) for c in raw), "worst_ratio": worst_ratio}
        if all("float64_error" in c for c in raw):
            out["artifact_float64_error"] = max(c["float64_error"] for c in raw)
            out["eager_float64_error"] = max(c["eager_float64_error"] for c in raw)
        return out

    def _decoded_summary(self) -> str:
        if not self.decoded:
            return ""
        what = next((d["what"] for d in self.decoded if "what" in d), "detections")
        accounted = sum(d.get("accounted", d["matched"] + d.get("tie_swaps", 0)) for d in self.decoded)
        total = sum(max(d["eager"], d["artifact"]) for d in self.decoded)
        swaps = sum(d.get("tie_swaps", 0) for d in self.decoded)
        cascade = sum(d.get("swap_cascade", 0) for d in self.decoded)
        extra = []
        if swaps:
            extra.append(f"{swaps} by tie swaps" + (f", {cascade} decided by them" if cascade else ""))
        return f"{what} matched {accounted}/{total}" + (f" ({'; '.join(extra)})" if extra else "")

    def headline(self) -> str:
        if self.status in ("not validated", "skipped"):
            return f"{self.status}: {self.reason}"
        parts = []
        w, worst = self.worst(), self.worst_check()
        if worst is not None:
            parts.append(f"worst raw element at {_num(worst.get('ratio', 0.0)):.2f}x its allowance "
                         f"({worst['probe']}, {worst.get('group', worst['output'])})")
            if "artifact_float64_error" in w:
                parts.append(f"largest error from float64: artifact {w['artifact_float64_error']:.3g}, "
                             f"eager float32 {w['eager_float64_error']:.3g}")
            parts.append(f"min cosine {w['min_cosine']:.8f}")
        elif w:
            parts.append(f"max score diff {w.get('max_conf_diff', 0):.2g} (matched detections)")
        decoded = self._decoded_summary()
        if decoded:
            parts.append(decoded)
        return f"{self.status} ({self.runtime}): " + ", ".join(parts)

    def advice(self) -> str:
        """What to do about a failure ('' when it passed)."""
        if self.status != "failed":
            return ""
        if self.decoded and all(d["passed"] for d in self.decoded):
            return _ADVICE_RAW_ONLY
        return _ADVICE_DECODED

    def text(self) -> str:
        lines = [f"validation: {self.headline()}"]
        for c in self.checks:
            mark = "ok " if c["passed"] else "BAD"
            label = f"{c['output']}" + (f" [{c['group'].split('/')[-1]}]" if "/" in str(c.get("group", "")) else "")
            if "line" in c:  # a check that says how it reads (the INT8 quantization parameters)
                lines.append(f"  {mark} {c['probe']:<16} {label:<22} {c['line']}")
                continue
            if "shape" in c:
                lines.append(f"  {mark} {c['probe']:<16} {label:<22} {c['shape']}")
                continue
            if c.get("kind") == "input":
                lines.append(f"  {mark} {c['probe']:<16} {label:<22} identical to the eager model's input tensor")
                continue
            lines.append(f"  {mark} {c['probe']:<16} {label:<22} {_num(c.get('ratio', 0.0)):.2f}x allowance "
                         f"(from float64: artifact {c.get('float64_error', 0):.3g}, eager "
                         f"{c.get('eager_float64_error', 0):.3g}; vs eager {c['max_abs_error']:.3g})  "
                         f"cosine {c['cosine']:.8f}")
            if not c["passed"] and "index" in c:
                lines.append(f"      element {c['index']}: eager {c['eager']:.7g}, artifact {c['artifact']:.7g}, "
                             f"float64 {c['float64']:.7g}, allowed {c['allowed']:.3g}"
                             + (f"; cosine below {c['min_cosine']:.8f}" if c["cosine"] < c["min_cosine"] else ""))
        for d in self.decoded:
            mark = "ok " if d["passed"] else "BAD"
            if "line" in d:  # the matcher says how its comparison reads (classes, pixels, ...)
                lines.append(f"  {mark} {d['probe']:<16} {d['line']}")
                continue
            lines.append(f"  {mark} {d['probe']:<16} detections eager {d['eager']} artifact {d['artifact']} "
                         f"matched {d['matched']}" + (f" + {d['tie_swaps']} tie swaps" if d.get("tie_swaps") else "")
                         + (f" (+{d['swap_cascade']} decided by them)" if d.get("swap_cascade") else "")
                         + f" (min IoU {d['min_iou']:.4f}, max conf diff {d['max_conf_diff']:.2g})")
        lines += list(self.extra_lines)
        lines += [f"  note: {n}" for n in self.notes]
        if self.advice():
            lines.append(f"  what to do: {self.advice()}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason, "runtime": self.runtime, "summary": self.headline(),
                **_finite(self.worst()), "checks": [_finite(c) for c in self.checks],
                "decoded": [_finite(d) for d in self.decoded], "notes": self.notes,
                "drift": self.drift, "seconds": round(self.seconds, 3),
                **({"findings": self.findings} if self.findings else {})}


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) else 0.0


def _finite(entry: dict[str, Any]) -> dict[str, Any]:
    """JSON has no infinity: non-finite numbers are stored as strings ("inf")."""
    return {k: (str(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in entry.items()}


@dataclass
class ExportReport(os.PathLike):
    """The result of an export. ``str(report)`` and ``os.fspath(report)`` give the artifact path."""

    path: Path
    format: str
    validation: ValidationReport
    metadata: dict[str, Any]
    seconds: float = 0.0

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)

    @property
    def size_bytes(self) -> int:
        p = Path(self.path)
        if p.is_dir():
            return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        return p.stat().st_size if p.exists() else 0

    def text(self) -> str:
        import shlex

        mib = self.size_bytes / 2**20
        return (f"exported {self.format}: {self.path} ({mib:.1f} MiB, {self.seconds:.1f} s)\n"
                f"{self.validation.text()}\n"
                f"run it: libreyolo predict model={shlex.quote(str(self.path))} source=<image or folder>")
