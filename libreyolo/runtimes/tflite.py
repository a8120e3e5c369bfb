"""LiteRT (TFLite) runtime: runs a ``.tflite`` with the LiteRT interpreter (``ai_edge_litert``) on the CPU.

Metadata comes from the ``.tflite.json`` sidecar, checked against the model's sha256. The model's
input is NCHW like the eager network's; a model whose input is NHWC (channels last, as converters
for mobile often write it) is fed through :func:`to_model_layout`, the one place that transposes.
A statically quantized model (``int8=True``) takes an int8 input: :func:`to_model_dtype` quantizes
the float batch with the input tensor's own scale and zero point (integer outputs are dequantized
by :func:`from_model_dtype`), so callers always hand over and get back float32.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

from libreyolo.errors import ArgumentError, CheckpointError, require
from libreyolo.export.metadata import package_version, read_sidecar
from libreyolo.runtimes.base import ArtifactPredictor, check_artifact_file, check_graph, check_metadata
from libreyolo.utils.checks import parse_bool, resolve_device


def channels_last(shape: tuple) -> bool:
    """Whether a 4-D image input is NHWC (3 channels last, not first)."""
    return len(shape) == 4 and shape[-1] == 3 and shape[1] != 3


def to_model_layout(batch: np.ndarray, nhwc: bool) -> np.ndarray:
    """An NCHW batch in the model's input layout."""
    return np.ascontiguousarray(batch.transpose(0, 2, 3, 1)) if nhwc else np.ascontiguousarray(batch)


def to_model_dtype(batch: np.ndarray, detail: dict[str, Any]) -> np.ndarray:
    """A float batch as the model's input tensor: a statically quantized model (``int8=True``) takes
    integers, quantized with the tensor's own scale and zero point (rounding half away from zero,
    as LiteRT's QUANTIZE does)."""
    dtype = np.dtype(detail["dtype"])
    if dtype.kind == "f":
        return batch.astype(dtype, copy=False)
    scale, zero = detail["quantization"]
    info = np.iinfo(dtype)
    v = batch.astype(np.float64) / scale
    return np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5) + zero, info.min, info.max).astype(dtype)


def from_model_dtype(array: np.ndarray, detail: dict[str, Any]) -> np.ndarray:
    """A model output as float32 (an integer output dequantized with its scale and zero point)."""
    if np.dtype(detail["dtype"]).kind == "f":
        return np.array(array, copy=True)
    scale, zero = detail["quantization"]
    return ((array.astype(np.float32) - zero) * np.float32(scale)).astype(np.float32)


def _check_quantized(detail: dict[str, Any], what: str, path: Path) -> None:
    if np.dtype(detail["dtype"]).kind != "f" and not detail["quantization"][0]:
        raise CheckpointError(f"{path}: its {what} {detail.get('name')!r} is {np.dtype(detail['dtype'])} without a "
                              "quantization scale, so float values cannot be mapped onto it; re-export it")


class TflitePredictor(ArtifactPredictor):
    format = "tflite"

    def __init__(self, path: Path, meta: dict[str, Any], interpreter: Any, input_detail: dict[str, Any],
                 output_details: list[dict[str, Any]], nhwc: bool, version: str) -> None:
        super().__init__(path, meta)
        self.interpreter = interpreter
        self._input = input_detail
        self._outputs = output_details
        self._nhwc = nhwc
        self._version = version
        self._lock = threading.Lock()  # the interpreter is not thread-safe (the Batcher and serve use threads)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def describe(self) -> str:
        return f"ai-edge-litert {self._version} [LiteRT interpreter, CPU]"

    def _run(self, batch: torch.Tensor) -> list[torch.Tensor]:
        array = to_model_dtype(to_model_layout(batch.detach().float().cpu().numpy(), self._nhwc), self._input)
        with self._lock:
            self.interpreter.set_tensor(self._input["index"], array)
            self.interpreter.invoke()
            return [torch.from_numpy(from_model_dtype(self.interpreter.get_tensor(d["index"]), d))
                    for d in self._outputs]


def _output_order(it: Any, n: int) -> list[dict]:
    """The output tensors in the order the network returns them: the model's one signature names them
    ``output_0``, ``output_1``, ... (tensor indices do not follow that order: RT-DETR's two outputs
    come out swapped)."""
    sigs = it.get_signature_list()
    if len(sigs) != 1:
        raise ValueError(f"expected one signature, found {len(sigs)} ({', '.join(sigs)})")
    details = it.get_signature_runner(next(iter(sigs))).get_output_details()

    def position(name: str) -> int:
        tail = name.rsplit("_", 1)[-1]
        if not tail.isdigit():
            raise ValueError(f"signature output {name!r} is not named output_<k>")
        return int(tail)
    return [details[k] for k in sorted(details, key=position)][:n]


def load(path: str | Path, device: str | torch.device | None = None, *, verify: bool = True,
         threads: int | None = None) -> TflitePredictor:
    """Open an exported ``.tflite`` with the LiteRT interpreter (CPU only).

    With ``verify`` (the default) the model and its sidecar metadata are checked against the hashes
    recorded at export; the metadata is checked against the model's tensor shapes. ``threads``: the
    interpreter's ``num_threads`` (default: its own).
    """
    verify = parse_bool("verify", verify)
    dev = resolve_device(device)
    if dev is not None and dev.type != "cpu":
        raise ArgumentError(f"TFLite models run on the CPU here; got device={str(dev)!r}")
    path = check_artifact_file(path, "TFLite")
    meta = read_sidecar(path, verify=verify)
    family, *_ = check_metadata(meta, str(path))
    interp = require("ai_edge_litert.interpreter", "tflite", "running a TFLite model")
    try:
        it = interp.Interpreter(model_path=str(path), num_threads=threads)
        it.allocate_tensors()
        inputs, outputs = it.get_input_details(), it.get_output_details()
        ordered = _output_order(it, len(outputs))
    except Exception as exc:
        raise CheckpointError(f"the LiteRT interpreter cannot load {path}: {exc}") from None
    names = meta["output_names"]
    if len(inputs) != 1 or len(outputs) != len(names):
        raise CheckpointError(f"{path}: the model takes {len(inputs)} input(s) and returns {len(outputs)} output(s), "
                              f"but its metadata names 1 input and {len(names)} outputs; re-export it")
    shape = tuple(int(s) for s in inputs[0]["shape"])
    nhwc = channels_last(shape)
    nchw = (shape[0], shape[3], shape[1], shape[2]) if nhwc else shape
    check_graph(meta, family, {meta["input_name"]: nchw},
                {n: tuple(int(s) for s in d["shape"]) for n, d in zip(names, ordered, strict=True)}, str(path))
    for what, detail in (("input", inputs[0]), *(("output", d) for d in ordered)):
        _check_quantized(detail, what, path)
    version = package_version("ai-edge-litert") or "unknown"
    return TflitePredictor(path, meta, it, inputs[0], list(ordered), nhwc, version)
