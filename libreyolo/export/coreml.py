"""CoreML export: ``torch.export`` -> coremltools ML Program (``.mlpackage``).

The input is an image (``ImageType``: RGB, scale 1/255, no bias), so apps feed camera frames
directly; our runtime feeds the letterboxed image as 8-bit RGB, which is exact because the
letterbox yields whole grey levels. Families whose contract says ``image_input=False``
(classifiers: per-channel mean/std) take a float ``TensorType`` of the normalised input instead,
as every other format does. Static shapes, batch 1. Conversion runs on Linux and
macOS; running (and so validating) needs macOS. Metadata is stored as the package's
user-defined metadata.

INT8 (``int8=True``, :attr:`Exporter.int8_mode` ``"own"``): the float ML Program is converted as
above, then the weights of its ``conv``/``conv_transpose``/``linear`` ops are quantized to 8 bits
with coremltools (``linear_quantize_weights``: linear symmetric, per output channel, int8); the
activations stay float (CoreML has no calibrated int8 activations in this path, so the
calibration images of ``data=`` are not used by this format). The package records this under
``quantization`` in its metadata. Not validated here: CoreML predicts only on macOS, and even
there the weight-only package is not compared with quantize()'s int8-activation eager model
(that would not be the same network), so its report says "not validated".
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import torch

from libreyolo.errors import ArgumentError, require
from libreyolo.export.base import Exporter, ExportError, ExportOptions
from libreyolo.export.formats import get_format
from libreyolo.utils.tempfiles import replace_folder

EXTRA = get_format("coreml").extra
NOT_ON_THIS_OS = "CoreML runs only on macOS"
INT8_OPS = ("conv", "conv_transpose", "linear")  # the ops whose constant weights int8=True quantizes
INT8_SCHEME = "8-bit linear symmetric per-channel weights (coremltools), float activations"
INT8_NOT_COMPARED = ("CoreML INT8 quantizes the weights only (float activations), and no eager model with exactly "
                     "that quantization exists to compare it with; not validated here")


def _ct():
    import logging

    logging.getLogger("coremltools").setLevel(logging.ERROR)
    return require("coremltools", EXTRA, "CoreML export")


def mlpackage_ops(path: str | Path) -> set[str]:
    """Operation types in the ML Program of a ``.mlpackage``."""
    ct = _ct()
    spec = ct.models.MLModel(str(path), skip_model_load=True).get_spec()
    found: set[str] = set()

    def walk(block: Any) -> None:
        for op in block.operations:
            found.add(op.type)
            for inner in op.blocks:
                walk(inner)

    for fn in spec.mlProgram.functions.values():
        for block in fn.block_specializations.values():
            walk(block)
    return found


def quantize_weights(mlmodel: Any) -> Any:
    """``mlmodel`` with the weights of its conv/linear ops as int8 (per output channel, symmetric);
    every such weight is quantized, whatever its size (``weight_threshold=0``; 1-D tensors such as
    biases stay float, as coremltools keeps them)."""
    _ct()
    from coremltools.optimize.coreml import OpLinearQuantizerConfig, OptimizationConfig, linear_quantize_weights

    op = OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int8", granularity="per_channel",
                                 weight_threshold=0)
    config = OptimizationConfig(op_type_configs={name: op for name in INT8_OPS})
    return linear_quantize_weights(mlmodel, config=config)


class CoreMLExporter(Exporter, format="coreml"):
    toolchain = ("coremltools",)

    def check(self, opts: ExportOptions) -> None:
        _ct()
        if opts.batch != 1:
            raise ArgumentError(f"CoreML image models take one image at a time: batch must be 1, got {opts.batch}")
        if opts.device.type != "cpu":
            raise ArgumentError(f"CoreML conversion traces on the CPU; got device={opts.device}")

    def build(self, module: torch.nn.Module, example: torch.Tensor, path: Path, opts: ExportOptions,
              work: Path) -> None:
        ct = _ct()
        contract = module.contract
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                program = torch.export.export(module, (example,), strict=False).run_decompositions({})
                mlmodel = ct.convert(
                    program, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS16,
                    inputs=[ct.ImageType(name=contract.input_name, shape=tuple(example.shape),
                                         scale=contract.input_scale, bias=[0.0, 0.0, 0.0],
                                         color_layout=ct.colorlayout.RGB) if contract.image_input
                            else ct.TensorType(name=contract.input_name, shape=tuple(example.shape))],
                    outputs=[ct.TensorType(name=n) for n in module.output_names()],
                    compute_precision=ct.precision.FLOAT16 if opts.half else ct.precision.FLOAT32,
                )
            except Exception as exc:
                raise ExportError(f"CoreML conversion failed: {type(exc).__name__}: {exc}") from exc
            if opts.int8:
                try:
                    mlmodel = quantize_weights(mlmodel)
                except Exception as exc:
                    raise ExportError(f"CoreML int8 weight quantization (coremltools linear_quantize_weights) "
                                      f"failed: {type(exc).__name__}: {exc}") from exc
        mlmodel.short_description = f"LibreYOLO {module.family.name} ({module.family.task})"
        mlmodel.save(str(path))

    def write_metadata(self, path: Path, encoded: dict[str, str], meta: dict[str, Any]) -> None:
        ct = _ct()
        mlmodel = ct.models.MLModel(str(path), skip_model_load=True)
        mlmodel.user_defined_metadata.clear()
        for key, value in encoded.items():
            mlmodel.user_defined_metadata[key] = value
        mlmodel.author = "libreyolo"
        mlmodel.version = meta["versions"]["libreyolo"]
        fresh = path.with_name("with-metadata-" + path.name)
        mlmodel.save(str(fresh))
        replace_folder(fresh, path)

    def content_sha256(self, path: Path) -> str:
        from libreyolo.export.metadata import mlpackage_content_sha256

        return mlpackage_content_sha256(path)

    def not_validated_reason(self, opts: ExportOptions) -> str | None:
        if sys.platform != "darwin":
            return NOT_ON_THIS_OS
        return INT8_NOT_COMPARED if opts.int8 else None

    def int8_metadata(self, path: Path, opts: ExportOptions) -> dict[str, Any]:
        ops = mlpackage_ops(path)
        if not any(o.startswith("constexpr_") for o in ops):
            raise ExportError("CoreML int8=True: coremltools quantized no weight of the ML Program (no constexpr_* "
                              f"weight op in it; ops: {sorted(ops)}); this is a bug, please report it")
        return {"scheme": INT8_SCHEME, "coreml": INT8_SCHEME + f" on {', '.join(INT8_OPS)} ops",
                "coreml_weight_ops": sorted(o for o in ops if o.startswith("constexpr_")),
                "activations_calibrated": False}

    def graph_ops(self, path: Path) -> set[str]:
        return mlpackage_ops(path)


EXPORTER = CoreMLExporter()
