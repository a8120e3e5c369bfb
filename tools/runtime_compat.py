"""Which runtimes read our ONNX files: every family's static ONNX export through ONNX Runtime, OpenVINO
(f32 hint), OpenCV DNN (the installed cv2) and OpenCV 4.x DNN (a separate Python with
opencv-python-headless 4.x, ``LIBREYOLO_CV4_PYTHON``, default ``/tmp/cv4venv/bin/python``).

``python tools/runtime_compat.py`` prints the table; ``--write`` regenerates docs/runtime-compat.md;
``--only yolo9,yolox`` measures some rows. Each family: its smallest size with seeded weights, imgsz 160
(or its fixed size), exported to a static ONNX file; plus YOLOv9 with embedded NMS, dynamic, and
end-to-end (e2e=True). Each runtime loads the file, runs one seeded input, and is compared with eager
against a float64 copy of the network: it matches when its largest error from float64 (relative to
the output's scale) is within ELEMENT_MULTIPLE times eager float32's own plus the floor, the bar the
export validator uses for the largest error (libreyolo.utils.tolerance). ``tests/test_runtime_compat.py``
re-measures the YOLOv9 rows and fails when the committed table drifts from what it measures.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "runtime-compat.md"
RUNTIMES = ("onnxruntime", "openvino", "opencv", "opencv4")
IMGSZ = 160
DEMO = "LibreYOLO9t-shapes.pt"
VARIANTS = {"nms": {"nms": True}, "dynamic": {"dynamic": True}, "e2e": {"e2e": True}}  # extra rows (yolo9)


def cv4_python() -> str | None:
    path = os.environ.get("LIBREYOLO_CV4_PYTHON", "/tmp/cv4venv/bin/python")
    return path if Path(path).is_file() else None


def rows() -> list[tuple[str, str, dict[str, Any]]]:
    """(row name, family, export options) of the table, families sorted by task then name."""
    from libreyolo.models.registry import families

    out = [(name, name, {}) for name, fam in sorted(families().items(), key=lambda kv: (kv[1].task, kv[0]))]
    # the other kinds of file on the bundled demo detector: trained, so its NMS keeps well-separated boxes
    return out + [(f"yolo9 ({v})", DEMO, opts) for v, opts in VARIANTS.items()]


def _model(family: str) -> tuple[Any, int]:
    from libreyolo import LibreYOLO
    from libreyolo.errors import ArgumentError
    from libreyolo.models.registry import get_family

    if family.endswith(".pt"):
        return LibreYOLO(family), IMGSZ
    fam = get_family(family)
    torch.manual_seed(0)
    try:
        model = LibreYOLO(f"{fam.filename(fam.sizes[0])}.yaml", nc=5)
    except ArgumentError:  # a task without classes (restoration)
        torch.manual_seed(0)
        model = LibreYOLO(f"{fam.filename(fam.sizes[0])}.yaml")
    imgsz = fam.fixed_imgsz or (IMGSZ // fam.stride) * fam.stride
    return model, imgsz


def _reason(exc: str) -> str:
    """A short reason from a runtime's error text (the operator it stopped at, and what it said)."""
    node = re.search(r"Node \[(\w+)@", exc) or re.search(r'of type "(\w+)"', exc)
    said = [t for t in re.findall(r"error: \(-?\d+:[^)]*\) ([^\n]*?) in function", exc) if t.strip()]
    detail = re.findall(r"^> > (\S.*)$", exc, re.M)  # OpenCV's CV_Check message, first line
    text = (detail[0] if detail else said[-1] if said else exc.strip().splitlines()[-1] if exc.strip()
            else "error")
    if "Can't create layer" in text:
        text = "no layer for this operator"
    op = node.group(1) if node else ""
    text = text.removeprefix(f"{op}: ").split(", where")[0][:80]
    return (f"{op}: " if op else "") + text.replace("|", "/")


def _run_cv(cv2: Any, path: str, x: np.ndarray, names: list[str]) -> list[np.ndarray]:
    net = cv2.dnn.readNetFromONNX(path)
    net.setInput(x)
    outs = net.forward(names)
    return [np.asarray(o) for o in outs]


CV4_SCRIPT = """
import sys, numpy as np, cv2
path, inp, out, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(",")
net = cv2.dnn.readNetFromONNX(path)
net.setInput(np.load(inp))
outs = net.forward(names)
np.savez(out, *[np.asarray(o) for o in outs])
"""


def _run(runtime: str, path: str, x: np.ndarray, names: list[str]) -> list[np.ndarray]:
    if runtime == "onnxruntime":
        import onnxruntime as ort

        return ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(names, {"images": x})
    if runtime == "openvino":
        import openvino as ov

        compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        result = compiled(x)
        return [np.asarray(result[compiled.output(n)]) for n in names]
    if runtime == "opencv":
        import cv2

        return _run_cv(cv2, path, x, names)
    python = cv4_python()
    if python is None:
        raise FileNotFoundError("no OpenCV 4.x Python")
    with tempfile.TemporaryDirectory() as tmp:
        np.save(f"{tmp}/x.npy", x)
        done = subprocess.run([python, "-c", CV4_SCRIPT, path, f"{tmp}/x.npy", f"{tmp}/y.npz", ",".join(names)],
                              capture_output=True, text=True, timeout=600)
        if done.returncode:
            raise RuntimeError(done.stderr)
        data = np.load(f"{tmp}/y.npz")
        return [data[f"arr_{i}"] for i in range(len(names))]


def measure(row: str, family: str, opts: dict[str, Any], runtimes: tuple[str, ...] = RUNTIMES,
            work: Path | None = None) -> dict[str, str]:
    """{runtime: cell} for one row of the table."""
    from libreyolo.export.e2e import input_normalization, to_pixels
    from libreyolo.export.module import ExportModule
    from libreyolo.utils.tolerance import ELEMENT_MULTIPLE, FLOOR, float64_copy

    if work is None:
        with tempfile.TemporaryDirectory(prefix="compat-") as tmp:
            return measure(row, family, opts, runtimes, Path(tmp))
    model, imgsz = _model(family)
    path = work / f"{row.replace(' ', '_').replace('(', '').replace(')', '')}.onnx"
    report = model.export(format="onnx", imgsz=imgsz, output=path, validate=False, verbose=False, **opts)
    meta = report.metadata
    x = torch.rand(1, 3, imgsz, imgsz, generator=torch.Generator().manual_seed(0))
    norm = input_normalization(model.family, imgsz)
    if opts.get("e2e"):  # 8-bit pixels in; eager runs the same pixels through the family's normalisation
        from libreyolo.export.e2e import quantize_input

        x = quantize_input(x, norm)
    nms = meta.get("nms")
    with torch.inference_mode():
        net64 = float64_copy(model.net)
        e32 = [t.float().numpy() for t in ExportModule(model.net, model.family, None, nc=model.nc)(x)]
        e64 = [t.double().numpy() for t in ExportModule(net64, model.family, None, nc=model.nc)(x.double())]
        # embedded NMS: its rows are compared as detection sets with eager float32's, scores within the bar
        # of the network's own predictions
        dets = [t.numpy() for t in ExportModule(model.net, model.family, nms, nc=model.nc)(x)] if nms else None
    feed = to_pixels(x, norm).numpy() if opts.get("e2e") else x.numpy()
    names = list(meta["output_names"])
    cells = {}
    for runtime in runtimes:
        try:
            got = _run(runtime, str(path), feed, names)
        except FileNotFoundError as exc:
            cells[runtime] = f"not measured ({exc})"
            continue
        except Exception as exc:  # noqa: BLE001 - any failure of a foreign runtime is a table entry
            cells[runtime] = "no: " + _reason(str(exc))
            continue
        if dets is not None:
            cells[runtime] = _same_detections(got, dets, e32, e64, nms)
            continue
        worst = 0.0
        for g, a, b in zip(got, e32, e64, strict=True):
            if np.asarray(g).shape != b.shape:
                worst = float("inf")
                break
            scale = max(float(np.abs(b).max()), 1e-12)
            own = float(np.abs(a - b).max()) / scale
            err = float(np.abs(np.asarray(g, dtype=np.float64) - b).max()) / scale
            worst = max(worst, err / (ELEMENT_MULTIPLE * own + FLOOR))
        cells[runtime] = "yes" if worst <= 1.0 else f"runs, differs ({worst:.3g}x the bar)"
    return cells


def _same_detections(got: list[np.ndarray], want: list[np.ndarray], e32: list[np.ndarray],
                     e64: list[np.ndarray], nms: dict[str, Any]) -> str:
    from libreyolo.export.matching import match_detections
    from libreyolo.utils.tolerance import ELEMENT_MULTIPLE, FLOOR

    def as_dets(out: list[np.ndarray]) -> dict[str, torch.Tensor]:
        rows = torch.from_numpy(np.asarray(out[0], dtype=np.float32)[0, :int(np.asarray(out[1]).reshape(-1)[0])])
        return {"xyxy": rows[:, :4], "conf": rows[:, 4], "cls": rows[:, 5]}

    scores = (e32[0][:, 4:], e64[0][:, 4:])
    tol = ELEMENT_MULTIPLE * float(np.abs(scores[0] - scores[1]).max()) + FLOOR
    m = match_detections(as_dets(want), as_dets(got), conf=max(0.25, nms["conf"]), max_det=nms["max_det"],
                         iou_min=0.99, score_tol=tol)
    ok = m["passed"] and m["matched"] == m["eager"] == m["artifact"]
    return "yes" if ok else f"runs, differs ({m['matched']}/{m['eager']} detections matched)"


def table(results: dict[str, dict[str, str]]) -> str:
    head = "| model | " + " | ".join(RUNTIMES) + " |"
    lines = [head, "|---" * (len(RUNTIMES) + 1) + "|"]
    for row, cells in results.items():
        lines.append(f"| `{row}` | " + " | ".join(cells.get(r, "-") for r in RUNTIMES) + " |")
    return "\n".join(lines)


MARK = re.compile(r"(<!-- table:runtime-compat -->\n)(.*?)(\n<!-- /table:runtime-compat -->)", re.S)


def committed() -> dict[str, dict[str, str]]:
    """The table in docs/runtime-compat.md as {row: {runtime: cell}}."""
    m = MARK.search(DOC.read_text())
    if not m:
        raise SystemExit(f"{DOC} has no <!-- table:runtime-compat --> markers")
    out = {}
    for line in m.group(2).splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        out[cells[0].strip("`")] = dict(zip(RUNTIMES, cells[1:], strict=True))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="regenerate the table in docs/runtime-compat.md")
    parser.add_argument("--only", default="", help="comma-separated row names (default: every row)")
    args = parser.parse_args(argv)
    wanted = {r for r in args.only.split(",") if r}
    results = {}
    for row, family, opts in rows():
        if wanted and row not in wanted:
            continue
        try:
            results[row] = measure(row, family, opts)
        except Exception as exc:  # noqa: BLE001 - an export that fails is a row of the table
            results[row] = dict.fromkeys(RUNTIMES, "no export: " + _reason(f"{type(exc).__name__}: {exc}"))
        print(f"| `{row}` | " + " | ".join(results[row].values()) + " |", flush=True)
        if args.write:  # row by row: an interrupted run keeps what it measured
            write(results, keep=bool(wanted))
    if not args.write:
        print(table(results))
    return 0


def write(results: dict[str, dict[str, str]], keep: bool) -> None:
    """Replace the table in docs/runtime-compat.md (``keep``: the committed rows not measured now stay)."""
    from libreyolo.utils.atomic import atomic_write

    merged = {**(committed() if keep else {}), **results}
    ordered = {row: merged[row] for row, _, _ in rows() if row in merged}
    text = MARK.sub(lambda m: m.group(1) + table(ordered) + m.group(3), DOC.read_text())
    atomic_write(DOC, lambda tmp: tmp.write_text(text))


if __name__ == "__main__":
    sys.exit(main())
