"""Triton Inference Server client: ``LibreYOLO("grpc://host:8001/<model>")`` or ``"http://host:8000/<model>"``.

The model's LibreYOLO metadata comes from the server: the ``parameters`` of the model config that
``export(format="triton")`` wrote, checked like every artifact's metadata (bounds, the
``metadata_sha256`` of the entries, and the served input/output shapes against it). ``predict()``
is the shared pipeline: the family's letterbox, one ``infer`` request per batch (split at the
config's ``max_batch_size``), and the family's postprocessing on the raw outputs (or the
embedded-NMS decoder for a model exported with ``nms=True``). The client is ``tritonclient``
(``pip install 'libreyolo[triton]'``), imported only here.

A local model folder (``<repository>/<name>`` holding ``config.pbtxt`` and ``1/model.onnx``) opens
the ``model.onnx`` it serves with ONNX Runtime; the export validates through that path.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import torch

from libreyolo.errors import ArgumentError, CheckpointError, require
from libreyolo.export.metadata import check_integrity, decode
from libreyolo.options import Opt
from libreyolo.runtimes.base import ArtifactPredictor, RuntimeUnavailableError, check_graph, check_metadata
from libreyolo.utils.checks import parse_bool, resolve_device

EXTRA = "triton"
SCHEMES = {"grpc": "grpc", "http": "http", "https": "http"}  # URL scheme -> tritonclient protocol module
URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
# seconds: the first calls (model config and metadata, the health check) and each inference call
TIMEOUT_OPTIONS = {
    "timeout": Opt(float, 5.0, "seconds to wait for the Triton server's first answers (model config and metadata) "
                   "when opening a model URL", min=0.0, min_open=True, max=3600.0, unit="seconds"),
    "infer_timeout": Opt(float, 60.0, "seconds to wait for each inference answer of a Triton server", min=0.0,
                         min_open=True, max=86400.0, unit="seconds"),
}
_FORM = "grpc://host:port/model_name (e.g. grpc://localhost:8001/yolo9t) or http://host:port/model_name"


def is_url(text: Any) -> bool:
    return isinstance(text, str) and bool(URL.match(text))


@dataclass(frozen=True)
class TritonAddress:
    scheme: str
    host: str
    port: int
    model: str

    @property
    def server(self) -> str:
        return f"{self.host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.server}/{self.model}"


def parse_url(url: str) -> TritonAddress:
    """A Triton model URL, or an :class:`ArgumentError` saying what is wrong with it."""
    scheme = url.split("://", 1)[0].lower()
    if scheme not in SCHEMES:
        raise ArgumentError(f"model {url!r:.100}: a URL names a model on a Triton Inference Server ({_FORM}); "
                            f"{scheme}:// is not one. LibreYOLO does not download model files from URLs: download "
                            "it and pass its path, or a Hub name such as LibreYOLO9t.pt")
    bad = f"model {url!r:.100} is not a Triton model URL: expected {_FORM}"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ArgumentError(f"{bad}; its port is not a number from 1 to 65535") from None
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ArgumentError(f"{bad}; it holds a user, query or fragment (for credentials or TLS options pass "
                            "client=<a tritonclient InferenceServerClient>)")
    if not parts.hostname:
        raise ArgumentError(f"{bad}; it names no host")
    if not port:
        raise ArgumentError(f"{bad}; it names no port (Triton listens on 8001 for gRPC and 8000 for HTTP): a URL "
                            "without host:port/name is not taken for a Triton model, and other URLs are not fetched")
    segments = [s for s in parts.path.split("/") if s]
    if len(segments) != 1 or not _NAME.match(segments[0]):
        what = "no model name" if not segments else f"the path {parts.path!r:.60}, not one model name"
        raise ArgumentError(f"{bad}; it has {what}")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return TritonAddress(scheme, host, port, segments[0])


def _dtype(triton: str) -> str:
    return {"FP32": "float32", "FP16": "float16"}.get(triton, triton)


class TritonPredictor(ArtifactPredictor):
    """A model served by Triton with the eager model's ``predict()``."""

    format = "triton"

    def __init__(self, address: TritonAddress, meta: dict[str, Any], client: Any, protocol: Any,
                 config: dict[str, Any], *, headers: dict[str, str] | None = None,
                 call_timeout: dict[str, float] | None = None) -> None:
        super().__init__(Path(address.model), meta)
        self.address, self.client, self.config = address, client, config
        self._protocol, self._headers = protocol, headers
        self._call_timeout = call_timeout or {}  # grpc: client_timeout per call (http: set on the client)
        self.max_batch = int(config.get("max_batch_size", 0))
        # outputs whose served dims differ from the model's ((batch,) is served as (batch, 1))
        self._reshape = {o["name"]: [int(d) for d in o["reshape"].get("shape", [])]
                         for o in config.get("output", []) if "reshape" in o}
        self._datatype = "FP16" if self.dtype == torch.float16 else "FP32"

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")  # where the client letterboxes and decodes; the server picks its own

    def describe(self) -> str:
        return f"Triton {self.address} (max_batch_size {self.max_batch})"

    def _run(self, batch: torch.Tensor) -> list[torch.Tensor]:
        step = self.max_batch if self.max_batch > 0 else int(batch.shape[0])
        parts = [self._request(batch[i:i + step]) for i in range(0, int(batch.shape[0]), step)]
        return [torch.cat([p[k] for p in parts]) for k in range(len(self.output_names))]

    def _request(self, batch: torch.Tensor) -> list[torch.Tensor]:
        data = np.ascontiguousarray(batch.cpu().numpy())
        request = self._protocol.InferInput(self.input_name, list(data.shape), self._datatype)
        request.set_data_from_numpy(data)
        wanted = [self._protocol.InferRequestedOutput(name) for name in self.output_names]
        try:
            result = self.client.infer(self.address.model, [request], outputs=wanted, headers=self._headers,
                                       **self._call_timeout)
        except Exception as exc:  # tritonclient's InferenceServerException, connection errors
            if _timed_out(exc):
                raise RuntimeUnavailableError(f"Triton inference on {self.address} got no answer in time "
                                              f"(infer_timeout); the server is overloaded or stuck: pass a larger "
                                              "infer_timeout= or check the server") from None
            raise RuntimeUnavailableError(f"Triton inference on {self.address} failed: {exc}") from exc
        outs = []
        for name in self.output_names:
            value = result.as_numpy(name)
            if value is None:
                raise RuntimeUnavailableError(f"Triton {self.address} returned no output {name!r}; the model it "
                                              f"serves is not the one its config describes")
            if name in self._reshape:
                value = value.reshape(value.shape[0], *self._reshape[name])
            outs.append(torch.from_numpy(np.array(value, copy=True)))
        return outs

    def info(self) -> dict[str, Any]:
        return {**super().info(), "path": str(self.address), "max_batch_size": self.max_batch}


def _timed_out(exc: BaseException) -> bool:
    text = f"{type(exc).__name__} {exc}".lower()
    return "timeout" in text or "timed out" in text or "deadline" in text


def _call(what: str, address: TritonAddress, fn: Any, *args: Any, timeout: float | None = None, **kw: Any) -> Any:
    try:
        return fn(*args, **kw)
    except Exception as exc:  # the server's error (model not found, not ready) or no connection
        if _timed_out(exc):
            raise RuntimeUnavailableError(
                f"no answer from {address.server} within {timeout:g} s when reading the {what} of "
                f"{address.model!r}: something accepts connections on that port but does not answer as a Triton "
                f"{address.scheme} server; check the port and protocol (gRPC 8001, HTTP 8000), or pass a larger "
                "timeout=") from None
        raise RuntimeUnavailableError(
            f"cannot read the {what} of {address} from Triton: {exc}. Is the server running with the model loaded "
            f"(tritonserver --model-repository=<folder holding {address.model}/>), on that port and protocol?"
        ) from exc


def _shapes(tensors: list[dict[str, Any]], reshape: dict[str, list[int]]) -> dict[str, tuple]:
    """{name: model-side shape} of the served tensors (None: a dynamic axis)."""
    out = {}
    for t in tensors:
        shape = [None if int(d) < 0 else int(d) for d in t.get("shape", [])]
        if t["name"] in reshape and shape:
            shape = [shape[0], *reshape[t["name"]]]
        out[t["name"]] = tuple(shape)
    return out


def open_server(url: str, *, verify: bool = True, client: Any = None, headers: dict[str, str] | None = None,
                timeout: float | None = None, infer_timeout: float | None = None) -> TritonPredictor:
    """Open a model on a Triton server; ``client`` replaces the client made from the URL (TLS, auth).
    ``timeout`` bounds the wait for the first answers (the model config and metadata: a port that
    accepts and never answers fails in seconds), ``infer_timeout`` each inference call
    (:data:`TIMEOUT_OPTIONS`; on HTTP, a ``client=`` of your own keeps its own timeouts)."""
    timeout = TIMEOUT_OPTIONS["timeout"].check("timeout", 5.0 if timeout is None else timeout)
    infer_timeout = TIMEOUT_OPTIONS["infer_timeout"].check("infer_timeout",
                                                           60.0 if infer_timeout is None else infer_timeout)
    address = parse_url(url)
    protocol = require(f"tritonclient.{SCHEMES[address.scheme]}", EXTRA, "a Triton model URL")
    grpc = address.scheme == "grpc"
    ssl = {"ssl": True} if address.scheme == "https" else {}
    probe = client
    if client is None:
        if grpc:
            client = probe = protocol.InferenceServerClient(url=address.server, **ssl)
        else:  # the HTTP client's timeouts are set per client: a short one for the first answers
            probe = protocol.InferenceServerClient(url=address.server, connection_timeout=timeout,
                                                   network_timeout=timeout, **ssl)
            client = protocol.InferenceServerClient(url=address.server, connection_timeout=timeout,
                                                    network_timeout=infer_timeout, **ssl)
    as_json = {"as_json": True, "client_timeout": timeout} if grpc else {}  # grpc replies are protobufs otherwise
    config = _call("model config", address, probe.get_model_config, address.model, headers=headers,
                   timeout=timeout, **as_json)
    config = config.get("config", config)  # grpc wraps the config in its response
    served = _call("model metadata", address, probe.get_model_metadata, address.model, headers=headers,
                   timeout=timeout, **as_json)
    where = f"Triton model {address}"
    encoded = {k: v.get("string_value", "") for k, v in (config.get("parameters") or {}).items()
               if isinstance(v, dict)}
    if verify:  # the served bytes cannot be hashed from here: the entries are checked against metadata_sha256
        check_integrity(encoded, encoded.get("content_sha256", ""), where)
    meta = decode(encoded, where)
    family, *_ = check_metadata(meta, where)
    reshape = {o["name"]: [int(d) for d in o["reshape"].get("shape", [])]
               for o in config.get("output", []) if "reshape" in o}
    inputs, outputs = served.get("inputs", []), served.get("outputs", [])
    check_graph(meta, family, _shapes(inputs, {}), _shapes(outputs, reshape), where)
    for t in inputs:
        if t["name"] == meta["input_name"] and _dtype(t.get("datatype", "")) != meta["input_dtype"]:
            raise CheckpointError(f"{where}: 'input_dtype' is {meta['input_dtype']!r} but the server's input "
                                  f"{t['name']!r} is {t.get('datatype')}; the config parameters do not describe the "
                                  "served model: re-export it")
    if probe is not client:
        probe.close()
    return TritonPredictor(address, meta, client, protocol, config, headers=headers,
                           call_timeout={"client_timeout": infer_timeout} if grpc else None)


def load(path: str | Path, device: str | torch.device | None = None, *, verify: bool = True, client: Any = None,
         headers: dict[str, str] | None = None, timeout: float | None = None, infer_timeout: float | None = None,
         **kw: Any) -> Any:
    """A Triton model URL (:func:`open_server`) or a local Triton model folder (its ``1/model.onnx``
    through ONNX Runtime)."""
    if kw:
        raise TypeError(f"unexpected arguments for a Triton model: {sorted(kw)}")
    verify = parse_bool("verify", verify)
    dev = resolve_device(device)
    if isinstance(path, str) and is_url(path):
        if dev is not None and dev.type != "cpu":
            raise ArgumentError(f"device={str(dev)!r}: a Triton model runs where its server puts it (config "
                                "instance_group); the client letterboxes and decodes on the CPU, so pass no device")
        return open_server(str(path), verify=verify, client=client, headers=headers, timeout=timeout,
                           infer_timeout=infer_timeout)
    if client is not None or headers is not None or timeout is not None or infer_timeout is not None:
        raise TypeError("client=, headers=, timeout= and infer_timeout= apply to Triton model URLs, not to a local "
                        "model folder")
    from libreyolo.export.triton import CONFIG, model_file
    from libreyolo.runtimes import onnx as onnx_runtime

    folder = Path(path)
    if not (folder / CONFIG).is_file() or not model_file(folder).is_file():
        raise CheckpointError(f"{folder} is not a Triton model folder: expected {CONFIG} and 1/model.onnx in it "
                              "(written by `libreyolo export format=triton`)")
    return onnx_runtime.load(model_file(folder), device=dev, verify=verify)


def is_model_folder(path: Path) -> bool:
    from libreyolo.export.triton import CONFIG, model_file

    return path.is_dir() and (path / CONFIG).is_file() and model_file(path).is_file()
