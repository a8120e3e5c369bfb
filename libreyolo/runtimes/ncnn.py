"""NCNN runtime: runs a ``<stem>_ncnn_model/`` folder (pnnx's ``model.ncnn.param``/``.bin``) on the CPU.

NCNN's tensors have no batch axis: a batch runs one image per extractor call. The net is run in
float32: NCNN's defaults (fp16/bf16 storage, packing and arithmetic where the CPU supports them)
are switched off, since the artifact was validated in float32 (see docs/export.md for what the
defaults change). Blobs are pnnx's: inputs ``in0``, ``in1``, ..., outputs ``out0``, ``out1``, ... in the
order of the metadata's ``output_names``.

A family with a query selection (DETR) is two programs (``split.json``, written by the exporter from
the family's ``SetContract.host_selection``): ``model.ncnn.*`` takes the image and returns what the
selection reads, the host runs the family's own selection (the eager model's function) on it, and
``decoder.ncnn.*`` turns the selected queries into the contract's outputs.
"""
from __future__ import annotations

import importlib
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from libreyolo.errors import ArgumentError, CheckpointError, require
from libreyolo.export.metadata import package_version, read_folder_metadata
from libreyolo.runtimes.base import ArtifactPredictor, check_artifact_file, check_graph, check_metadata
from libreyolo.utils.checks import parse_bool, resolve_device

PARAM, BIN = "model.ncnn.param", "model.ncnn.bin"
SPLIT = "split.json"
FP32_OFF = ("use_fp16_storage", "use_fp16_packed", "use_fp16_arithmetic", "use_bf16_storage")


def host_selection(contract: Any) -> Any:
    """The object ``SetContract.host_selection`` names (``"module:attribute"``): ``programs``, ``params``,
    ``select``, ``head_outputs``, ``tail_inputs`` (see :mod:`libreyolo.models.rtdetr.split`)."""
    module, _, attr = contract.query_rows().host_selection.partition(":")
    return getattr(importlib.import_module(module), attr)


def write_split(folder: Path, split: dict[str, Any]) -> None:
    (folder / SPLIT).write_text(json.dumps(split, indent=1, sort_keys=True))


def read_split(folder: Path, family: Any) -> dict[str, Any] | None:
    """The folder's ``split.json`` checked against the family's declared split, or None (one program)."""
    file = folder / SPLIT
    declared = family.export.query_rows().host_selection is not None
    if not file.is_file():
        if declared:
            raise CheckpointError(f"{folder}: {SPLIT} is missing, but family {family.name} runs in NCNN as two "
                                  "programs around its query selection; keep the folder's files together "
                                  "(re-export it)")
        return None
    if not declared:
        raise CheckpointError(f"{folder}: has {SPLIT}, but family {family.name} declares no split "
                              "(SetContract.host_selection); re-export it with this version")
    split = json.loads(file.read_text())
    ops = host_selection(family.export)
    if (split.get("head_outputs") != list(ops.head_outputs) or split.get("tail_inputs") != list(ops.tail_inputs)
            or len(split.get("programs", ())) != 2 or len(split.get("tail_shapes", ())) != len(ops.tail_inputs)):
        raise CheckpointError(f"{folder}: {SPLIT} describes programs {split.get('programs')}, decoder input "
                              f"shapes {split.get('tail_shapes')}, head outputs "
                              f"{split.get('head_outputs')} and tail inputs {split.get('tail_inputs')}; family "
                              f"{family.name} now splits as {list(ops.head_outputs)} -> {list(ops.tail_inputs)}: "
                              "re-export it with this version")
    return {**split, "select": ops.select}


def open_net(folder: Path, *, fp32: bool = True, threads: int | None = None, stem: str = "model") -> Any:
    """An ``ncnn.Net`` of the folder's ``<stem>.ncnn.param``/``.bin``; ``fp32`` switches NCNN's
    reduced-precision defaults off."""
    ncnn = require("ncnn", "ncnn", "running an NCNN model")
    net = ncnn.Net()
    if fp32:
        for option in FP32_OFF:
            setattr(net.opt, option, False)
    if threads:
        net.opt.num_threads = threads
    param, weights = folder / f"{stem}.ncnn.param", folder / f"{stem}.ncnn.bin"
    for file in (param, weights):
        if not file.is_file():
            raise CheckpointError(f"{folder}: {file.name} is missing; keep the folder's files together (re-export it)")
    if net.load_param(str(param)) != 0 or net.load_model(str(weights)) != 0:
        raise CheckpointError(f"ncnn cannot load {folder} ({param.name}/{weights.name} unreadable or inconsistent); "
                              "re-export it")
    return net


def run_net(net: Any, inputs: torch.Tensor | Sequence[torch.Tensor], n_outputs: int) -> list[torch.Tensor]:
    """Each image of the batch (axis 0 of every input, fed as ``in0``, ``in1``, ...) through ``net``;
    outputs stacked along a new batch axis."""
    ncnn = require("ncnn", "ncnn", "running an NCNN model")
    inputs = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
    arrays = [x.detach().float().cpu().contiguous().numpy() for x in inputs]
    per_output: list[list[torch.Tensor]] = [[] for _ in range(n_outputs)]
    for i in range(arrays[0].shape[0]):
        with net.create_extractor() as ex:
            for j, array in enumerate(arrays):  # clone: the Mat owns its data
                ex.input(f"in{j}", ncnn.Mat(array[i:i + 1], batch_index=0).clone())
            for k in range(n_outputs):
                status, out = ex.extract(f"out{k}")
                if status != 0:
                    raise RuntimeError(f"ncnn failed to compute output out{k} (status {status})")
                per_output[k].append(torch.from_numpy(np.array(out.numpy(batch_index=0), copy=True)))
    return [torch.cat(parts) for parts in per_output]


class NcnnProgram:
    """The artifact's program: one net, or (``split``) the head net, the host selection and the tail net."""

    def __init__(self, folder: Path, split: dict[str, Any] | None, threads: int | None) -> None:
        self.split = split
        stems = split["programs"] if split else ["model"]
        self.nets = [open_net(folder, threads=threads, stem=stem) for stem in stems]

    def __call__(self, batch: torch.Tensor, n_outputs: int) -> list[torch.Tensor]:
        if self.split is None:
            return run_net(self.nets[0], batch, n_outputs)
        names = self.split["head_outputs"]
        head = dict(zip(names, run_net(self.nets[0], batch, len(names)), strict=True))
        tail = self.split["select"](head, **self.split["params"])
        for name, shape in zip(self.split["tail_inputs"], self.split["tail_shapes"], strict=True):
            if list(tail[name].shape[1:]) != shape:  # the decoder program holds these shapes as constants
                raise RuntimeError(f"the host selection gave {name} of shape {tuple(tail[name].shape[1:])} (no batch "
                                   f"axis), but the decoder program was converted for {tuple(shape)}")
        return run_net(self.nets[1], [tail[n] for n in self.split["tail_inputs"]], n_outputs)


class NcnnPredictor(ArtifactPredictor):
    format = "ncnn"

    def __init__(self, path: Path, meta: dict[str, Any], program: NcnnProgram, version: str) -> None:
        super().__init__(path, meta)
        self.program = program
        self.net = program.nets[0]  # the image's program
        self._version = version
        self._lock = threading.Lock()  # one extraction at a time (the Batcher and serve call from threads)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def describe(self) -> str:
        split = " (two programs, query selection on the host)" if self.program.split else ""
        return f"ncnn {self._version} [CPU, fp32: fp16/bf16 storage and arithmetic off]{split}"

    def _run(self, batch: torch.Tensor) -> list[torch.Tensor]:
        with self._lock:
            return self.program(batch, len(self.output_names))


def load(path: str | Path, device: str | torch.device | None = None, *, verify: bool = True,
         threads: int | None = None) -> NcnnPredictor:
    """Open an exported NCNN folder with the ``ncnn`` package (CPU only, float32).

    With ``verify`` (the default) the param/bin files and ``metadata.json`` are checked against the
    hashes recorded at export; the metadata is checked against the shapes of one run on a zero image
    (the param file records no shapes). ``threads``: NCNN's ``num_threads`` (default: NCNN's).
    """
    verify = parse_bool("verify", verify)
    dev = resolve_device(device)
    if dev is not None and dev.type != "cpu":
        raise ArgumentError(f"NCNN models run on the CPU here; got device={str(dev)!r}")
    path = check_artifact_file(path, "NCNN", folder=True)
    meta = read_folder_metadata(path, verify=verify)
    family, *_ = check_metadata(meta, str(path))
    program = NcnnProgram(path, read_split(path, family), threads)
    size = (1, 3, meta["imgsz"], meta["imgsz"])
    try:
        outs = program(torch.zeros(size), len(meta["output_names"]))
    except RuntimeError as exc:
        raise CheckpointError(f"{path}: {exc}; the param file does not describe this model: re-export it") from None
    check_graph(meta, family, {meta["input_name"]: size},
                {n: tuple(o.shape) for n, o in zip(meta["output_names"], outs, strict=True)}, str(path))
    return NcnnPredictor(path, meta, program, package_version("ncnn") or "unknown")
