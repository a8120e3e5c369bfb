"""OpenVINO runtime: runs an exported IR folder (``x_openvino_model/``) on the CPU.

The folder's files are read once, hashed (``verify``) and handed to OpenVINO from memory, so
what runs is what was checked. The model is compiled with the configuration recorded in its
metadata (``runtime_config``: the inference precision it was validated at, f32), never with the
CPU plugin's default, which is bf16 on CPUs with AVX512-BF16 or AMX and moves boxes by pixels;
the compiled model's precision is read back and must be the recorded one.
"""
from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

from libreyolo.errors import ArgumentError, CheckpointError, require
from libreyolo.export.metadata import FOLDER_METADATA, folder_content_sha256, package_version, read_folder_metadata
from libreyolo.runtimes.base import ArtifactPredictor, check_artifact_file, check_graph, check_metadata
from libreyolo.utils.checks import parse_bool, resolve_device

EXTRA = "openvino"
XML, BIN, METADATA = "model.xml", "model.bin", FOLDER_METADATA  # an IR folder as exported

# the compile settings an artifact's metadata may record, and the values each may take
CONFIG_VALUES = {"INFERENCE_PRECISION_HINT": ("f32",)}
_OV_TYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def precision_name(value: Any) -> str:
    """OpenVINO's element type (``<Type: 'float32'>``) as the short name configs use (``f32``)."""
    text = str(getattr(value, "get_type_name", lambda: value)()).lower()
    for short, long in _OV_TYPES.items():
        if text in (short, long) or long in text:
            return short
    return text


class OpenVINOPredictor(ArtifactPredictor):
    format = "openvino"

    def __init__(self, path: Path, meta: dict[str, Any], ov: Any, model: Any, config: dict[str, str]) -> None:
        super().__init__(path, meta)
        self._ov = ov
        self._model = model
        self.config = dict(config)
        self._compile()

    def _compile(self) -> None:
        try:
            self.compiled = self._ov.Core().compile_model(self._model, "CPU", self.config)
        except Exception as exc:
            raise CheckpointError(f"OpenVINO cannot compile {self.path} with {self.config or 'its defaults'}: "
                                  f"{type(exc).__name__}: {exc}") from None
        self.precision = precision_name(self.compiled.get_property("INFERENCE_PRECISION_HINT"))
        wanted = self.config.get("INFERENCE_PRECISION_HINT")
        if wanted is not None and self.precision != wanted:
            raise CheckpointError(f"{self.path}: OpenVINO compiled it at inference precision {self.precision}, but it "
                                  f"was validated at {wanted} (its runtime_config); its outputs would not be the "
                                  "validated ones")
        self._request = self.compiled.create_infer_request()
        self._outputs = [self.compiled.output(name) for name in self.output_names]
        self._lock = threading.Lock()  # one infer request: calls from several threads take turns

    def with_config(self, config: dict[str, str]) -> OpenVINOPredictor:
        """A copy compiled with another configuration (``{}``: the CPU plugin's defaults), for measuring
        what a setting changes; the copy is not the validated artifact."""
        twin = copy.copy(self)
        twin.config = dict(config)
        twin._compile()
        return twin

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def describe(self) -> str:
        return f"openvino {package_version('openvino') or self._ov.__version__} [CPU, {self.precision} inference]"

    def _run(self, batch: torch.Tensor) -> list[torch.Tensor]:
        with self._lock:
            self._request.infer({self.input_name: batch.detach().cpu().numpy()})
            return [torch.from_numpy(np.array(self._request.get_tensor(o).data, copy=True)) for o in self._outputs]


def _shape(partial: Any) -> tuple:
    return tuple(d.get_length() if d.is_static else None for d in partial)


def _config(meta: dict[str, Any], where: str) -> dict[str, str]:
    config = meta.get("runtime_config")
    if not isinstance(config, dict) or not config:
        raise CheckpointError(f"{where}: its metadata records no runtime_config (the OpenVINO settings it was "
                              "validated with, e.g. the inference precision), so it cannot be run as validated: "
                              "re-export it")
    for key, value in config.items():
        if key not in CONFIG_VALUES or value not in CONFIG_VALUES[key]:
            raise CheckpointError(f"{where}: runtime_config {key}={value!r} is not a setting this LibreYOLO runs "
                                  f"OpenVINO models with ({CONFIG_VALUES}); the metadata was edited: re-export it")
    return {str(k): str(v) for k, v in config.items()}


def load(path: str | Path, device: str | torch.device | None = None, *, verify: bool = True,
         **kw: Any) -> OpenVINOPredictor:
    """Open an exported OpenVINO IR folder (CPU).

    With ``verify`` (the default) the folder's files and its metadata are checked against the hashes
    recorded at export; the metadata is checked against the IR's input and output shapes.
    """
    if kw:
        raise TypeError(f"unexpected arguments for an OpenVINO model: {sorted(kw)}")
    verify = parse_bool("verify", verify)
    dev = resolve_device(device)
    if dev is not None and dev.type != "cpu":
        raise ArgumentError(f"OpenVINO models run on the CPU here; got device={str(dev)!r}")
    ov = require("openvino", EXTRA, "running an OpenVINO model")
    path = check_artifact_file(path, "OpenVINO", folder=True)
    for name in (XML, BIN):
        if not (path / name).is_file():
            raise CheckpointError(f"{path} holds no {name}: an OpenVINO model folder exported by LibreYOLO holds "
                                  f"{XML}, {BIN} and {METADATA}; re-export it")
    xml, weights = (path / XML).read_bytes(), (path / BIN).read_bytes()  # hashed as read, then handed to OpenVINO
    content = folder_content_sha256(path, data={XML: xml, BIN: weights}) if verify else ""
    meta = read_folder_metadata(path, content=content, verify=verify)
    family, *_ = check_metadata(meta, str(path))
    config = _config(meta, str(path))
    try:
        model = ov.Core().read_model(xml, ov.Tensor(np.frombuffer(weights, dtype=np.uint8)))
    except Exception as exc:
        raise CheckpointError(f"{path} is not a readable OpenVINO model ({type(exc).__name__}: {exc})") from None
    inputs = {p.get_any_name(): _shape(p.get_partial_shape()) for p in model.inputs}
    outputs = {}
    for port in model.outputs:  # a port may carry several tensor names: the one the metadata names
        names = port.get_names()
        name = next((n for n in meta["output_names"] if n in names), port.get_any_name())
        outputs[name] = _shape(port.get_partial_shape())
    check_graph(meta, family, inputs, outputs, str(path))
    return OpenVINOPredictor(path, meta, ov, model, config)
