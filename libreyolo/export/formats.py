"""The format table: one row per artifact format, and everything that is read from it.

Each :class:`Format` row declares a format once: its name and aliases, how its artifact's name
ends, the exporter module (``libreyolo.export.<exporter>``, holding ``EXPORTER``), the runtime
module (``libreyolo.runtimes.<runtime>``, holding ``load``), the pip extra that brings its
toolchain, its capabilities (dynamic batch / size, fp16, INT8, NMS inside the graph, the largest
tensor rank) and the export options that belong to it. From the table come:

- the exporter lookup (:func:`libreyolo.export.base.get_exporter`) and the capabilities each
  :class:`~libreyolo.export.base.Exporter` exposes (its class attributes are filled from its row);
- artifact loading by name ending (:func:`artifact_runtime`, used by ``LibreYOLO(path)``);
- the ``format`` option's check and help, and which format-scoped options a format refuses
  (:mod:`libreyolo.export.options`, so ``libreyolo export --help`` and every entry point agree);
- ``libreyolo benchmark``'s default rows and devices;
- the README's and ``docs/formats.md``'s format tables (``tools/readme_tables.py``).

Adding a format is one exporter module, one runtime module and one row here: ``docs/formats.md``.
This module imports nothing heavy (no torch), so the CLI reads it before it does any work.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libreyolo.errors import ArgumentError


@dataclass(frozen=True)
class OptionGroup:
    """Export options that only some formats take. ``label`` is how an error names the formats
    that take them (``"ONNX-based formats"``); empty: by their names."""

    names: tuple[str, ...]
    label: str = ""


ONNX_GRAPH = OptionGroup(("opset", "simplify"), "ONNX-based formats")  # formats built from the ONNX graph
WORKSPACE = OptionGroup(("workspace",))
AUTOTUNE = OptionGroup(("autotune",))
TRITON_CONFIG = OptionGroup(("max_batch", "preferred_batch", "queue_delay_us", "instances"))


@dataclass(frozen=True)
class Format:
    """One artifact format (see the module's docstring)."""

    name: str
    suffix: str                        # how the artifact's name ends: a file suffix or a folder's ending
    exporter: str                      # module under libreyolo.export that holds ``EXPORTER``
    runtime: str                       # module under libreyolo.runtimes whose ``load`` runs the artifact
    extra: str                         # pip extra that brings the toolchain (libreyolo[<extra>])
    help: str                          # a few words for --help and the docs' table
    aliases: tuple[str, ...] = ()
    directory: bool = False            # the artifact is a folder (installed by an atomic folder swap)
    loads_by_suffix: bool = True       # LibreYOLO(path) picks the runtime by the name's ending
    dynamic_batch: bool = False        # can the artifact take a dynamic batch size (dynamic=True)
    batch_axis_dynamic: bool = False   # the batch axis is dynamic whatever ``dynamic`` says
    dynamic_spatial: bool = True       # ... and a dynamic height/width, where the family allows it
    half: str = "no"                   # "no", "cuda" (fp16 traced on a CUDA device) or "any"
    # INT8: "no"; "qdq": the graph of quantize()'s simulated layers is exported; "own": the float
    # graph is exported and the format's toolchain quantizes it from the calibration data
    int8: str = "no"
    embedded_nms: bool = False         # nms=True puts NMS inside the graph
    # e2e=True: the artifact takes uint8 pixels and normalises inside (libreyolo.export.e2e); formats whose
    # runtime feeds an integer input and that were validated with it
    e2e_input: bool = False
    options: tuple[OptionGroup, ...] = ()  # format-scoped options it takes; every other format refuses them
    # the largest tensor rank (batch included) the converter maps, None: no limit; families whose
    # ExportContract.tensor_rank exceeds it are refused with ``rank_limit`` as the reason
    max_tensor_rank: int | None = None
    rank_limit: str = ""
    # the converter has no top-k/gather: a family with a query selection (SetContract.selection) is
    # exported as the two programs of its SetContract.host_selection, the selection run on the host by
    # the runtime; a family that declares no such split is refused before anything is built
    selection_on_host: bool = False
    traced_on_cpu: bool = False        # exported and run on the CPU whatever the model's device (benchmark)
    build_needs: tuple[str, str] | None = None  # (package, why): built only where it runs (benchmark)
    benchmarked: bool = True           # a default row of ``libreyolo benchmark`` (False: another row's file)

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(n for group in self.options for n in group.names)


FORMAT_TABLE: tuple[Format, ...] = (
    Format("onnx", ".onnx", "onnx", "onnx", "onnx", "ONNX (ONNX Runtime)", dynamic_batch=True, half="cuda",
           int8="qdq", embedded_nms=True, e2e_input=True, options=(ONNX_GRAPH,)),
    # int8: PT2E + XNNPACKQuantizer, calibrated on the INT8 plan's images
    Format("executorch", ".pte", "executorch", "executorch", "executorch", "ExecuTorch program (XNNPACK)",
           aliases=("pte",), int8="own", traced_on_cpu=True),
    # half: fp16 is a conversion option (compute precision), no GPU needed; int8: 8-bit weights by
    # coremltools, float activations
    Format("coreml", ".mlpackage", "coreml", "coreml", "coreml", "Core ML package (macOS to run)",
           aliases=("mlpackage",), directory=True, half="any", int8="own", traced_on_cpu=True),
    # dynamic batch through an optimisation profile, the input size fixed; strongly typed: fp16 is the
    # ONNX traced in float16 on CUDA, INT8 the Q/DQ ONNX of quantize()'s layers
    Format("tensorrt", ".engine", "tensorrt", "tensorrt", "tensorrt", "TensorRT engine (NVIDIA GPU)",
           aliases=("engine", "trt"), dynamic_batch=True, dynamic_spatial=False, half="cuda", int8="qdq",
           embedded_nms=True, options=(ONNX_GRAPH, WORKSPACE),
           build_needs=("tensorrt", "needs tensorrt and an NVIDIA GPU")),
    # extra "torch": nothing beyond torch (plus a C++ compiler for CPU packages)
    Format("aoti", ".pt2", "aoti", "aoti", "torch", "AOTInductor package .pt2", aliases=("pt2", "aotinductor"),
           dynamic_batch=True, dynamic_spatial=False, half="cuda", options=(AUTOTUNE,)),
    # a model repository folder <output>/<name>/ (no suffix: LibreYOLO() knows it by its layout, and the
    # validator opens its model.onnx with ONNX Runtime); Triton batches requests along axis 0; not a
    # default benchmark row: locally it is the onnx row's file (a server is measured with perf_analyzer)
    Format("triton", "", "triton", "triton", "onnx", "a Triton Inference Server model folder",
           directory=True, loads_by_suffix=False, dynamic_batch=True, batch_axis_dynamic=True, half="cuda",
           embedded_nms=True, options=(ONNX_GRAPH, TRITON_CONFIG), benchmarked=False),
    # NCNN's Mat holds at most 4 axes; pnnx maps a batch-1 tensor to it by dropping the batch axis. Measured with
    # pnnx 20261020: a rank-5 q/k/v split with a permuted batch axis was dropped and the param file did not load
    # (ViT and the DETR deformable sampling now trace at rank 4); Swin's window partitions, LW-DETR's windows and
    # RF-DETR's DINOv2 q/k/v stay above it. NCNN has no top-k or gather layer (the DETR query selection): a
    # family that declares a split at its selection is exported as two programs with the selection on the host;
    # any other operator NCNN has no layer for is refused after conversion by the exporter, naming it
    Format("ncnn", "_ncnn_model", "ncnn", "ncnn", "ncnn", "an NCNN folder <stem>_ncnn_model", directory=True,
           traced_on_cpu=True, max_tensor_rank=4, selection_on_host=True,
           rank_limit="NCNN tensors hold at most 4 axes with the batch axis (pnnx cannot map this family's "
                      "rank-5/6 window partitions or q/k/v splits)"),
    # half: fp16 weights, a post-conversion step on the flatbuffer, no GPU needed; int8: PT2E static
    # quantization (litert-torch's PT2EQuantizer), calibrated on the INT8 plan's images
    Format("tflite", ".tflite", "tflite", "tflite", "tflite", "LiteRT/TFLite flatbuffer", aliases=("litert",),
           half="any", int8="own", traced_on_cpu=True),
    # converted from the ONNX export (opset/simplify apply to that graph); half: fp16 weights in the IR,
    # computed at the validated precision (f32); int8: NNCF on the float IR, calibrated on the INT8 plan's images
    Format("openvino", "_openvino_model", "openvino", "openvino", "openvino",
           "an OpenVINO IR folder <stem>_openvino_model", aliases=("ov",), directory=True, dynamic_batch=True,
           half="any", int8="own", embedded_nms=True, e2e_input=True, options=(ONNX_GRAPH,), traced_on_cpu=True),
)

FORMATS: tuple[str, ...] = tuple(f.name for f in FORMAT_TABLE)
_BY_NAME = {f.name: f for f in FORMAT_TABLE}
_BY_ALIAS = {a: f.name for f in FORMAT_TABLE for a in f.aliases}
# every format-scoped option and the formats that take it
SCOPED_OPTIONS: dict[str, tuple[str, ...]] = {}
for _f in FORMAT_TABLE:
    for _n in _f.option_names:
        SCOPED_OPTIONS[_n] = (*SCOPED_OPTIONS.get(_n, ()), _f.name)


def _check_table() -> None:
    """The table is consistent (names, aliases and endings unique); run at import."""
    names = [*FORMATS, *_BY_ALIAS]
    if len(set(names)) != len(names):
        raise RuntimeError(f"libreyolo.export.formats: a format name or alias is declared twice: {names}")
    endings = [f.suffix for f in FORMAT_TABLE if f.loads_by_suffix]
    if len(set(endings)) != len(endings) or "" in endings:
        raise RuntimeError(f"libreyolo.export.formats: artifact endings must be distinct and non-empty: {endings}")


_check_table()


def format_name(value: Any) -> str:
    """The canonical format name of ``value`` (a name, an alias or a suffix such as ``.pte``), or
    :class:`ArgumentError` naming the known formats."""
    key = value.strip().lower().lstrip(".") if isinstance(value, str) else None
    key = _BY_ALIAS.get(key, key)
    if key not in _BY_NAME:
        raise ArgumentError(f"unknown export format {value!r:.60}; choose one of: {', '.join(FORMATS)}")
    return key


def get_format(value: Any) -> Format:
    """The row of a format name, alias or suffix."""
    return _BY_NAME[format_name(value)]


def artifact_runtime(path: str | Path) -> str | None:
    """The runtime module of an artifact path, by how its name ends (a file suffix or a folder's
    ``_<format>_model``), or None."""
    name = Path(path).name.lower()
    return next((f.runtime for f in FORMAT_TABLE if f.loads_by_suffix and name.endswith(f.suffix)), None)


def artifact_endings() -> tuple[str, ...]:
    """Every artifact ending ``LibreYOLO(path)`` loads by name (for help texts)."""
    return tuple(f.suffix for f in FORMAT_TABLE if f.loads_by_suffix)


def foreign_options(fmt: Format, given: dict[str, Any]) -> str | None:
    """The error for format-scoped options in ``given`` (name -> value, only those passed) that
    ``fmt`` does not take, or None."""
    for group in dict.fromkeys(g for f in FORMAT_TABLE for g in f.options):
        if group in fmt.options:
            continue
        passed = [n for n in group.names if n in given]
        if not passed:
            continue
        takers = ", ".join(f.name for f in FORMAT_TABLE if group in f.options)
        if group.label:
            return f"{'/'.join(group.names)} apply to {group.label} ({takers}), not format={fmt.name}"
        verb = "applies" if len(passed) == 1 else "apply"
        return f"{', '.join(passed)} {verb} only to format={takers}, not format={fmt.name}"
    return None


def int8_formats() -> tuple[str, ...]:
    """Formats that write INT8 artifacts."""
    return tuple(f.name for f in FORMAT_TABLE if f.int8 != "no")


def capabilities(f: Format) -> list[str]:
    """A format's capabilities in words (``--help`` and the docs' table)."""
    half = {"cuda": "fp16 (CUDA export)", "any": "fp16"}
    int8 = {"qdq": "INT8 (Q/DQ graph)", "own": "INT8 (toolchain)"}
    return [*(["dynamic batch" + (" and size" if f.dynamic_spatial else "")] if f.dynamic_batch else []),
            *([half[f.half]] if f.half in half else []), *([int8[f.int8]] if f.int8 in int8 else []),
            *(["NMS inside"] if f.embedded_nms else []), *(["end-to-end uint8 input"] if f.e2e_input else []),
            *([f"tensors of rank <= {f.max_tensor_rank}"] if f.max_tensor_rank is not None else []),
            *(["DETR query selection on the host (families that declare the split)"] if f.selection_on_host else [])]


def help_lines() -> list[str]:
    """One line per format for ``libreyolo export --help``."""
    lines = []
    for f in FORMAT_TABLE:
        ending = (f"*{f.suffix}" if f.suffix else "<name>") + ("/" if f.directory else "")
        what = "; ".join([f.help, *capabilities(f)])
        also = f" (also: {', '.join(f.aliases)})" if f.aliases else ""
        lines.append(f"  {f.name:<11} {ending:<18} {what}; libreyolo[{f.extra}]{also}")
    return lines
