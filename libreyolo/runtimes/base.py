"""What every artifact runtime shares: metadata checks, static-shape handling, the family view.

A runtime subclass implements ``_run`` (one batch through the runtime, exactly the artifact's
input shape) and ``describe``; ``predict()`` is the eager pipeline from
:class:`~libreyolo.engine.predictor.Predictor`, with the family's own letterbox and
postprocessing. An artifact with embedded NMS is decoded by the decoder its family's export
contract names, never by a per-family branch here.
"""
from __future__ import annotations

import contextlib
import importlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch

from libreyolo.engine.calls import CallState
from libreyolo.engine.plan import RUNTIME
from libreyolo.engine.predictor import Predictor
from libreyolo.errors import ArgumentError, CheckpointError, LibreYOLOError
from libreyolo.models.base import Family
from libreyolo.models.registry import get_family


class RuntimeUnavailableError(LibreYOLOError, RuntimeError):
    """The artifact is fine but cannot run on this machine (OS, GPU, missing runtime)."""


class DecodedFamily:
    """A family whose ``postprocess`` is an artifact's embedded-NMS decoder; the rest delegates."""

    def __init__(self, family: Family, decoder: Any) -> None:
        self._family = family
        self._decoder = decoder

    def postprocess(self, outputs: dict[str, torch.Tensor], metas: list, opts: Any = None, **kw: Any) -> list[dict]:
        return self._decoder(outputs, metas, self._family.task_options(opts, kw))  # the options are the task's

    def postprocess_later(self, outputs: dict[str, torch.Tensor], metas: list, opts: Any = None,
                          **kw: Any) -> Any:
        """Its own decoder, now (never the wrapped family's deferred detect stage)."""
        preds = self.postprocess(outputs, metas, opts, **kw)
        return lambda: preds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._family, name)


class ArtifactPredictor(Predictor):
    """An exported artifact with the eager model's ``predict()``."""

    format: ClassVar[str]

    def __init__(self, path: str | Path, meta: dict[str, Any]) -> None:
        self.path = Path(path)
        self._calls = CallState()  # the call plans of predict() (libreyolo.engine.plan), staging buffers
        family, nc, names, imgsz, batch = check_metadata(meta, str(self.path))
        self.metadata = meta
        self.size = meta["size"]
        self.names = names
        self.nc = nc
        self.imgsz = imgsz
        self.batch = batch
        self.input_name = meta["input_name"]
        self.output_names = tuple(meta["output_names"])
        axes = meta.get("dynamic_axes") or {}
        self.dynamic_batch = "0" in axes.get(self.input_name, {})
        self.dynamic_spatial = "2" in axes.get(self.input_name, {})
        self.dtype = torch.float16 if meta["input_dtype"] == "float16" else torch.float32
        # end-to-end (libreyolo.export.e2e): the graph takes uint8 RGB pixels and normalises inside; the
        # family's preprocessing runs as for any artifact and its batch is turned back into those pixels
        self.e2e = (meta.get("e2e") or {}).get("inside")
        # the artifact was validated with the preprocessing recorded in it; predict() uses the
        # family's current one, so the two must agree (as JSON, the way the metadata stores it)
        current = json.loads(json.dumps(family.letterbox(self.imgsz).describe()))
        stored = meta["letterbox"]
        if current != stored:
            raise CheckpointError(
                f"{self.path}: exported with preprocessing {stored}, but family {family.name} now preprocesses "
                f"with {current}; re-export it with this version"
            )
        if meta.get("nms"):
            path = family.export.nms_decoder_path()
            if path is None:
                raise CheckpointError(f"{self.path}: the artifact holds embedded NMS outputs, but family {family.name} "
                                      f"({family.export.kind} contract) has no NMS decoder; re-export with nms=False")
            module_name, _, attr = path.partition(":")
            decoder = getattr(importlib.import_module(module_name), attr)(meta["nms"])
            self.family = DecodedFamily(family, decoder)  # type: ignore[assignment]
        else:
            self.family = family

    # --- to implement ------------------------------------------------------------------------
    def _run(self, batch: torch.Tensor) -> list[torch.Tensor]:
        """Outputs for one batch of exactly the artifact's input shape, in ``output_names`` order."""
        raise NotImplementedError

    def describe(self) -> str:
        return self.format

    # --- shared ------------------------------------------------------------------------------
    @property
    def validation(self) -> dict[str, Any]:
        return self.metadata.get("validation", {"status": "unknown"})

    @property
    def task(self) -> str:
        return self.metadata["task"]

    def _preprocessor(self, imgsz: int) -> Any:
        pre = self.family.letterbox(imgsz)
        if not self.dynamic_spatial and hasattr(pre, "fixed"):
            # a preprocessor that keeps an image's own size pads it to the artifact's one input side
            pre = pre.fixed(f"this {self.format} model takes {self.imgsz}x{self.imgsz} inputs (static shape)")
        return pre

    def input_dtype(self, half: bool) -> torch.dtype:
        """The artifact's own input dtype, whatever ``half`` says (it was fixed at export)."""
        return self.dtype

    def _prepare(self, device: torch.device | None, half: bool) -> None:
        if device is not None and device.type != self.device.type:
            raise ArgumentError(f"this {self.format} model runs on {self.device}; load it with "
                                f"LibreYOLO(path, device={str(device)!r}) instead of passing device to predict()")
        if half and self.dtype != torch.float16:
            raise ArgumentError("half=True needs an artifact exported with half=True; this one is float32")

    @contextlib.contextmanager
    def evaluation(self, device: Any, imgsz: int) -> Iterator[tuple[Any, torch.device]]:
        """The runtime's forward for :meth:`val`: static batches run in chunks of the exported size
        (the last one padded), a static input size must be the exported one."""
        from libreyolo.utils.checks import resolve_device

        dev = resolve_device(device)
        if dev is not None and dev.type != self.device.type:
            raise ArgumentError(f"this {self.format} model runs on {self.device}, got device={str(device)!r}: "
                                f"validate without device=, or load it with LibreYOLO(path, device={str(device)!r}) "
                                "where its runtime allows")
        if not self.dynamic_spatial and imgsz != self.imgsz:
            raise ArgumentError(f"this {self.format} model was exported for imgsz={self.imgsz} (static shape), got "
                                f"imgsz={imgsz}: validate with imgsz={self.imgsz} (the default) or re-export it with "
                                f"imgsz={imgsz}")
        yield self._forward, self.device

    def _choose_executor(self, device: torch.device, graph: bool | str) -> str:
        if graph:
            self._refuse_graphs()
        return RUNTIME

    def _refuse_graphs(self) -> None:
        raise NotImplementedError(f"cuda_graph applies to eager models; a {self.format} artifact runs "
                                  "through its own runtime")

    def _forward(self, batch: torch.Tensor, *, cuda_graph: bool | str = False) -> dict[str, torch.Tensor]:
        if cuda_graph:
            self._refuse_graphs()
        h, w = int(batch.shape[2]), int(batch.shape[3])
        if not self.dynamic_spatial and (h, w) != (self.imgsz, self.imgsz):
            raise ArgumentError(f"this {self.format} model was exported for imgsz={self.imgsz} (static shape); "
                                f"got {h}x{w}: predict with imgsz={self.imgsz} or re-export with that size")
        if self.e2e is not None:
            from libreyolo.export.e2e import to_pixels

            batch = to_pixels(batch, self.e2e).contiguous()
        else:
            batch = batch.to(self.dtype).contiguous()
        n = int(batch.shape[0])
        if self.dynamic_batch or n == self.batch:
            outs = self._run(batch)
        else:  # static batch: run in chunks of the exported size, padding the last one
            parts = []
            for start in range(0, n, self.batch):
                chunk = batch[start:start + self.batch]
                if chunk.shape[0] < self.batch:
                    pad = chunk.new_zeros((self.batch - chunk.shape[0], *chunk.shape[1:]))
                    chunk = torch.cat((chunk, pad))
                parts.append(self._run(chunk))
            outs = [torch.cat([p[i] for p in parts])[:n] for i in range(len(self.output_names))]
        return dict(zip(self.output_names, outs, strict=True))

    def info(self) -> dict[str, Any]:
        return {"format": self.format, "path": str(self.path), "family": self.family.name, "size": self.size,
                "task": self.task, "imgsz": self.imgsz, "batch": self.batch, "precision": self.metadata["precision"],
                "dynamic_axes": self.metadata.get("dynamic_axes"), "device": str(self.device),
                "runtime": self.describe(), "validation": self.validation.get("summary", self.validation.get("status"))}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path.name}, {self.family.name}-{self.size}, device={self.device})"


def _fail(where: str, text: str) -> CheckpointError:
    return CheckpointError(f"{where}: {text}; the metadata does not describe this artifact (edited or damaged): "
                           "re-export it")


def check_metadata(meta: dict[str, Any], where: str) -> tuple[Family, int, dict[int, str], int, int]:
    """Every metadata field an artifact runtime relies on, checked before it is used.

    Returns (family, nc, names, imgsz, batch). Bounds are those of checkpoints
    (:mod:`libreyolo.utils.checks`).
    """
    from libreyolo.export.nms import DEFAULTS as NMS_DEFAULTS
    from libreyolo.utils.checks import check_batch, check_imgsz, check_names, check_nc, check_str

    family = get_family(check_str(meta["family"], "family", where, CheckpointError))
    if meta["size"] not in family.sizes:
        raise _fail(where, f"'size' is {meta['size']!r}, not one of {family.name}'s sizes ({', '.join(family.sizes)})")
    if meta["task"] != family.task:
        raise _fail(where, f"'task' is {meta['task']!r} but family {family.name} is a {family.task!r} model")
    names = meta["names"]
    nc = check_nc(meta.get("nc", len(names) if isinstance(names, (dict, list)) else names), where, CheckpointError)
    names = check_names(names, nc, where, CheckpointError)
    if meta["stride"] != family.stride:
        raise _fail(where, f"'stride' is {meta['stride']!r} but family {family.name} has stride {family.stride}")
    imgsz = check_imgsz(meta["imgsz"], family.stride, where, CheckpointError)
    batch = check_batch(meta["batch"], where, CheckpointError)
    check_str(meta["input_name"], "input_name", where, CheckpointError)
    outputs = meta["output_names"]
    if not isinstance(outputs, list) or not outputs or not all(isinstance(o, str) and o for o in outputs):
        raise _fail(where, f"'output_names' must be a list of output names, got {outputs!r}")
    if meta["input_dtype"] not in ("float32", "float16", "uint8"):
        raise _fail(where, f"'input_dtype' is {meta['input_dtype']!r}; expected 'float32', 'float16' or 'uint8'")
    e2e = meta.get("e2e")
    if (meta["input_dtype"] == "uint8") != bool(e2e):
        raise _fail(where, f"'input_dtype' is {meta['input_dtype']!r} but 'e2e' is {e2e!r}: a uint8 input is an "
                           "end-to-end artifact's, which records its normalisation under 'e2e'")
    if e2e:
        inside = e2e.get("inside") if isinstance(e2e, dict) else None
        if (not isinstance(inside, dict) or inside.get("color") not in ("RGB", "BGR")
                or not all(isinstance(inside.get(k), list) and len(inside[k]) == 3 for k in ("mean", "std"))
                or not isinstance(inside.get("scale"), (int, float)) or inside["scale"] <= 0
                or min(inside["std"]) <= 0):
            raise _fail(where, "'e2e' must record the colour order, scale, mean and std applied inside, "
                               f"got {e2e!r:.80}")
    for key in ("letterbox", "dynamic_axes"):
        if not isinstance(meta[key], dict):
            raise _fail(where, f"'{key}' must be a mapping, got {type(meta[key]).__name__}")
    for name, axes in meta["dynamic_axes"].items():
        if not isinstance(axes, dict) or not all(isinstance(a, str) and a.isdigit() for a in axes):
            raise _fail(where, f"'dynamic_axes' of {name!r:.40} must map axis numbers to names, got {axes!r:.60}")
    nms = meta.get("nms")
    if nms is not None:
        if not isinstance(nms, dict) or set(nms) != set(NMS_DEFAULTS):
            raise _fail(where, f"'nms' must hold {sorted(NMS_DEFAULTS)}, got {nms!r}")
        for key in ("topk", "iterations", "max_det"):
            if isinstance(nms[key], bool) or not isinstance(nms[key], int) or not 1 <= nms[key] <= 100_000:
                raise _fail(where, f"nms {key} must be a positive integer, got {nms[key]!r}")
        for key in ("iou", "conf"):
            if isinstance(nms[key], bool) or not isinstance(nms[key], (int, float)) or not 0 <= nms[key] <= 1:
                raise _fail(where, f"nms {key} must be a number in [0, 1], got {nms[key]!r}")
    return family, nc, names, imgsz, batch


Shape = tuple  # of int (a fixed size) or None (a dynamic axis)


def check_graph(meta: dict[str, Any], family: Family, inputs: dict[str, Shape], outputs: dict[str, Shape],
                where: str) -> None:
    """Compare the metadata with the artifact's own input and output shapes.

    Catches a metadata edit that the graph contradicts (another ``nc``, ``batch``, ``imgsz``,
    dynamic axes, output set or NMS ``max_det``) with an error naming the field, whether or
    not the integrity hashes are checked.
    """
    name = meta["input_name"]
    if name not in inputs:
        raise _fail(where, f"'input_name' is {name!r} but the graph's inputs are {sorted(inputs)}")
    shape = inputs[name]
    if len(shape) != 4 or shape[1] not in (3, None):
        raise _fail(where, f"the graph's input {name!r} has shape {shape}, not (batch, 3, height, width)")
    axes = meta["dynamic_axes"].get(name, {})
    expected = {0: ("batch", meta["batch"]), 2: ("imgsz", meta["imgsz"]), 3: ("imgsz", meta["imgsz"])}
    for axis, (field, value) in expected.items():
        dynamic = str(axis) in axes
        if dynamic and shape[axis] is not None:
            raise _fail(where, f"'dynamic_axes' says axis {axis} of {name!r} is dynamic, but the graph fixes it "
                               f"at {shape[axis]}")
        if not dynamic and shape[axis] is not None and shape[axis] != value:
            raise _fail(where, f"'{field}' is {value} but the graph's input {name!r} has shape {shape}")
        if not dynamic and shape[axis] is None:
            raise _fail(where, f"'dynamic_axes' says axis {axis} of {name!r} is fixed, but it is dynamic in the graph")
    if set(outputs) != set(meta["output_names"]):
        raise _fail(where, f"'output_names' is {meta['output_names']} but the graph's outputs are {sorted(outputs)}")
    nms = meta.get("nms")
    if nms:
        from libreyolo.export.nms import OUTPUT_NAMES

        det = outputs.get(OUTPUT_NAMES[0])
        if det is None or len(det) != 3 or det[2] not in (6, None):
            raise _fail(where, f"'nms' is set but the graph has no (batch, max_det, 6) {OUTPUT_NAMES[0]!r} output")
        if det[1] is not None and det[1] != nms["max_det"]:
            raise _fail(where, f"'nms' max_det is {nms['max_det']} but the graph's {OUTPUT_NAMES[0]!r} output "
                               f"holds {det[1]} rows")
        return
    nc = int(meta.get("nc", len(meta["names"])))
    for out, (axis, offset) in family.export.class_axes.items():
        dims = outputs.get(out)
        if dims is not None and len(dims) > axis and dims[axis] is not None and dims[axis] != nc + offset:
            raise _fail(where, f"'nc' is {nc} but the graph's output {out!r} has {dims[axis]} channels on axis "
                               f"{axis}, i.e. {dims[axis] - offset} classes")


def check_artifact_file(path: str | Path, fmt: str, *, folder: bool = False) -> Path:
    """The artifact's path, refusing a missing one and the wrong kind (a pipe would block a read)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{fmt} model not found: {path}")
    if folder and not path.is_dir():
        raise CheckpointError(f"{path} is not a {fmt} package (expected a folder)")
    if not folder and not path.is_file():
        kind = "a folder" if path.is_dir() else "not a regular file"
        raise CheckpointError(f"{path} is {kind}, not a {fmt} model file")
    if not folder and path.stat().st_size == 0:
        raise CheckpointError(f"{path} is empty (0 bytes), not a {fmt} model: the export or the copy did not "
                              "finish; export it again")
    return path
