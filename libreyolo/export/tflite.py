"""LiteRT (TFLite) export: ``litert_torch.convert`` (``torch.export`` -> StableHLO -> TFLite flatbuffer)
-> ``.tflite``, the input kept NCHW like every other artifact of this library. ``half=True``: fp16
weights (``ai_edge_quantizer``'s weight-only float casting of the convolution, fully connected and
embedding weights, dequantized to float32 at load), computed in float32.

The flatbuffer holds no LibreYOLO metadata, so it goes into ``<name>.tflite.json`` next to it,
bound to the model by its sha256 (as for ExecuTorch). Validated with the LiteRT interpreter
(``ai_edge_litert``) on the CPU.
"""
from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path
from typing import Any

import torch

from libreyolo.errors import ArgumentError, require
from libreyolo.export.base import Exporter, ExportError, ExportOptions
from libreyolo.export.formats import get_format
from libreyolo.export.metadata import sidecar_path, write_sidecar

EXTRA = get_format("tflite").extra


def tflite_ops(path: str | Path) -> set[str]:
    """Builtin (and custom) operator names of a ``.tflite`` model, read with the LiteRT interpreter."""
    interp = require("ai_edge_litert.interpreter", EXTRA, "reading a TFLite model")
    it = interp.Interpreter(model_path=str(path))
    return {op["op_name"] for op in it._get_ops_details()}


def fp16_weights(source: Path, path: Path) -> None:
    """``source`` with its weights stored in float16 (weight-only float casting), written to ``path``."""
    quantizer = require("ai_edge_quantizer.quantizer", EXTRA, "TFLite fp16 weights")
    try:
        q = quantizer.Quantizer(str(source))
        q.load_quantization_recipe([{
            "regex": ".*", "operation": "*", "algorithm_key": "float_casting",
            "op_config": {"weight_tensor_config": {"num_bits": 16, "dtype": "FLOAT"},
                          "compute_precision": "FLOAT", "explicit_dequantize": True}}])
        q.quantize().export_model(str(path), overwrite=True)
    except Exception as exc:
        raise ExportError(f"LiteRT fp16 weights failed: {type(exc).__name__}: {str(exc)[:2000]}") from exc


def quantize_int8(module: torch.nn.Module, example: torch.Tensor, opts: ExportOptions) -> tuple[Any, Any]:
    """``module`` quantized for an INT8 flatbuffer: PT2E static quantization with litert-torch's
    ``PT2EQuantizer`` (XNNPACK's scheme: int8 activations per tensor, int8 weights per output channel
    symmetric), calibrated on the INT8 plan's images with the layers quantize() keeps in float left
    in float (:func:`libreyolo.export.executorch.quantize_pt2e`, the one PT2E flow). Returns the
    module and the converter's quantization config (static Q/DQ conversion)."""
    pt2e = require("litert_torch.quantize.pt2e_quantizer", EXTRA, "INT8 TFLite export (PT2E)")
    qcfg = require("litert_torch.quantize.quant_config", EXTRA, "INT8 TFLite export (PT2E)")
    from libreyolo.export.executorch import quantize_pt2e

    config = pt2e.get_symmetric_quantization_config(is_per_channel=True, is_dynamic=False)
    module = quantize_pt2e(module, example, opts, quantizer=pt2e.PT2EQuantizer, config=config, extra=EXTRA,
                           purpose="INT8 TFLite export (PT2E)", fold_quantize=False)
    return module, qcfg.QuantConfig(pt2e_quantizer=pt2e.PT2EQuantizer().set_global(config))


class TfliteExporter(Exporter, format="tflite"):
    toolchain = ("litert-torch", "ai-edge-litert", "ai-edge-quantizer")

    def check(self, opts: ExportOptions) -> None:
        require("litert_torch", EXTRA, "TFLite export")
        require("ai_edge_litert.interpreter", EXTRA, "TFLite export")
        if opts.device.type != "cpu":
            raise ArgumentError(f"TFLite models are converted from a CPU program; got device={opts.device}")

    def build(self, module: torch.nn.Module, example: torch.Tensor, path: Path, opts: ExportOptions,
              work: Path) -> None:
        from libreyolo.export.executorch import fold_batchnorm

        litert_torch = require("litert_torch", EXTRA, "TFLite export")
        fold_batchnorm(module)  # the converter folds them too; fewer nodes convert faster
        quant_config = None
        if opts.int8:
            module, quant_config = quantize_int8(module, example, opts)
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            try:
                edge = litert_torch.convert(module.float().eval(), (example,), quant_config=quant_config)
                edge.export(str(work / "float.tflite") if opts.half else str(path))
            except Exception as exc:
                raise ExportError(f"LiteRT conversion failed: {type(exc).__name__}: {str(exc)[:2000]}") from exc
            if opts.half:
                fp16_weights(work / "float.tflite", path)


    def write_metadata(self, path: Path, encoded: dict[str, str], meta: dict[str, Any]) -> None:
        write_sidecar(path, meta)

    def companions(self, path: Path) -> list[Path]:
        return [sidecar_path(path)]

    def not_validated_reason(self, opts: ExportOptions) -> str | None:
        try:
            import ai_edge_litert.interpreter  # noqa: F401
        except ImportError:
            return "the LiteRT interpreter (ai_edge_litert) is not importable here (pip install 'libreyolo[tflite]')"
        return None

    def graph_ops(self, path: Path) -> set[str]:
        return tflite_ops(path)


EXPORTER = TfliteExporter()
