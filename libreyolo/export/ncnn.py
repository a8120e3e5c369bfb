"""NCNN export: a TorchScript trace -> ``pnnx`` -> ``<stem>_ncnn_model/`` (``model.ncnn.param`` +
``model.ncnn.bin``, fp32 weights) with ``metadata.json`` bound to the two files by their sha256.

pnnx reads the TorchScript trace of the same :class:`~libreyolo.export.module.ExportModule` the ONNX
exporter traces (fused kernels decline while tracing, so the portable paths are what it sees), and
writes NCNN's graph directly. Validated with the ``ncnn`` Python package on the CPU, with every
fp16/bf16 option switched off (:mod:`libreyolo.runtimes.ncnn`).
"""
from __future__ import annotations

import re
import subprocess
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from libreyolo.errors import ArgumentError, require
from libreyolo.export.base import Exporter, ExportError, ExportOptions
from libreyolo.export.formats import get_format
from libreyolo.export.metadata import folder_content_sha256, write_folder_metadata
from libreyolo.runtimes.ncnn import host_selection, write_split

EXTRA = get_format("ncnn").extra
MODEL_STEM, TAIL_STEM = "model", "decoder"  # model.ncnn.*: the image's program; decoder.ncnn.*: a split's tail
PARAM, BIN = f"{MODEL_STEM}.ncnn.param", f"{MODEL_STEM}.ncnn.bin"
PNNX_TIMEOUT_S = 900


def param_layers(path: str | Path) -> list[tuple[str, str, list[str], list[str], str]]:
    """The layers of an NCNN ``.param`` file: (type, name, input blobs, output blobs, parameters)."""
    lines = Path(path).read_text().split("\n")
    if not lines or lines[0].strip() != "7767517":
        raise ValueError(f"{path} is not an NCNN param file (magic {lines[0][:20]!r})")
    layers = []
    for line in lines[2:]:
        parts = line.split()
        if len(parts) < 4:
            continue
        kind, name, n_in, n_out = parts[0], parts[1], int(parts[2]), int(parts[3])
        ins, outs = parts[4:4 + n_in], parts[4 + n_in:4 + n_in + n_out]
        layers.append((kind, name, ins, outs, " ".join(parts[4 + n_in + n_out:])))
    return layers


def unknown_layers(path: str | Path) -> dict[str, int]:
    """Layer types of a ``.param`` file that this ncnn build has no layer for (pnnx writes an operator it
    cannot map under its torch name, e.g. ``torch.topk``), with their counts; empty when every layer loads."""
    import ncnn

    counts: dict[str, int] = {}
    for kind, *_ in param_layers(path):
        if ncnn.layer_to_index(kind) < 0:
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def run_pnnx(traced: Path, examples: Sequence[torch.Tensor], param: Path, weights: Path, work: Path) -> None:
    """Convert a saved TorchScript module with pnnx's executable into ``param``/``weights``."""
    pnnx = require("pnnx", EXTRA, "NCNN export")
    traced, param, weights, work = traced.resolve(), param.resolve(), weights.resolve(), work.resolve()
    shape = ",".join("[" + ",".join(str(int(s)) for s in x.shape) + "]f32" for x in examples)
    args = [pnnx.EXEC_PATH, str(traced), f"inputshape={shape}", "fp16=0", "device=cpu",
            f"ncnnparam={param}", f"ncnnbin={weights}", f"ncnnpy={work / 'model_ncnn.py'}",
            f"pnnxparam={work / 'model.pnnx.param'}", f"pnnxbin={work / 'model.pnnx.bin'}",
            f"pnnxpy={work / 'model_pnnx.py'}", f"pnnxonnx={work / 'model.pnnx.onnx'}"]
    try:
        done = subprocess.run(args, cwd=work, capture_output=True, text=True, timeout=PNNX_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ExportError(f"pnnx did not finish within {PNNX_TIMEOUT_S} s") from None
    log = (done.stdout + done.stderr).strip().splitlines()
    if done.returncode != 0 or not param.is_file() or not weights.is_file():
        tail = "\n".join(log[-12:])
        raise ExportError(f"pnnx failed to convert the model (exit {done.returncode}):\n{tail}")
    problems = list(dict.fromkeys(line.strip() for line in log
                                  if "not supported" in line or "not exists or registered" in line))
    if problems:
        raise ExportError(f"pnnx could not map every operator to NCNN: {'; '.join(problems[:4])}")


def convert(module: torch.nn.Module, examples: tuple[torch.Tensor, ...], folder: Path, stem: str,
            n_outputs: int, work: Path) -> None:
    """Trace ``module`` on ``examples`` and write ``<stem>.ncnn.param``/``.bin`` into ``folder``; checks that
    ncnn has a layer for every operator and that the program has outputs ``out0`` ... ``out<n_outputs - 1>``."""
    work.mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            traced = torch.jit.trace(module, examples, strict=False, check_trace=False)
        except Exception as exc:
            raise ExportError(f"NCNN export: tracing failed: {type(exc).__name__}: {exc}") from exc
    saved = work / "model.pt"
    traced.save(str(saved))
    param, weights = folder / f"{stem}.ncnn.param", folder / f"{stem}.ncnn.bin"
    run_pnnx(saved, examples, param, weights, work)
    missing = unknown_layers(param)
    if missing:
        ops = ", ".join(f"{kind} x{n}" for kind, n in sorted(missing.items()))
        raise ExportError(f"NCNN has no layer for operators of this network ({ops}): pnnx left them "
                          "unconverted and ncnn cannot load the model; export another format (onnx, openvino)")
    outputs = sorted(o for layer in param_layers(param) for o in layer[3] if re.fullmatch(r"out\d+", o))
    expected = sorted(f"out{i}" for i in range(n_outputs))
    if outputs != expected:
        raise ExportError(f"pnnx wrote outputs {outputs} for {param.name}, expected {expected}")


class _NamedOutputs(torch.nn.Module):
    """A program that returns the network's outputs dict as the contract's tuple (the split's tail)."""

    def __init__(self, program: torch.nn.Module, family: Any) -> None:
        super().__init__()
        self.program, self.family = program, family

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.family.export_outputs(self.program(*inputs)))


def build_split(module: Any, example: torch.Tensor, path: Path, work: Path) -> None:
    """Two programs cut at the family's query selection (``SetContract.host_selection``): ``model.ncnn.*``
    (image -> the selection's inputs) and ``decoder.ncnn.*`` (the selected queries -> the contract's
    outputs); ``split.json`` records their blobs and the selection's parameters for the runtime."""
    split = host_selection(module.contract)
    head, tail = split.programs(module.net, example)
    params = split.params(module.net)
    with torch.no_grad():
        head_out = dict(zip(split.head_outputs, head(example), strict=True))
        tail_in = split.select(head_out, **params)
    convert(head, (example,), path, MODEL_STEM, len(split.head_outputs), work / "head")
    convert(_NamedOutputs(tail, module.family), tuple(tail_in[n].contiguous() for n in split.tail_inputs), path,
            TAIL_STEM, len(module.output_names()), work / "tail")
    write_split(path, {"programs": [MODEL_STEM, TAIL_STEM], "head_outputs": list(split.head_outputs),
                       "tail_inputs": list(split.tail_inputs), "params": params,
                       # pnnx fixes the decoder's shapes (e.g. the query count) at these: checked by the runtime
                       "tail_shapes": [list(tail_in[n].shape[1:]) for n in split.tail_inputs]})


class NcnnExporter(Exporter, format="ncnn"):
    toolchain = ("pnnx", "ncnn")

    def check(self, opts: ExportOptions) -> None:
        require("pnnx", EXTRA, "NCNN export")
        require("ncnn", EXTRA, "NCNN export")
        if opts.device.type != "cpu":
            raise ArgumentError(f"NCNN models are exported on the CPU (pnnx reads a CPU trace); "
                                f"got device={opts.device}")
        if opts.batch != 1:
            raise ArgumentError(f"NCNN runs one image per call (its tensors have no batch axis); "
                                f"got batch={opts.batch}: export with batch=1 (predict() and val() run batches "
                                "one image at a time)")

    def build(self, module: torch.nn.Module, example: torch.Tensor, path: Path, opts: ExportOptions,
              work: Path) -> None:
        module.float().eval()
        path.mkdir()
        if module.contract.query_rows().host_selection is not None:
            build_split(module, example, path, work)
        else:
            convert(module, (example,), path, MODEL_STEM, len(module.output_names()), work / "model")

    def write_metadata(self, path: Path, encoded: dict[str, str], meta: dict[str, Any]) -> None:
        write_folder_metadata(path, encoded, meta)

    def content_sha256(self, path: Path) -> str:
        return folder_content_sha256(path)

    def not_validated_reason(self, opts: ExportOptions) -> str | None:
        try:
            import ncnn  # noqa: F401
        except ImportError:
            return "the ncnn Python package is not importable here (pip install 'libreyolo[ncnn]')"
        return None

    def report_notes(self, final: Path, opts: ExportOptions) -> list[str]:
        return ["run by ncnn with fp16/bf16 storage, packing and arithmetic off (fp32), as LibreYOLO's runtime "
                "runs it; an app must set the same Net options (see docs/export.md)"]

    def graph_ops(self, path: Path) -> set[str]:
        return {layer[0] for param in sorted(path.glob("*.ncnn.param")) for layer in param_layers(param)}


EXPORTER = NcnnExporter()
