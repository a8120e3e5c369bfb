"""Prediction results with the attributes YOLO users know (``boxes.xyxy``, ``probs.top5``, ...)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from libreyolo.ops.boxes import xyxy_to_xywh


class Boxes:
    """Detections of one image. Tensors stay on the device they were computed on."""

    def __init__(self, xyxy: torch.Tensor, conf: torch.Tensor, cls: torch.Tensor, orig_shape: tuple[int, int]):
        self.xyxy = xyxy
        self.conf = conf
        self.cls = cls
        self.orig_shape = orig_shape

    @property
    def data(self) -> torch.Tensor:
        """(N, 6): x1, y1, x2, y2, conf, cls."""
        return torch.cat((self.xyxy, self.conf[:, None], self.cls[:, None]), 1)

    @property
    def xywh(self) -> torch.Tensor:
        return xyxy_to_xywh(self.xyxy)

    @property
    def xyxyn(self) -> torch.Tensor:
        h, w = self.orig_shape
        return self.xyxy / self.xyxy.new_tensor([w, h, w, h])

    @property
    def xywhn(self) -> torch.Tensor:
        h, w = self.orig_shape
        return self.xywh / self.xyxy.new_tensor([w, h, w, h])

    def __len__(self) -> int:
        return int(self.conf.shape[0])

    def cpu(self) -> Boxes:
        return Boxes(self.xyxy.cpu(), self.conf.cpu(), self.cls.cpu(), self.orig_shape)

    def __repr__(self) -> str:
        return f"Boxes(n={len(self)}, orig_shape={self.orig_shape})"


class Probs:
    """Class probabilities of one image (classification tasks)."""

    def __init__(self, data: torch.Tensor):
        self.data = data

    @property
    def top1(self) -> int:
        return int(self.data.argmax())

    @property
    def top5(self) -> list[int]:
        return self.data.topk(min(5, self.data.numel())).indices.tolist()

    @property
    def top1conf(self) -> torch.Tensor:
        return self.data.max()

    @property
    def top5conf(self) -> torch.Tensor:
        return self.data.topk(min(5, self.data.numel())).values


class Results:
    """Everything predicted for one image."""

    def __init__(self, *, names: dict[int, str], orig_shape: tuple[int, int], path: str | None = None,
                 boxes: Boxes | None = None, probs: Probs | None = None, orig_img: Any = None,
                 speed: dict[str, float] | None = None):
        self.names = names
        self.orig_shape = orig_shape
        self.path = path
        self.boxes = boxes
        self.probs = probs
        self._orig_img = orig_img
        self.speed = speed or {"preprocess": 0.0, "inference": 0.0, "postprocess": 0.0}

    def __len__(self) -> int:
        if self.boxes is not None:
            return len(self.boxes)
        return 0 if self.probs is None else 1

    def __repr__(self) -> str:
        what = f"{len(self.boxes)} boxes" if self.boxes is not None else "probs"
        return f"Results({what}, orig_shape={self.orig_shape}, path={self.path!r})"

    # --- images --------------------------------------------------------------------------
    def orig_rgb(self) -> np.ndarray:
        """The source image as an HWC uint8 RGB array."""
        img = self._orig_img
        if isinstance(img, np.ndarray):
            return img
        if isinstance(img, torch.Tensor):
            t = img.detach().cpu()
            if t.is_floating_point():
                t = (t.clamp(0, 1) * 255).round().to(torch.uint8)
            return t.permute(1, 2, 0).numpy()
        if self.path is not None:
            from libreyolo.data.sources import load_sources

            return load_sources(self.path)[0].original
        h, w = self.orig_shape
        return np.zeros((h, w, 3), np.uint8)

    def plot(self, *, line_width: int | None = None, labels: bool = True, conf: bool = True):
        """Draw the detections on the source image; returns a PIL image (RGB)."""
        from libreyolo.utils.plotting import draw_detections

        return draw_detections(self, line_width=line_width, labels=labels, show_conf=conf)

    def save(self, filename: str | Path | None = None) -> str:
        """Write the annotated image (format from the suffix) atomically; returns the path."""
        from libreyolo.checkpoint import atomic_write

        if filename is None:
            stem = Path(self.path).stem if self.path else "result"
            filename = f"{stem}_pred.jpg"
        filename = Path(filename)
        image = self.plot()
        fmt = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".bmp": "BMP", ".webp": "WEBP"}.get(
            filename.suffix.lower(), "PNG")
        atomic_write(filename, lambda tmp: image.save(tmp, format=fmt))
        return str(filename)

    # --- serialisation ---------------------------------------------------------------------
    def summary(self) -> list[dict[str, Any]]:
        out = []
        if self.boxes is not None:
            b = self.boxes.cpu()
            for xyxy, c, k in zip(b.xyxy.tolist(), b.conf.tolist(), b.cls.tolist(), strict=True):
                out.append({"name": self.names.get(int(k), str(int(k))), "class": int(k), "confidence": round(c, 5),
                            "box": {"x1": round(xyxy[0], 3), "y1": round(xyxy[1], 3),
                                    "x2": round(xyxy[2], 3), "y2": round(xyxy[3], 3)}})
        if self.probs is not None:
            for k, c in zip(self.probs.top5, self.probs.top5conf.tolist(), strict=True):
                out.append({"name": self.names.get(k, str(k)), "class": k, "confidence": round(c, 5)})
        return out

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.summary(), indent=indent)
