"""``libreyolo benchmark``: one row per format (eager, CUDA graphs, each artifact format).

For a checkpoint, each selected format is exported through the normal ``model.export(format=...,
imgsz=...)`` path, so every artifact is validated by the normal validator, then loaded by its
runtime, timed with ``predict()`` on the same frames as eager and, with ``data=``, validated on
the dataset with the same ``val()`` as eager. A format that cannot run on this machine gets a row
saying why, without being exported.

Columns: file size, validation status, the largest error against a float64 copy of the eager
model (from the export's validation report, when it records one), mAP50-95 (detect) or top-1
(classify) on ``data``, ms per image and images/s of ``predict()``. A run *fails* (exit status 1
on the command line) when an export does not validate or an artifact's metric is below
``eager - floor``.

With ``int8=True`` (needs ``data=``), each selected format that writes INT8 artifacts
(:attr:`~libreyolo.export.base.Exporter.int8_mode` other than ``"no"``) also gets a
``<format>-int8`` row, exported through ``model.export(format=..., int8=True, data=data)``: its
accuracy gate (the float eager model's and the INT8 artifact's metric on data's val split, the
drop, ``max_drop``, default 0.02) is in the row's ``gate``; such a row fails when the gate refuses the
artifact (the export then writes nothing), and the ``floor`` does not apply to it (the gate's
``max_drop`` is its allowance). An INT8 row that cannot run here says why.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from libreyolo.errors import ArgumentError, LibreYOLOError
from libreyolo.utils.log import LOGGER
from libreyolo.utils.tempfiles import TempGuard

EAGER, CUDA_GRAPH = "eager", "cuda_graph"
INT8_SUFFIX = "-int8"


def _metric_name(model: Any) -> str:
    """The headline metric of the model's task (mAP50-95, top1, mIoU, ...)."""
    from libreyolo.tasks import get_task

    return get_task(model.task).metric


@dataclass
class Row:
    format: str
    status: str                     # reference, timing only, passed, failed, below floor, not run
    reason: str = ""
    file: str | None = None
    size_mib: float | None = None
    float64_error: float | None = None  # largest abs difference of the raw outputs from float64 eager
    metric: float | None = None
    ms_per_image: float | None = None
    images_per_s: float | None = None
    export_s: float | None = None
    timing: dict[str, float] = field(default_factory=dict)
    gate: dict[str, Any] | None = None  # INT8 rows: the export's accuracy gate (float, int8, drop, max_drop, passed)

    @property
    def failed(self) -> bool:
        return self.status in ("failed", "below floor")


def parse_formats(value: Any) -> list[str] | None:
    """``"onnx,executorch"`` -> canonical format names; ``eager`` (or ``none``) -> []; None/``auto`` -> None
    (every format, those that cannot run here with a row saying why)."""
    from libreyolo.export.base import get_exporter

    if value is None:
        return None
    items = value if isinstance(value, (list, tuple)) else str(value).replace(" ", ",").split(",")
    items = [str(i).strip().lower() for i in items if str(i).strip()]
    if items in ([], ["auto"], ["all"]):
        return None
    if set(items) <= {EAGER, "pytorch", "none"}:
        return []
    out = []
    for item in items:
        if item in (EAGER, "pytorch", "none", CUDA_GRAPH):
            continue  # the eager (and graph) rows are always there: they are the reference
        name = get_exporter(item).name  # ArgumentError naming the known formats
        if name not in out:
            out.append(name)
    return out


def why_not_here(model: Any, fmt: str, *, imgsz: int, batch: int, half: bool) -> str | None:
    """Why ``fmt`` cannot be exported and run on this machine, or None when it can."""
    import importlib.util

    from libreyolo.export.base import ExportOptions, get_exporter

    exporter = get_exporter(fmt)
    # traced_on_cpu: exported and run on the CPU whatever the model's device; build_needs: an artifact
    # built only where it runs (a TensorRT engine) needs more than its exporter checks for
    device = torch.device("cpu") if exporter.spec.traced_on_cpu else model.device
    opts = ExportOptions(fmt, imgsz, batch, half=half, device=device)
    need = exporter.spec.build_needs
    if need and (importlib.util.find_spec(need[0]) is None or not torch.cuda.is_available()):
        return need[1]
    reason = exporter.not_validated_reason(opts)
    if reason:
        return reason
    try:
        exporter.check_family(model.family)
        exporter.check(opts)
    except LibreYOLOError as exc:
        return str(exc)
    return None


def _frames(batch: int) -> list[np.ndarray]:
    return [(np.random.RandomState(i).rand(480, 640, 3) * 255).astype(np.uint8) for i in range(batch)]


def _time(model: Any, frames: list[np.ndarray], n: int, desc: str, **kw: Any) -> dict[str, float]:
    from libreyolo.engine.benchmark import time_predict

    t = time_predict(model, frames, n=n, warmup=min(5, n), desc=desc, conf=0.25, **kw)
    per_image = t["predict_ms"] / len(frames)
    return {"timing": t, "ms_per_image": per_image, "images_per_s": 1e3 / per_image if per_image > 0 else None}


def _metric(model: Any, data: str, *, imgsz: int, workers: int, device: Any = None) -> float:
    """The headline metric of ``model.val()`` (the test suite wraps this to construct a drop)."""
    metrics = model.val(data=data, imgsz=imgsz, workers=workers, device=device)
    return metrics[_metric_name(model)]


def _size_mib(path: Path) -> float:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20
    return path.stat().st_size / 2**20


def _gate_text(gate: dict[str, Any]) -> str:
    return (f"gate {gate['metric']} float {gate['float']:.4f} -> int8 {gate['int8']:.4f} (drop {gate['drop']:+.4f}, "
            f"at most {gate['max_drop']:g})")


def _export_row(model: Any, fmt: str, folder: Path, frames: list[np.ndarray], *, imgsz: int, batch: int,
                half: bool, n: int, data: str | None, workers: int,
                int8: bool = False, max_drop: float | None = None) -> tuple[Row, dict[str, Any] | None]:
    from libreyolo import LibreYOLO
    from libreyolo.export.base import ExportError, get_exporter

    stem = Path(model.source).stem if getattr(model, "source", None) else f"{model.family.name}{model.size}"
    label = fmt + INT8_SUFFIX if int8 else fmt
    output = folder / f"{stem}-{imgsz}{INT8_SUFFIX if int8 else ''}{get_exporter(fmt).suffix}"
    opts: dict[str, Any] = {"imgsz": imgsz, "batch": batch, "output": output, "verbose": False}
    if int8:
        opts.update(int8=True, data=data, max_drop=max_drop)
        half = False  # an INT8 artifact has no fp16 variant
    if half:
        opts["half"] = True
    if get_exporter(fmt).spec.traced_on_cpu and model.device.type != "cpu":
        opts["device"] = "cpu"
    LOGGER.info("benchmark: exporting %s (imgsz %d, batch %d) to %s", label, imgsz, batch, output)
    start = time.perf_counter()
    try:
        report = model.export(format=fmt, **opts)
    except ExportError as exc:  # the toolchain failed, the artifact does not match eager, the INT8 gate refused it
        first = str(exc).strip().splitlines()[0]
        return Row(label, "failed", first, export_s=time.perf_counter() - start), None
    except LibreYOLOError as exc:  # a missing package, an option this format refuses
        return Row(label, "not run", str(exc), export_s=time.perf_counter() - start), None
    except Exception as exc:  # noqa: BLE001 - a toolchain crash fails this row, not the whole table
        return Row(label, "failed", f"export crashed: {type(exc).__name__}: {exc}",
                   export_s=time.perf_counter() - start), None
    validation = report.validation.to_dict()
    row = Row(label, report.validation.status, "", str(report.path), _size_mib(Path(report.path)),
              validation.get("artifact_float64_error"), export_s=report.seconds)
    if int8:
        row.gate = (report.metadata.get("validation") or {}).get("accuracy")
        row.reason = _gate_text(row.gate) if row.gate else "INT8 accuracy gate: not run here"
    if report.validation.status != "passed":  # "not validated": the runtime cannot run here
        row.status, row.reason = "not run", f"not validated here: {report.validation.reason}"
        return row, validation
    try:
        artifact = LibreYOLO(report.path)
    except LibreYOLOError as exc:
        row.status, row.reason = "not run", f"exported and validated, but cannot be loaded here: {exc}"
        return row, validation
    try:
        timed = _time(artifact, frames, n, label, half=half or None)
        row.timing, row.ms_per_image, row.images_per_s = timed["timing"], timed["ms_per_image"], timed["images_per_s"]
        if data:
            row.metric = _metric(artifact, data, imgsz=imgsz, workers=workers)
    except Exception as exc:  # noqa: BLE001 - it validated but does not run on the benchmark's frames or data
        row.status, row.reason = "failed", f"validated, then failed in predict()/val(): {type(exc).__name__}: {exc}"
    return row, validation


@dataclass
class BenchmarkResult:
    model: str
    task: str
    device: str
    imgsz: int
    batch: int
    n: int
    data: str | None
    floor: float
    metric_name: str
    rows: list[Row]
    save_dir: str | None

    @property
    def failures(self) -> list[Row]:
        return [r for r in self.rows if r.failed]

    def to_dict(self) -> dict[str, Any]:
        from libreyolo import __version__

        head = {k: v for k, v in asdict(self).items() if k != "rows"}
        return {**head, "libreyolo": __version__, "torch": torch.__version__, "platform": sys.platform,
                "passed": not self.failures, "rows": [asdict(r) for r in self.rows]}


def _check(batch: Any, n: Any, floor: Any, workers: Any, int8: Any = False, data: Any = None,
           max_drop: Any = None) -> tuple[float, bool, float | None]:
    """The options as ``libreyolo benchmark`` checks them (:data:`libreyolo.engine.options.BENCH_OPTIONS`)."""
    from libreyolo.engine.options import BENCH_OPTIONS as B

    B["batch"].check("batch", batch)
    B["n"].check("n", n)
    B["workers"].check("workers", workers)
    int8 = B["int8"].check("int8", int8)
    max_drop = B["max_drop"].check("max_drop", max_drop)
    if max_drop is not None and not int8:
        raise ArgumentError(f"max_drop={max_drop:g} applies to the INT8 rows only; pass int8=True (and data=) "
                            "or drop it")
    if int8 and (data is None or data == ""):
        raise ArgumentError("int8=True needs data=: the dataset whose train split calibrates the INT8 exports and "
                            "whose val split gates their accuracy (e.g. data=coco8.yaml); pass data= or drop int8=True")
    return B["floor"].check("floor", floor), bool(int8), max_drop


def benchmark_formats(model: Any, *, formats: list[str] | None = None, data: str | None = None,
                      imgsz: int | None = None, batch: int = 1, n: int = 50, half: bool = False,
                      cuda_graph: bool | str = True, floor: float = 0.01, save_dir: str | Path | None = None,
                      workers: int = 0, int8: bool = False, max_drop: float | None = None) -> BenchmarkResult:
    """Rows for eager, CUDA graphs (on CUDA) and each of ``formats`` (None: every export format);
    ``int8=True`` (with ``data=``) adds a ``<format>-int8`` row per format that has INT8 artifacts."""
    from libreyolo.export.base import FORMATS, get_exporter

    floor, int8, max_drop = _check(batch, n, floor, workers, int8, data, max_drop)
    if data:  # another task's dataset is an error naming both, before any timing or export
        from libreyolo.tasks import check_data_task

        check_data_task(model.task, data)
    imgsz = model.family.check_imgsz(model.imgsz if imgsz is None else imgsz)
    frames = _frames(batch)
    if not hasattr(model, "export"):  # an artifact: its own row, nothing to export
        if int8:
            raise ArgumentError(f"int8=True exports INT8 artifacts from a checkpoint; {model.path.name} is already a "
                                f"{model.format} artifact. Benchmark its checkpoint (.pt) with int8=True, or drop it")
        return _artifact_only(model, formats, frames, data=data, imgsz=imgsz, n=n, half=half, floor=floor,
                              workers=workers)
    rows: list[Row] = []
    eager = Row(EAGER, "reference", file=getattr(model, "source", None))
    if eager.file and Path(eager.file).is_file():
        eager.size_mib = _size_mib(Path(eager.file))
    timed = _time(model, frames, n, EAGER, imgsz=imgsz, half=half)
    eager.timing, eager.ms_per_image, eager.images_per_s = timed["timing"], timed["ms_per_image"], timed["images_per_s"]
    if data:
        eager.metric = _metric(model, data, imgsz=imgsz, workers=workers, device=model.device)
    rows.append(eager)
    if cuda_graph:
        graph = Row(CUDA_GRAPH, "timing only", reason=f"cuda_graph={cuda_graph}: replays the eager network")
        why = None if model.device.type == "cuda" else f"CUDA graphs need a CUDA device (model on {model.device})"
        if why is None:
            try:
                timed = _time(model, frames, n, CUDA_GRAPH, imgsz=imgsz, half=half, cuda_graph=cuda_graph)
                graph.timing, graph.ms_per_image = timed["timing"], timed["ms_per_image"]
                graph.images_per_s = timed["images_per_s"]
            except (LibreYOLOError, NotImplementedError) as exc:  # a family without graph support
                why = str(exc)
        if why:
            graph.status, graph.reason = "not run", why
        rows.append(graph)
    chosen = ([f for f in FORMATS if get_exporter(f).benchmarked] if formats is None
              else (parse_formats(formats) or []))  # aliases: pte, pt2, ...
    keep = save_dir is not None
    reports: list[dict[str, Any]] = []
    # the temporary folder goes on every way out: an exception or Ctrl-C (finally), SIGTERM/SIGHUP
    # (the guard's handler removes it, then the process dies of the signal as before)
    with TempGuard() as guard:
        folder = Path(save_dir) if keep else guard.add(tempfile.mkdtemp(prefix="libreyolo-benchmark-"))
        if keep:
            folder.mkdir(parents=True, exist_ok=True)
        _export_rows(model, chosen, folder, rows, reports, frames, keep=keep, imgsz=imgsz, batch=batch, half=half,
                     n=n, data=data, workers=workers, int8=int8, max_drop=max_drop)
    eager.float64_error = next((r["eager_float64_error"] for r in reports if r.get("eager_float64_error") is not None),
                               None)
    if eager.metric is not None:
        for row in rows[1:]:
            if row.format.endswith(INT8_SUFFIX):  # the export's accuracy gate (max_drop) is its allowance
                continue
            if row.metric is not None and row.metric < eager.metric - floor:
                row.status = "below floor"
                row.reason = (f"{_metric_name(model)} {row.metric:.4f} < eager {eager.metric:.4f} - floor {floor:g}")
    name = Path(model.source).name if getattr(model, "source", None) else f"{model.family.name}-{model.size}"
    return BenchmarkResult(name, model.task, str(model.device), imgsz, batch, n, data, floor, _metric_name(model),
                           rows, str(folder) if keep else None)


def _export_rows(model: Any, chosen: list[str], folder: Path, rows: list[Row], reports: list[dict[str, Any]],
                 frames: list[np.ndarray], *, keep: bool, imgsz: int, batch: int, half: bool, n: int, data: Any,
                 workers: int, int8: bool, max_drop: Any) -> None:
    """One row per chosen format (and its INT8 row), exported into ``folder`` (removed unless ``keep``)."""
    from libreyolo.export.base import get_exporter

    try:
        for fmt, quantized in [(f, q) for f in chosen for q in (False, True)
                               if not q or (int8 and get_exporter(f).int8_mode != "no")]:
            label = fmt + INT8_SUFFIX if quantized else fmt
            why = why_not_here(model, fmt, imgsz=imgsz, batch=batch, half=half and not quantized)
            if why:
                rows.append(Row(label, "not run", f"not run here: {why}"))
                continue
            row, validation = _export_row(model, fmt, folder, frames, imgsz=imgsz, batch=batch, half=half, n=n,
                                          data=data, workers=workers, int8=quantized, max_drop=max_drop)
            if validation is not None and not quantized:  # INT8 reports compare with the quantized model
                reports.append(validation)
            if not keep:
                row.file = Path(row.file).name if row.file else None  # the folder is removed below
            rows.append(row)
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)


def _artifact_only(model: Any, formats: list[str] | None, frames: list[np.ndarray], *, data: str | None, imgsz: int,
                   n: int, half: bool, floor: float, workers: int) -> BenchmarkResult:
    if formats:
        raise ArgumentError(f"{model.path.name} is a {model.format} artifact and cannot be exported to "
                            f"{', '.join(formats)}: benchmark its checkpoint (.pt) for other formats, or pass no "
                            "formats=")
    recorded = model.validation
    row = Row(model.format, str(recorded.get("status", "unknown")), "validation recorded at export",
              str(model.path), _size_mib(model.path), recorded.get("artifact_float64_error"))
    timed = _time(model, frames, n, model.format, imgsz=imgsz, half=half or None)
    row.timing, row.ms_per_image, row.images_per_s = timed["timing"], timed["ms_per_image"], timed["images_per_s"]
    if data:
        row.metric = _metric(model, data, imgsz=imgsz, workers=workers)
    return BenchmarkResult(model.path.name, model.task, str(model.device), imgsz, len(frames), n, data, floor,
                           _metric_name(model), [row], None)


def _cell(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(result: BenchmarkResult) -> str:
    metric = result.metric_name if result.data else f"{result.metric_name} (no data=)"
    fw = max([12] + [len(r.format) + 2 for r in result.rows])
    head = (f"{'format':<{fw}}{'size MiB':>9}  {'validation':<12}{'err vs fp64':>12}"
            f"{metric:>{max(10, len(metric) + 2)}}{'ms/img':>9}{'img/s':>8}  note")
    lines = [f"{result.model} ({result.task}) on {result.device}, imgsz {result.imgsz}, batch {result.batch}, "
             f"median of {result.n} predict() calls" + (f", data {result.data}" if result.data else ""), head]
    width = max(10, len(metric) + 2)
    for r in result.rows:
        lines.append(f"{r.format:<{fw}}{_cell(r.size_mib, '.1f'):>9}  {r.status:<12}{_cell(r.float64_error, '.2e'):>12}"
                     f"{_cell(r.metric, '.4f'):>{width}}{_cell(r.ms_per_image, '.2f'):>9}"
                     f"{_cell(r.images_per_s, '.1f'):>8}  {r.reason}".rstrip())
    bad = result.failures
    lines.append(f"FAILED: {', '.join(r.format for r in bad)}" if bad else "all run formats passed"
                 + (f" (floor {result.floor:g} below eager)" if result.data else ""))
    return "\n".join(lines)
