"""ExecuTorch export: ``torch.export`` -> edge dialect -> XNNPACK delegate -> ``.pte``.

Static shapes (the batch and imgsz of the export). The program holds no metadata, so it goes
into ``<name>.pte.json`` next to it, bound to the program by its sha256. Validated with the
ExecuTorch Python runtime on the CPU.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from libreyolo.errors import require
from libreyolo.export.base import Exporter, ExportError, ExportOptions
from libreyolo.export.formats import get_format
from libreyolo.export.metadata import sidecar_path, write_sidecar

EXTRA = get_format("executorch").extra


def fold_batchnorm(module: torch.nn.Module) -> int:
    """Fold every shared ``ConvBNAct`` block's BatchNorm into its convolution (eval mode).

    XNNPACK fuses them during lowering anyway; doing it first shrinks the graph that the edge
    passes walk, which cuts lowering time by about a third. Returns the number folded. The
    module must be a private copy (the driver exports a deep copy of the network).
    """
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    from libreyolo.layers.conv import ConvBNAct

    count = 0
    for block in module.modules():
        if isinstance(block, ConvBNAct) and isinstance(block.bn, torch.nn.BatchNorm2d):
            block.conv = fuse_conv_bn_eval(block.conv, block.bn)
            block.bn = torch.nn.Identity()
            count += 1
    return count


def lower_to_pte(module: torch.nn.Module, example: torch.Tensor, path: Path, check_ir: bool = True) -> None:
    """Export ``module`` with ``torch.export`` and lower it to an XNNPACK ``.pte`` at ``path``."""
    fold_batchnorm(module)
    exir = require("executorch.exir", EXTRA, "ExecuTorch export")
    # an INT8 graph skips the edge IR checks: they walk every q/dq node (minutes); the program is run
    # and validated afterwards either way
    config = exir.EdgeCompileConfig(_check_ir_validity=check_ir)
    partitioner = require("executorch.backends.xnnpack.partition.xnnpack_partitioner", EXTRA, "ExecuTorch export")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            program = torch.export.export(module, (example,), strict=False)
            edge = exir.to_edge_transform_and_lower(program, partitioner=[partitioner.XnnpackPartitioner()],
                                                    compile_config=config)
            buffer = edge.to_executorch().buffer
        except Exception as exc:
            raise ExportError(f"ExecuTorch export failed: {type(exc).__name__}: {exc}") from exc
    path.write_bytes(buffer)


def quantize_pt2e(module: torch.nn.Module, example: torch.Tensor, opts: ExportOptions,
                  quantizer: Any = None, config: Any = None, extra: str = EXTRA,
                  purpose: str = "INT8 ExecuTorch export (PT2E)", fold_quantize: bool = True) -> torch.nn.Module:
    """``module``'s network quantized by the PT2E flow: int8 per-channel symmetric weights, int8
    activations, observers calibrated on the INT8 plan's images (the same as quantize()'s), the
    layers quantize() keeps in float left in float. ``quantizer`` is the PT2E quantizer class
    (default: ExecuTorch's ``XNNPACKQuantizer``; LiteRT passes its own XNNPACK-style
    ``PT2EQuantizer``) and ``config`` its global quantization config (default: the class module's
    static symmetric per-channel config). ``fold_quantize=False`` keeps each weight as a float
    constant followed by quantize/dequantize instead of int8 codes (what litert-torch's lowering
    reads: folded int8 weights fail its StableHLO ``uniform_dequantize``). Returns ``module`` with
    its network replaced by the converted graph."""
    quantize = require("torchao.quantization.pt2e.quantize_pt2e", extra, purpose)
    pt2e = require("torchao.quantization.pt2e", extra, purpose)
    if quantizer is None:
        xq = require("executorch.backends.xnnpack.quantizer.xnnpack_quantizer", extra, purpose)
        quantizer, config = xq.XNNPACKQuantizer, xq.get_symmetric_quantization_config(is_per_channel=True)
    plan = opts.calibration
    layers = frozenset(plan.quantized.quant_info()["layers"])
    net = module.net
    fold_batchnorm(net)

    def keep(node: Any) -> bool:
        stack = list((node.meta.get("nn_module_stack") or {}).values())
        return bool(stack) and stack[-1][0] in layers

    class OnlyQuantizedLayers(quantizer):
        """The quantizer's annotations on the operators of the layers quantize() quantizes only. Its global
        config also annotates concatenations (one shared scale for all inputs), and the head's
        concat of boxes (hundreds of pixels) and scores (0..1) would round every score to 0."""

        def annotate(self, model: Any) -> Any:
            model = super().annotate(model)
            for node in model.graph.nodes:
                if not keep(node):
                    node.meta.pop("quantization_annotation", None)
            return model

    only = OnlyQuantizedLayers().set_global(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            graph = torch.export.export(net, (example,), strict=False).module()
            prepared = quantize.prepare_pt2e(graph, only)
            size = example.shape[0]
            with torch.no_grad():
                for batch in plan.batches():  # the program is static: fed in chunks of its batch size
                    for i in range(0, batch.shape[0], size):
                        chunk = batch[i:i + size]
                        if chunk.shape[0] < size:
                            chunk = torch.cat([chunk, chunk[-1:].expand(size - chunk.shape[0], *chunk.shape[1:])])
                        prepared(chunk.to(example.dtype))
            converted = quantize.convert_pt2e(prepared, fold_quantize=fold_quantize)
        except Exception as exc:
            raise ExportError(f"{purpose} failed in the PT2E quantization: {type(exc).__name__}: {exc}") from exc
    pt2e.allow_exported_model_train_eval(converted)
    plan.own_reference = converted  # PT2E's own quantization run in eager: the validator's quantization floor
    module.net = converted
    return module


def pte_ops(path: str | Path) -> set[str]:
    """Operators the program calls outside delegates, plus ``delegate::<backend>`` per delegate."""
    ser = require("executorch.exir._serialize._program", EXTRA, "reading an ExecuTorch program")
    pte = ser.deserialize_pte_binary(Path(path).read_bytes())
    program = getattr(pte, "program", pte)
    found: set[str] = set()
    for plan in program.execution_plan:
        found |= {op.name + (f".{op.overload}" if op.overload else "") for op in plan.operators}
        found |= {f"delegate::{d.id}" for d in plan.delegates}
    return found


class ExecuTorchExporter(Exporter, format="executorch"):
    toolchain = ("executorch",)

    def check(self, opts: ExportOptions) -> None:
        require("executorch.exir", EXTRA, "ExecuTorch export")
        if opts.device.type != "cpu":
            raise_cpu(opts)

    def build(self, module: torch.nn.Module, example: torch.Tensor, path: Path, opts: ExportOptions,
              work: Path) -> None:
        if opts.int8:
            module = quantize_pt2e(module, example, opts)
        lower_to_pte(module, example, path, check_ir=not opts.int8)

    def write_metadata(self, path: Path, encoded: dict[str, str], meta: dict[str, Any]) -> None:
        write_sidecar(path, meta)

    def companions(self, path: Path) -> list[Path]:
        return [sidecar_path(path)]

    def not_validated_reason(self, opts: ExportOptions) -> str | None:
        try:
            import executorch.runtime  # noqa: F401
        except ImportError:
            return "the ExecuTorch Python runtime (executorch.runtime) is not importable here"
        return None

    def graph_ops(self, path: Path) -> set[str]:
        return pte_ops(path)


def raise_cpu(opts: ExportOptions) -> None:
    from libreyolo.errors import ArgumentError

    raise ArgumentError(f"ExecuTorch programs are exported and run on the CPU (XNNPACK); got device={opts.device}")


EXPORTER = ExecuTorchExporter()
