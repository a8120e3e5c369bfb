"""Triton Inference Server export: one model folder of a Triton model repository.

``<repository>/<name>/config.pbtxt`` + ``<repository>/<name>/1/model.onnx``, served by Triton's
``onnxruntime`` backend. The Triton export is the ONNX export plus this layout: ``model.onnx``
is written by :func:`libreyolo.export.onnx.export_onnx` with the same metadata, and it is
validated against eager with ONNX Runtime exactly as ``format=onnx`` is (the validator loads the
folder through :mod:`libreyolo.runtimes.triton`, which opens the ``model.onnx`` it serves). The
batch axis is always dynamic, since Triton batches requests along it (``max_batch_size``).

``config.pbtxt`` is written from the exported graph (input/output names, data types, dims
without the batch axis; an output of shape ``(batch,)`` becomes ``dims: [1]`` with
``reshape: { shape: [] }``, Triton's form for it) and from the options ``max_batch``,
``preferred_batch``, ``queue_delay_us`` and ``instances``. Its ``parameters`` carry the
LibreYOLO metadata as strings (the same entries as the ONNX ``metadata_props``, hashed by
``metadata_sha256``; ``validation`` as a summary), which is all the client runtime
(``LibreYOLO("grpc://host:8001/<name>")``) needs to letterbox and decode. Not run against a
live Triton server on the machines this was written on: the config is checked against
Triton's own protobuf schema (``tritonclient``'s ``model_config_pb2``) by the tests.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch

from libreyolo.errors import ArgumentError
from libreyolo.export.base import Exporter, ExportError, ExportOptions
from libreyolo.export.onnx import EXPORTER as ONNX
from libreyolo.export.onnx import dynamic_axes, export_onnx, onnx_ops

CONFIG = "config.pbtxt"
VERSION = "1"
MODEL_FILE = "model.onnx"
DEFAULTS: dict[str, Any] = {"max_batch": 8, "preferred_batch": [], "queue_delay_us": 100, "instances": 1}
# a model name that is a folder name on every OS and one URL path segment
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
# ONNX TensorProto element type -> Triton data type (config: "TYPE_" + it; KServe v2 metadata: it)
DATA_TYPES = {1: "FP32", 2: "UINT8", 3: "INT8", 4: "UINT16", 5: "INT16", 6: "INT32", 7: "INT64", 9: "BOOL",
              10: "FP16", 11: "FP64", 12: "UINT32", 13: "UINT64", 16: "BF16"}


def model_file(folder: str | Path) -> Path:
    """The served ONNX file of a model folder."""
    return Path(folder) / VERSION / MODEL_FILE


def _escape(text: str) -> str:
    """A protobuf text-format string literal (C escapes; bytes beyond ASCII as octal, as protobuf writes them)."""
    out = []
    for byte in text.encode("utf-8"):
        char = chr(byte)
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif 0x20 <= byte < 0x7F:
            out.append(char)
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def graph_tensors(path: str | Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(inputs, outputs)`` of an ONNX file: ``{"name", "data_type", "shape"}``, None for a symbolic axis."""
    from libreyolo.errors import require

    onnx = require("onnx", "onnx", "reading an ONNX graph")
    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {t.name for t in graph.initializer}

    def describe(value: Any) -> dict[str, Any]:
        kind = value.type.tensor_type.elem_type
        if kind not in DATA_TYPES:
            raise ExportError(f"the ONNX tensor {value.name!r} has element type {kind}, which Triton has no type for")
        dims = value.type.tensor_type.shape.dim
        return {"name": value.name, "data_type": DATA_TYPES[kind],
                "shape": [d.dim_value if d.HasField("dim_value") else None for d in dims]}

    return ([describe(v) for v in graph.input if v.name not in initializers], [describe(v) for v in graph.output])


def _tensor(entry: dict[str, Any], batched: bool) -> str:
    shape = entry["shape"]
    if batched:
        if not shape or shape[0] is not None:
            raise ExportError(f"the ONNX tensor {entry['name']!r} has shape {shape}, without a dynamic batch axis "
                              "first, so Triton cannot batch it; this is a bug of the family's export contract")
        shape = shape[1:]
    dims = [-1 if d is None else int(d) for d in shape]
    lines = [f"    name: {_escape(entry['name'])}", f"    data_type: TYPE_{entry['data_type']}"]
    if dims:
        lines.append(f"    dims: [ {', '.join(map(str, dims))} ]")
    else:  # a (batch,) tensor: Triton's form is one element per request, reshaped to a scalar for the model
        lines += ["    dims: [ 1 ]", "    reshape: { shape: [ ] }"]
    return "  {\n" + "\n".join(lines) + "\n  }"


def parameters(encoded: dict[str, str]) -> dict[str, str]:
    """The LibreYOLO metadata as config ``parameters``: every entry, ``validation`` summarised (it
    is outside ``metadata_sha256``, and the full report stays in ``model.onnx``)."""
    out = dict(encoded)
    if "validation" in out:
        full = json.loads(out["validation"])
        out["validation"] = json.dumps({k: full[k] for k in ("status", "summary", "runtime", "reason") if k in full},
                                       sort_keys=True)
    return out


def fixed_shapes(tensors: list[dict[str, Any]], traced: dict[str, tuple[int, ...]],
                 axes: dict[str, dict[int, str]]) -> list[dict[str, Any]]:
    """The graph's tensors with every axis the export contract keeps fixed set to its traced size.

    The TorchScript exporter leaves output axes symbolic once any axis is dynamic (e.g. the class
    and anchor axes of ``predictions``), though only the batch axis (and height/width with
    ``dynamic=True``) may change; the config states the fixed sizes so that clients and the
    runtime's ``nc`` check see them."""
    out = []
    for t in tensors:
        shape = list(t["shape"])
        sizes = traced.get(t["name"])
        if sizes is not None:
            if len(sizes) != len(shape):
                raise ExportError(f"the ONNX tensor {t['name']!r} has rank {len(shape)} but the traced module's "
                                  f"output has shape {tuple(sizes)}; this is a bug, please report it")
            dynamic = axes.get(t["name"], {})
            for axis, size in enumerate(sizes):
                if axis in dynamic:
                    shape[axis] = None
                elif shape[axis] is None:
                    shape[axis] = int(size)
                elif shape[axis] != size:
                    raise ExportError(f"the ONNX tensor {t['name']!r} has shape {t['shape']} but the traced module's "
                                      f"output has shape {tuple(sizes)}; this is a bug, please report it")
        out.append({**t, "shape": shape})
    return out


def model_config(name: str, inputs: list[dict[str, Any]], outputs: list[dict[str, Any]], options: dict[str, Any],
                 encoded: dict[str, str] | None = None) -> str:
    """The ``config.pbtxt`` text of a model folder (Triton's ModelConfig schema) serving a graph with
    ``inputs``/``outputs`` (:func:`graph_tensors`), with ``encoded`` metadata as its parameters."""
    o = {**DEFAULTS, **{k: v for k, v in options.items() if k in DEFAULTS and v is not None}}
    lines = [f"name: {_escape(name)}", 'platform: "onnxruntime_onnx"', 'backend: "onnxruntime"',
             f"default_model_filename: {_escape(MODEL_FILE)}", f"max_batch_size: {int(o['max_batch'])}"]
    lines += ["input [", ",\n".join(_tensor(t, True) for t in inputs), "]"]
    lines += ["output [", ",\n".join(_tensor(t, True) for t in outputs), "]"]
    lines.append("dynamic_batching {")
    if o["preferred_batch"]:
        lines.append(f"  preferred_batch_size: [ {', '.join(str(int(b)) for b in o['preferred_batch'])} ]")
    lines += [f"  max_queue_delay_microseconds: {int(o['queue_delay_us'])}", "}"]
    # KIND_AUTO: on the server's GPUs when it has them, else on its CPU
    lines.append(f"instance_group [ {{ count: {int(o['instances'])} kind: KIND_AUTO }} ]")
    return "\n".join(lines) + "\n" + parameter_lines(encoded or {})


def parameter_lines(encoded: dict[str, str]) -> str:
    """The ``parameters`` entries of the config, one line each (the metadata as strings)."""
    return "".join(f"parameters {{ key: {_escape(key)} value: {{ string_value: {_escape(value)} }} }}\n"
                   for key, value in sorted(parameters(encoded).items()))


def _default_folder(model: Any) -> tuple[Path, str]:
    source = getattr(model, "source", None)
    if source:
        return Path(source).parent, Path(source).stem
    return Path("."), f"{model.family.name}{model.size}"


class TritonExporter(Exporter, format="triton"):
    toolchain = ("onnx", "onnxruntime", "onnxslim")

    def check(self, opts: ExportOptions) -> None:
        ONNX.check(opts)
        o = opts.format_options
        o.update({k: v for k, v in DEFAULTS.items() if o.get(k) is None})
        if opts.batch > o["max_batch"]:
            raise ArgumentError(f"batch={opts.batch} is larger than max_batch={o['max_batch']}: batch is the size the "
                                "export traces and validates with, max_batch the largest batch Triton may send; pass "
                                "a batch <= max_batch")
        over = [b for b in o["preferred_batch"] if b > o["max_batch"]]
        if over:
            raise ArgumentError(f"preferred_batch {over} exceed max_batch={o['max_batch']}; Triton refuses a "
                                "preferred batch size above max_batch_size")
        # Triton batches along axis 0, so it is dynamic whatever `dynamic` says; `dynamic=True` adds
        # dynamic height/width where the family allows (dynamic_spatial was set from it)
        opts.dynamic = True

    def resolve_output(self, model: Any, output: Any, name: Any) -> Path:
        folder, stem = _default_folder(model)
        repository = Path(output) if output is not None else folder / "model_repository"
        model_name = str(name) if name is not None else re.sub(r"[^A-Za-z0-9_.-]", "_", stem).lstrip("._-") or "model"
        if not MODEL_NAME.match(model_name):
            raise ArgumentError(f"name={model_name!r:.80} is not a usable Triton model name: use letters, digits, '_', "
                                "'.' and '-' (starting with a letter or digit, at most 128), e.g. name=yolo9t")
        if repository.exists() and not repository.is_dir():
            raise ArgumentError(f"output {str(repository)!r} is a file; for format=triton, output is the model "
                                "repository folder that will hold <name>/config.pbtxt and <name>/1/model.onnx")
        parent = repository if repository.is_dir() else repository.parent
        if not parent.is_dir():
            raise ArgumentError(f"cannot create the model repository {repository}: the folder {parent} does not exist")
        if not os.access(parent, os.W_OK):
            raise ArgumentError(f"cannot write the model repository {repository}: {parent} is not writable")
        final = repository / model_name
        if final.is_symlink() or (final.exists() and not final.is_dir()):
            raise ArgumentError(f"cannot write {final}: it exists and is not a model folder; remove it or pass "
                                "another name=")
        if final.is_dir():
            ours = {Path(CONFIG), Path(VERSION), Path(VERSION) / MODEL_FILE}
            other = sorted(str(p.relative_to(final)) for p in final.rglob("*") if p.relative_to(final) not in ours)
            if other:
                raise ArgumentError(f"{final} already holds {', '.join(other[:3])}{', ...' if len(other) > 3 else ''}; "
                                    "the export replaces the whole model folder (config.pbtxt and version 1), so it "
                                    "refuses to delete other files or versions: move them, or pass another name=")
        return final

    def work_parent(self, final: Path) -> Path:
        # beside the repository, not inside it: Triton (--model-control-mode=poll) would take a
        # build folder in the repository for a model; inside it only where the repository is
        # another file system (a mount), so the rename stays atomic
        repository = final.parent
        if not repository.is_dir():
            return repository.parent
        outside = repository.parent
        if os.access(outside, os.W_OK) and os.stat(outside).st_dev == os.stat(repository).st_dev:
            return outside
        return repository

    def build(self, module: torch.nn.Module, example: torch.Tensor, path: Path, opts: ExportOptions,
              work: Path) -> None:
        model_file(path).parent.mkdir(parents=True)
        export_onnx(module, example, model_file(path), opts)
        traced = {k: tuple(v.shape) for k, v in module.run(example).items()}
        inputs, outputs = graph_tensors(model_file(path))
        axes = dynamic_axes(module, opts) or {}
        body = model_config(path.name, fixed_shapes(inputs, {}, axes), fixed_shapes(outputs, traced, axes),
                            opts.format_options)
        (path / CONFIG).write_text(body, encoding="utf-8")  # the parameters follow with the metadata

    def write_metadata(self, path: Path, encoded: dict[str, str], meta: dict[str, Any]) -> None:
        ONNX.write_metadata(model_file(path), encoded, meta)
        config = path / CONFIG
        body = [line for line in config.read_text(encoding="utf-8").splitlines(keepends=True)
                if not line.startswith("parameters {")]
        tmp = path / (CONFIG + ".tmp")
        tmp.write_text("".join(body) + parameter_lines(encoded), encoding="utf-8")
        os.replace(tmp, config)

    def content_sha256(self, path: Path) -> str:
        return ONNX.content_sha256(model_file(path))

    def not_validated_reason(self, opts: ExportOptions) -> str | None:
        return ONNX.not_validated_reason(opts)

    def report_notes(self, final: Path, opts: ExportOptions) -> list[str]:
        o = opts.format_options
        return [f"validated: the model.onnx Triton serves, on ONNX Runtime; not run here: a Triton server "
                f"(config.pbtxt: max_batch_size {o['max_batch']}, dynamic batching, {o['instances']} instance(s)). "
                f"Serve it: tritonserver --model-repository={final.parent}; predict: "
                f"LibreYOLO('grpc://<host>:8001/{final.name}')"]

    def graph_ops(self, path: Path) -> set[str]:
        return onnx_ops(model_file(path))


EXPORTER = TritonExporter()
