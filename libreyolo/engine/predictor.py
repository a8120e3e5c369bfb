"""The one predict pipeline: load -> letterbox -> forward -> postprocess -> Results.

Eager models, CUDA-graph replay and every artifact runtime subclass :class:`Predictor` and
provide only ``_forward`` (a batch tensor in, the family's named outputs out), so
preprocessing, decoding and NMS exist once.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from libreyolo.data.sources import SourceImage, load_sources
from libreyolo.errors import ArgumentError
from libreyolo.models.base import Family
from libreyolo.results import Boxes, Results

CUDA_GRAPH_MODES = (False, True, "auto")


def _check_fraction(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
        raise ArgumentError(f"{name} must be a number between 0 and 1, got {value!r}")
    return float(value)


def _check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgumentError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_imgsz(value: Any, stride: int) -> int:
    if isinstance(value, (list, tuple)) and len(value) == 2 and value[0] == value[1]:
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int) or value < stride or value % stride:
        raise ArgumentError(
            f"imgsz must be a positive multiple of the model stride {stride} (e.g. 320, 640), got {value!r}"
        )
    return value


class Predictor:
    """Shared ``predict()``; subclasses implement ``_forward`` and expose ``device``."""

    family: Family
    size: str
    names: dict[int, str]
    imgsz: int

    # --- to implement --------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        raise NotImplementedError

    def _input_dtype(self, half: bool) -> torch.dtype:
        return torch.float16 if half else torch.float32

    def _forward(self, batch: torch.Tensor, *, cuda_graph: bool | str = False) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _prepare(self, device: torch.device | None, half: bool) -> None:
        """Move/convert the backend if a call asks for another device or precision."""

    # --- the pipeline ----------------------------------------------------------------------
    def __call__(self, source: Any = None, **kwargs: Any) -> Results | list[Results]:
        return self.predict(source, **kwargs)

    def predict(
        self,
        source: Any = None,
        *,
        conf: float = 0.25,
        iou: float = 0.45,
        max_det: int = 300,
        imgsz: int | None = None,
        classes: Sequence[int] | None = None,
        half: bool = False,
        device: str | torch.device | None = None,
        batch: int | None = None,
        cuda_graph: bool | str = False,
        color_format: str = "bgr",
        verbose: bool = False,
    ) -> Results | list[Results]:
        """Detect objects. One input gives one :class:`Results`; a list, directory or batch gives a list.

        ``source``: path, directory, list of paths, PIL image, numpy HWC array (BGR unless
        ``color_format="rgb"``), tensor (CHW/NCHW RGB, float in [0, 1] or uint8), or a list.
        """
        conf = _check_fraction("conf", conf)
        iou = _check_fraction("iou", iou)
        max_det = _check_positive_int("max_det", max_det)
        imgsz = check_imgsz(self.imgsz if imgsz is None else imgsz, self.family.stride)
        if batch is not None:
            batch = _check_positive_int("batch", batch)
        if cuda_graph not in CUDA_GRAPH_MODES or not isinstance(cuda_graph, (bool, str)):
            raise ArgumentError(f"cuda_graph must be False, True or 'auto', got {cuda_graph!r}")
        if classes is not None:
            classes = [classes] if isinstance(classes, int) else list(classes)
            bad = [c for c in classes if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < len(self.names)]
            if bad:
                raise ArgumentError(f"classes must be class ids in 0..{len(self.names) - 1}, got {bad}")
        self._prepare(torch.device(device) if device is not None else None, bool(half))

        t0 = time.perf_counter()
        images = load_sources(source, color_format=color_format)
        single = len(images) == 1 and not isinstance(source, (list, tuple)) and not _is_multi(source)
        step = batch or len(images)
        results: list[Results] = []
        for start in range(0, len(images), step):
            chunk = images[start:start + step]
            results.extend(self._predict_chunk(chunk, t0, conf=conf, iou=iou, max_det=max_det, imgsz=imgsz,
                                               classes=classes, half=bool(half), cuda_graph=cuda_graph))
            t0 = time.perf_counter()
        if verbose:
            for r in results:
                print(f"{r.path or 'image'}: {len(r)} detections, " + ", ".join(
                    f"{k} {v:.1f} ms" for k, v in r.speed.items()))
        return results[0] if single else results

    def _predict_chunk(self, chunk: list[SourceImage], t0: float, *, conf: float, iou: float, max_det: int,
                       imgsz: int, classes: list[int] | None, half: bool, cuda_graph: bool | str) -> list[Results]:
        device = self.device
        tensors = [img.to_device(device) for img in chunk]
        batch, metas = self.family.letterbox(imgsz)(tensors, dtype=self._input_dtype(half))
        t1 = time.perf_counter()
        outputs = self._forward(batch, cuda_graph=cuda_graph)
        t2 = time.perf_counter()
        dets = self.family.postprocess(outputs, metas, conf=conf, iou=iou, max_det=max_det, classes=classes)
        t3 = time.perf_counter()
        n = len(chunk)
        # per-image share of the chunk's time; inference and post include device time because
        # postprocessing reads results back (a synchronisation point)
        speed = {"preprocess": (t1 - t0) * 1e3 / n, "inference": (t2 - t1) * 1e3 / n,
                 "postprocess": (t3 - t2) * 1e3 / n}
        out = []
        for img, meta, det in zip(chunk, metas, dets, strict=True):
            boxes = Boxes(det["xyxy"], det["conf"], det["cls"], meta.orig_shape)
            out.append(Results(names=self.names, orig_shape=meta.orig_shape, path=img.path, boxes=boxes,
                               orig_img=img.original if img.original is not None else img.pixels,
                               speed=dict(speed)))
        return out


def _is_multi(source: Any) -> bool:
    from pathlib import Path

    if isinstance(source, (str, Path)) and Path(source).is_dir():
        return True
    return isinstance(source, torch.Tensor) and source.ndim == 4 and source.shape[0] > 1
