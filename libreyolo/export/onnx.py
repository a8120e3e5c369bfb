"""ONNX export.

Exporter path: the TorchScript-based exporter (``torch.onnx.export(..., dynamo=False)``).
Why: it emits the requested opset directly (17 by default) from a symbolic table that has
been stable for years, takes ``dynamic_axes`` for batch and spatial sizes, and needs nothing
beyond torch and onnx. The dynamo exporter builds opset 18+ graphs and reaches lower opsets
through the ONNX version converter, which fails on some ops, and it needs onnxscript; its
graphs are not more portable for a convolutional detector. The traced graph is checked with
``onnx.checker`` and validated against eager before it is installed.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from libreyolo.errors import ArgumentError, require
from libreyolo.export.base import Exporter, ExportError, ExportOptions
from libreyolo.export.options import ONNX_OPSETS

DEFAULT_OPSET = 17
MIN_OPSET, MAX_OPSET = ONNX_OPSETS  # declared with the other export options


def dynamic_axes(module: Any, opts: ExportOptions) -> dict[str, dict[int, str]] | None:
    """ONNX ``dynamic_axes`` for the options: batch, plus height/width where contract and format allow."""
    if not opts.dynamic:
        return None
    contract = module.contract
    spatial = opts.dynamic_spatial
    axes: dict[str, dict[int, str]] = {contract.input_name: {0: "batch"}}
    if spatial:
        axes[contract.input_name].update({2: "height", 3: "width"})
    axes.update(module.output_axes(spatial))
    return axes


def export_onnx(module: torch.nn.Module, example: torch.Tensor, path: Path, opts: ExportOptions) -> None:
    """Trace ``module`` to an ONNX file at ``path`` (no metadata yet)."""
    onnx = require("onnx", "onnx", "ONNX export")
    contract = module.contract
    with warnings.catch_warnings():
        # tracer warnings about shape-dependent Python values are expected: every such value
        # (grid sizes, the NMS pad) is either static by design or derived from tensors
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(
                module, (example,), str(path), dynamo=False, opset_version=opts.opset,
                input_names=[contract.input_name], output_names=list(module.output_names()),
                dynamic_axes=dynamic_axes(module, opts), do_constant_folding=True,
            )
        except Exception as exc:
            raise ExportError(f"ONNX export failed: {type(exc).__name__}: {exc}") from exc
    model = onnx.load(str(path))
    from libreyolo.export.onnx_fold import fix_output_dims, fold_static_shapes

    if not opts.dynamic:  # shape arithmetic of a static graph is constant: folded for every reader
        fold_static_shapes(model)
    fix_output_dims(model, module.fixed_output_dims())
    if opts.simplify:
        slim = require("onnxslim", "onnx-simplify", "simplify=True (ONNX graph simplification)")
        model = slim.slim(model)
    onnx.checker.check_model(model)
    # set before the content hash is taken: write_metadata changes metadata_props only
    from libreyolo._version import __version__

    model.producer_name, model.producer_version = "libreyolo", __version__
    onnx.save(model, str(path))


class OnnxExporter(Exporter, format="onnx"):
    toolchain = ("onnx", "onnxruntime", "onnxslim")

    def check(self, opts: ExportOptions) -> None:
        require("onnx", "onnx", "ONNX export")
        check_opset(opts)

    def build(self, module: torch.nn.Module, example: torch.Tensor, path: Path, opts: ExportOptions,
              work: Path) -> None:
        export_onnx(module, example, path, opts)

    def write_metadata(self, path: Path, encoded: dict[str, str], meta: dict[str, Any]) -> None:
        onnx = require("onnx", "onnx", "ONNX export")
        model = onnx.load(str(path))
        del model.metadata_props[:]
        for key, value in encoded.items():
            entry = model.metadata_props.add()
            entry.key, entry.value = key, value
        onnx.save(model, str(path))

    def content_sha256(self, path: Path) -> str:
        from libreyolo.export.metadata import onnx_content_sha256

        return onnx_content_sha256(path.read_bytes())

    def not_validated_reason(self, opts: ExportOptions) -> str | None:
        try:
            import onnxruntime as ort
        except ImportError:
            return "onnxruntime is not installed (pip install 'libreyolo[onnx]')"
        if opts.half and "CUDAExecutionProvider" not in ort.get_available_providers():
            return "an fp16 ONNX model is validated on ONNX Runtime's CUDA provider, which is not available here"
        return None

    def graph_ops(self, path: Path) -> set[str]:
        return onnx_ops(path)

    def int8_parameters(self, path: Path) -> dict[str, Any]:
        """``{name: array}`` of the named tensors the graph's QuantizeLinear/DequantizeLinear nodes
        read (initializers, also through the Identity nodes that de-duplication leaves)."""
        onnx = require("onnx", "onnx", "reading an ONNX graph")
        from onnx import numpy_helper

        model = onnx.load(str(path))
        values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        alias = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Identity"}
        found = {}
        for node in model.graph.node:
            if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
                for name in node.input:
                    source = name
                    while source not in values and source in alias:
                        source = alias[source]
                    if source in values:
                        found[name] = values[source]
        return found


def check_opset(opts: ExportOptions) -> None:
    if opts.opset is None:
        opts.opset = DEFAULT_OPSET
    if isinstance(opts.opset, bool) or not isinstance(opts.opset, int) or not MIN_OPSET <= opts.opset <= MAX_OPSET:
        raise ArgumentError(f"opset must be an integer from {MIN_OPSET} to {MAX_OPSET}, got {opts.opset!r}")


WEIGHT_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")  # the ops a quantized layer becomes


def node_module(node_name: str, prefix: str = "net") -> str | None:
    """The module path of a TorchScript-exported ONNX node: ``/net/a/b/b.0/conv/Conv`` -> ``a.b.0.conv``.

    The exporter names a node by its module scopes, where a child of a container is written
    ``<parent>.<index>`` after its parent's own scope; the last part is the op (``Conv``, ``Conv_1``)."""
    parts = [p for p in node_name.split("/") if p][:-1]
    if not parts or parts[0] != prefix:
        return None
    path: list[str] = []
    previous = parts[0]
    for part in parts[1:]:
        name = part[len(previous) + 1:] if part.startswith(previous + ".") else part
        path.append(name)
        previous = part
    return ".".join(path)


def onnx_ops(path: str | Path) -> set[str]:
    """``domain::op`` for non-standard ops, plain op type for the default ONNX domain."""
    onnx = require("onnx", "onnx", "reading an ONNX graph")
    model = onnx.load(str(path))
    found: set[str] = set()

    def walk(graph: Any) -> None:
        for node in graph.node:
            found.add(node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}")
            for attr in node.attribute:
                if attr.g is not None and attr.g.node:
                    walk(attr.g)

    walk(model.graph)
    return found


EXPORTER = OnnxExporter()
