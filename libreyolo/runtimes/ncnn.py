"""NCNN runtime: runs a ``<stem>_ncnn_model/`` folder (pnnx's ``model.ncnn.param``/``.bin``) on the CPU.

NCNN's tensors have no batch axis: a batch runs one image per extractor call. The net is run in
float32: NCNN's defaults (fp16/bf16 storage, packing and arithmetic where the CPU supports them)
are switched off, since the artifact was validated in float32 (see docs/export.md for what the
defaults change). Blobs are pnnx's: input ``in0``, outputs ``out0``, ``out1``, ... in the order of
the metadata's ``output_names``.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

from libreyolo.errors import ArgumentError, CheckpointError, require
from libreyolo.export.metadata import package_version, read_folder_metadata
from libreyolo.runtimes.base import ArtifactPredictor, check_artifact_file, check_graph, check_metadata
from libreyolo.utils.checks import parse_bool, resolve_device

PARAM, BIN = "model.ncnn.param", "model.ncnn.bin"
FP32_OFF = ("use_fp16_storage", "use_fp16_packed", "use_fp16_arithmetic", "use_bf16_storage")


def open_net(folder: Path, *, fp32: bool = True, threads: int | None = None) -> Any:
    """An ``ncnn.Net`` of the folder's files; ``fp32`` switches NCNN's reduced-precision defaults off."""
    ncnn = require("ncnn", "ncnn", "running an NCNN model")
    net = ncnn.Net()
    if fp32:
        for option in FP32_OFF:
            setattr(net.opt, option, False)
    if threads:
        net.opt.num_threads = threads
    if net.load_param(str(folder / PARAM)) != 0 or net.load_model(str(folder / BIN)) != 0:
        raise CheckpointError(f"ncnn cannot load {folder} ({PARAM}/{BIN} unreadable or inconsistent); re-export it")
    return net


def run_net(net: Any, batch: torch.Tensor, n_outputs: int) -> list[torch.Tensor]:
    """Each image of ``batch`` through ``net``; outputs stacked along a new batch axis."""
    ncnn = require("ncnn", "ncnn", "running an NCNN model")
    per_output: list[list[torch.Tensor]] = [[] for _ in range(n_outputs)]
    array = batch.detach().float().cpu().contiguous().numpy()
    for i in range(array.shape[0]):
        with net.create_extractor() as ex:
            ex.input("in0", ncnn.Mat(array[i:i + 1], batch_index=0).clone())  # clone: the Mat owns its data
            for k in range(n_outputs):
                status, out = ex.extract(f"out{k}")
                if status != 0:
                    raise RuntimeError(f"ncnn failed to compute output out{k} (status {status})")
                per_output[k].append(torch.from_numpy(np.array(out.numpy(batch_index=0), copy=True)))
    return [torch.cat(parts) for parts in per_output]


class NcnnPredictor(ArtifactPredictor):
    format = "ncnn"

    def __init__(self, path: Path, meta: dict[str, Any], net: Any, version: str) -> None:
        super().__init__(path, meta)
        self.net = net
        self._version = version
        self._lock = threading.Lock()  # one extraction at a time (the Batcher and serve call from threads)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def describe(self) -> str:
        return f"ncnn {self._version} [CPU, fp32: fp16/bf16 storage and arithmetic off]"

    def _run(self, batch: torch.Tensor) -> list[torch.Tensor]:
        with self._lock:
            return run_net(self.net, batch, len(self.output_names))


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
    for name in (PARAM, BIN):
        if not (path / name).is_file():
            raise CheckpointError(f"{path}: {name} is missing; keep the folder's files together (re-export it)")
    net = open_net(path, threads=threads)
    size = (1, 3, meta["imgsz"], meta["imgsz"])
    try:
        outs = run_net(net, torch.zeros(size), len(meta["output_names"]))
    except RuntimeError as exc:
        raise CheckpointError(f"{path}: {exc}; the param file does not describe this model: re-export it") from None
    check_graph(meta, family, {meta["input_name"]: size},
                {n: tuple(o.shape) for n, o in zip(meta["output_names"], outs, strict=True)}, str(path))
    return NcnnPredictor(path, meta, net, package_version("ncnn") or "unknown")
