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
from libreyolo.export.metadata import sidecar_path, write_sidecar

EXTRA = "executorch"


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


def lower_to_pte(module: torch.nn.Module, example: torch.Tensor, path: Path) -> None:
    """Export ``module`` with ``torch.export`` and lower it to an XNNPACK ``.pte`` at ``path``."""
    fold_batchnorm(module)
    exir = require("executorch.exir", EXTRA, "ExecuTorch export")
    partitioner = require("executorch.backends.xnnpack.partition.xnnpack_partitioner", EXTRA, "ExecuTorch export")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            program = torch.export.export(module, (example,), strict=False)
            edge = exir.to_edge_transform_and_lower(program, partitioner=[partitioner.XnnpackPartitioner()])
            buffer = edge.to_executorch().buffer
        except Exception as exc:
            raise ExportError(f"ExecuTorch export failed: {type(exc).__name__}: {exc}") from exc
    path.write_bytes(buffer)


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


class ExecuTorchExporter(Exporter):
    name = "executorch"
    suffix = ".pte"
    runtime = "executorch"
    extra = EXTRA
    toolchain = ("executorch",)

    def check(self, opts: ExportOptions) -> None:
        require("executorch.exir", EXTRA, "ExecuTorch export")
        if opts.device.type != "cpu":
            raise_cpu(opts)

    def build(self, module: torch.nn.Module, example: torch.Tensor, path: Path, opts: ExportOptions,
              work: Path) -> None:
        lower_to_pte(module, example, path)

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
