"""What an export reports: where the artifact is, and how it compared with eager."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class ValidationReport:
    """``status``: "passed", "failed", "not validated" (the runtime cannot run here) or "skipped"."""

    status: str
    reason: str = ""
    runtime: str = ""
    checks: list[dict[str, Any]] = field(default_factory=list)      # raw output comparisons
    detections: list[dict[str, Any]] = field(default_factory=list)  # decoded comparisons
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @classmethod
    def not_run(cls, reason: str) -> ValidationReport:
        return cls("not validated", reason=reason)

    @classmethod
    def skipped(cls) -> ValidationReport:
        return cls("skipped", reason="validate=False was passed")

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def worst(self) -> dict[str, float]:
        """Largest max-abs error and smallest cosine over all raw checks."""
        if not self.checks:  # embedded NMS: the outputs are compared as matched detections
            if not self.detections:
                return {}
            return {"max_abs_error": max(d.get("max_box_error", 0.0) for d in self.detections),
                    "max_conf_diff": max(d["max_conf_diff"] for d in self.detections)}
        return {"max_abs_error": max(c["max_abs_error"] for c in self.checks),
                "min_cosine": min(c["cosine"] for c in self.checks)}

    def headline(self) -> str:
        if self.status in ("not validated", "skipped"):
            return f"{self.status}: {self.reason}"
        w = self.worst()
        matched = sum(d["matched"] + d.get("tie_swaps", 0) for d in self.detections)
        total = sum(max(d["eager"], d["artifact"]) for d in self.detections)
        close = (f"min cosine {w['min_cosine']:.8f}" if "min_cosine" in w
                 else f"max score diff {w.get('max_conf_diff', 0):.2g} (matched detections)")
        what = "top-k classes" if any(d.get("kind") == "classes" for d in self.detections) else "detections"
        return (f"{self.status} ({self.runtime}): max abs error {w.get('max_abs_error', 0):.3g}, {close}, "
                f"{what} matched {matched}/{total}")

    def text(self) -> str:
        lines = [f"validation: {self.headline()}"]
        for c in self.checks:
            mark = "ok " if c["passed"] else "BAD"
            worst = (f"worst {c['worst_error']:.3g} where {c['allowed']:.3g} allowed" if "worst_error" in c
                     else f"allowed {c['allowed']:.3g}")
            lines.append(f"  {mark} {c['probe']:<16} {c['output']:<15} max abs {c['max_abs_error']:.3g} "
                         f"({worst})  cosine {c['cosine']:.8f}")
        for d in self.detections:
            mark = "ok " if d["passed"] else "BAD"
            if d.get("kind") == "classes":
                lines.append(f"  {mark} {d['probe']:<16} top-{d['eager']} classes equal at {d['matched']}/{d['eager']}"
                             + (f" + {d['tie_swaps']} near-tie swaps" if d.get("tie_swaps") else "")
                             + f" (max probability diff {d['max_conf_diff']:.2g})")
                continue
            lines.append(f"  {mark} {d['probe']:<16} detections eager {d['eager']} artifact {d['artifact']} "
                         f"matched {d['matched']}" + (f" + {d['tie_swaps']} tie swaps" if d.get("tie_swaps") else "")
                         + (f" (+{d['swap_cascade']} decided by them)" if d.get("swap_cascade") else "")
                         + f" (min IoU {d['min_iou']:.4f}, max conf diff {d['max_conf_diff']:.2g})")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason, "runtime": self.runtime, "summary": self.headline(),
                **self.worst(), "checks": self.checks, "detections": self.detections, "notes": self.notes,
                "seconds": round(self.seconds, 3)}


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
        mib = self.size_bytes / 2**20
        return (f"exported {self.format}: {self.path} ({mib:.1f} MiB, {self.seconds:.1f} s)\n"
                f"{self.validation.text()}\n"
                f"run it: libreyolo predict model={self.path} source=<image or folder>")
