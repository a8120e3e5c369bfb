"""INT8 artifacts: the quantized eager model they are compared with, and the accuracy gate.

``export(format, int8=True, data=...)`` (docs/quantization.md):

1. The *quantized eager model* is a private copy of the model: the model's own quantization when
   it was quantized (``model.quantize(...)``), else calibrated now on ``data`` with quantize()'s
   defaults (int8, minmax, 256 images of the train split). The user's model is not changed.
2. The format writes the artifact (:attr:`Exporter.int8_mode`: ``qdq`` formats export the
   simulated layers as QuantizeLinear/DequantizeLinear with exactly those scales; ``own`` formats
   quantize with their toolchain from the same calibration images).
3. Validation compares the artifact with the quantized eager model (its own float32-vs-float64
   drift, which includes the rounding flips of quantization codes, sets the allowances), and the
   report states its distance from the float model separately.
4. The accuracy gate evaluates the float eager model and the artifact on ``data``'s val split
   (mAP50-95, top-1 for classifiers: the task's headline metric) and refuses the artifact,
   writing nothing, when the drop exceeds ``max_drop``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from libreyolo.errors import ArgumentError, DatasetError
from libreyolo.export.base import ExportError
from libreyolo.tasks import get_task

GATE_BATCH = 8


class AccuracyGateFailed(ExportError):
    """The INT8 artifact loses more accuracy than ``max_drop`` allows (CLI exit status 1)."""

    exit_code = 1


@dataclass
class Int8Plan:
    """What an INT8 export works from (``ExportOptions.calibration``)."""

    quantized: Any                      # the quantized eager model (a private copy)
    float_model: Any                    # the float eager model (a private copy when the user's is quantized)
    files: list[Path] = field(default_factory=list)   # calibration images
    origin: str = ""                    # where they came from
    calibrated_here: bool = True        # False: the user's own quantize() scales
    own_reference: Any = None           # a format's own quantization run in eager (PT2E's converted graph)

    def batches(self) -> Any:
        """The calibration images, preprocessed as predict() does (float32 batches)."""
        return self.quantized.calibration_batches(self.files)

    def describe(self) -> dict[str, Any]:
        info = self.quantized.quant_info()
        return {"recipe": info["recipe"], "method": info["method"], "samples": info["samples"],
                "calibration": self.origin, "calibrated": "at export" if self.calibrated_here else "by quantize()",
                "layers": info["count"], "excluded": sorted(info["excluded"]),
                "scheme": "activations int8 per-tensor affine, weights int8 per-output-channel symmetric"}


def _sibling(model: Any) -> Any:
    """A float copy of the eager model (same family, weights and settings; nothing shared), of the
    model's own class (export sits below the Model facade and never imports it)."""
    state = {k: v.detach().clone() for k, v in model.net.state_dict().items()}
    twin = type(model)(model.family, model.size, nc=model.nc, names=model.names, imgsz=model.imgsz, state_dict=state,
                 source=getattr(model, "source", None), device=model.device)
    return twin


def check_data(model: Any, data: Any) -> Any:
    """The dataset of the accuracy gate, checked before anything is built: it must have a val split."""
    from libreyolo.train.val import load_dataset

    if data is None or data == "":
        raise ArgumentError("int8=True needs data=: a dataset (YAML, or a classification folder) whose train split "
                            "calibrates the activations and whose val split gates the accuracy, e.g. "
                            "data=coco8.yaml")
    cfg = load_dataset(model.task, data)
    if not cfg.val:
        raise DatasetError(f"{data} has no val split: the INT8 accuracy gate evaluates the float model and the "
                           "INT8 artifact on it; add one (val: images/val)")
    return cfg


def plan(model: Any, data: str, imgsz: int | None = None) -> Int8Plan:
    """The quantized and float eager models of an INT8 export of ``model`` at ``imgsz`` (calibration
    runs at the exported input size; a model quantized by the user keeps its own scales)."""
    from libreyolo.quant.calibrate import calibration_images

    why = get_task(model.family.task).int8_unavailable  # the task's declaration
    if why is not None:
        raise ArgumentError(f"int8=True is not available for {model.family.task} models ({why}); export in float32")
    float_model = _sibling(model)
    quantized = _sibling(model)
    if imgsz is not None:
        float_model.imgsz = quantized.imgsz = imgsz
    if model.is_quantized:
        entry = model.quant_entry()
        quantized.restore_quantization(entry, "the model's quantization")
        files, origin = calibration_images(data)
        files = files[:max(1, int(entry["samples"] or 1))]
        return Int8Plan(quantized, float_model, files, f"{origin} (the model was quantized by quantize())", False)
    files, origin = calibration_images(data)
    quantized.quantize(recipe="int8", data=data)
    return Int8Plan(quantized, float_model, files[:quantized.quant_info()["samples"]], origin, True)


def float_distance(plan_: Int8Plan, runtime: Any, imgsz: int) -> dict[str, Any]:
    """How far the artifact is from the *float* model on the sample image: per output, the largest
    absolute difference, the float output's largest magnitude and the cosine."""
    from libreyolo.comparison.groups import cosine
    from libreyolo.export.validate import sample_batch

    model = plan_.float_model
    x, _ = sample_batch(model.family, imgsz)
    with torch.inference_mode():
        ref = model.family.named_outputs(model.net(x.to(model.device)))
    got = runtime.network_outputs(x.to(runtime.device, runtime.input_dtype(False)))
    out = {}
    for name, r in ref.items():
        if name not in got or not r.is_floating_point():
            continue
        g = got[name].detach().double().cpu()
        r = r.detach().double().cpu()
        if g.shape != r.shape:
            continue
        out[name] = {"max_abs": float((g - r).abs().max()), "float_max_abs": float(r.abs().max()),
                     "cosine": cosine(r, g)}
    return out


def gate(plan_: Int8Plan, runtime: Any, data: str, imgsz: int, max_drop: float) -> dict[str, Any]:
    """The task's headline metric of the float eager model and of the artifact on ``data``'s val split."""
    from libreyolo.tasks import get_task

    metric = get_task(plan_.float_model.task).metric
    kw = {"data": data, "imgsz": imgsz, "batch": GATE_BATCH, "workers": 0}
    before = plan_.float_model.val(**kw)
    after = runtime.val(**kw)
    f, q = float(before[metric]), float(after[metric])
    drop = f - q
    passed = math.isfinite(q) and drop <= max_drop
    return {"metric": metric, "float": f, "int8": q, "drop": drop, "max_drop": max_drop, "passed": passed,
            "data": str(data), "images": int(before.get("images", 0) or 0)}


def gate_line(result: dict[str, Any]) -> str:
    mark = "ok " if result["passed"] else "BAD"
    return (f"  {mark} accuracy gate       {result['metric']} float {result['float']:.4f} -> int8 "
            f"{result['int8']:.4f} (drop {result['drop']:+.4f}, at most {result['max_drop']:g}) on the val split "
            f"of {result['data']}")


def check_parameters(plan_: Int8Plan, exporter: Any, path: Path) -> dict[str, Any]:
    """The artifact's quantization parameters against quantize()'s, exactly: every quantized layer's
    int8 weight codes, weight scales (BatchNorm folded), input scale and zero point must be read by
    the artifact's QuantizeLinear/DequantizeLinear nodes bit for bit. A float artifact is an
    ill-conditioned witness of them (the quantized model's own float32 run flips codes against
    float64, moving outputs by about half the whole quantization effect), so they are compared here
    as parameters, not through outputs."""
    import numpy as np

    from libreyolo.quant.qdq import expected_parameters, export_view

    expected = expected_parameters(export_view(plan_.quantized.net))
    got = exporter.int8_parameters(path)
    wrong = []
    for name, want in expected.items():
        have = got.get(f"{EXPORT_PREFIX}{name}")
        if have is None or have.shape != tuple(want.shape) or have.dtype != want.numpy().dtype \
                or not np.array_equal(have, want.numpy()):
            wrong.append(name)
    layers = len(expected) // 4
    ok = not wrong and layers > 0
    line = (f"quantization parameters of {layers} layer(s) equal quantize()'s bit for bit" if ok else
            f"{len(wrong)} of {len(expected)} quantization parameters differ from quantize()'s or are missing "
            f"(first: {', '.join(wrong[:3]) or 'no quantized layer in the artifact'})")
    return {"probe": "graph", "output": "quantization", "group": "parameters", "kind": "input",
            "max_abs_error": 0.0 if ok else math.inf, "ratio": 0.0 if ok else math.inf, "allowed": 0.0,
            "cosine": 1.0 if ok else 0.0, "passed": ok, "layers": layers, "wrong": wrong[:20],
            **({} if ok else {"shape": line}), "line": line}


EXPORT_PREFIX = "net."  # ExportModule keeps the network as its ``net`` attribute
