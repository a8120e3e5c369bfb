"""Deploy to the edge: export a model to ONNX and ExecuTorch, then run each artifact alone.

    python examples/deploy_edge.py [MODEL] [IMAGE] [--imgsz 320] [--formats onnx,executorch] [--out DIR]

MODEL defaults to LibreYOLO9t.yaml (untrained, so detections are meaningless but the pipeline
is real); pass a checkpoint such as LibreYOLO9t.pt for real detections. Every export is
validated against the eager model before it is written. The second half only needs the
artifact and its runtime: this is what runs on the device.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from libreyolo import SAMPLE_IMAGE, LibreYOLO

RUNTIME_PACKAGE = {"onnx": "onnxruntime", "executorch": "executorch"}


def export_all(model_path: str, formats: list[str], imgsz: int, out: Path) -> list[Path]:
    model = LibreYOLO(model_path)
    artifacts = []
    for fmt in formats:
        if importlib.util.find_spec(RUNTIME_PACKAGE[fmt]) is None:
            print(f"skipping {fmt}: the '{RUNTIME_PACKAGE[fmt]}' package is not installed "
                  f"(pip install 'libreyolo[{fmt}]')")
            continue
        suffix = {"onnx": ".onnx", "executorch": ".pte"}[fmt]
        report = model.export(format=fmt, imgsz=imgsz, output=out / f"model{suffix}", verbose=False)
        print(f"{fmt}: {report.path} - validation {report.validation.headline()}")
        artifacts.append(Path(report.path))
    return artifacts


def run_on_device(artifact: Path, image: str) -> None:
    """What the edge device runs: the artifact and its runtime, nothing else."""
    runtime = LibreYOLO(artifact)
    result = runtime.predict(image, conf=0.25)
    print(f"{artifact.name}: {len(result)} detections on {Path(image).name} "
          f"({result.speed['inference']:.1f} ms inference, {runtime.describe()})")
    for box, conf, cls in list(zip(result.boxes.xyxy.tolist(), result.boxes.conf.tolist(),
                                   result.boxes.cls.tolist(), strict=True))[:3]:
        print(f"  {result.names[int(cls)]:<12} {conf:.3f}  " + " ".join(f"{v:.0f}" for v in box))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="LibreYOLO9t.yaml")
    parser.add_argument("image", nargs="?", default=str(SAMPLE_IMAGE))
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--formats", default="onnx,executorch")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    unknown = [f for f in formats if f not in RUNTIME_PACKAGE]
    if unknown:
        parser.error(f"this example exports {', '.join(RUNTIME_PACKAGE)}; got {unknown}")
    args.out.mkdir(parents=True, exist_ok=True)
    for artifact in export_all(args.model, formats, args.imgsz, args.out):
        run_on_device(artifact, args.image)
    return 0


if __name__ == "__main__":
    sys.exit(main())
