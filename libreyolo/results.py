"""Prediction results with the attributes YOLO users know (``boxes.xyxy``, ``probs.top5``, ...)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from libreyolo.ops.boxes import xyxy_to_xywh

# suffixes an annotated image can be written as (PIL format names)
SAVE_FORMATS = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".bmp": "BMP", ".webp": "WEBP",
                ".tif": "TIFF", ".tiff": "TIFF"}


def save_suffix(source: str | Path | None) -> str:
    """The suffix of an annotated copy: the source's own when it can be written, else ``.jpg``."""
    suffix = Path(source).suffix.lower() if source else ""
    return suffix if suffix in SAVE_FORMATS else ".jpg"


class OutputNames:
    """Unique output stems for one run, so that no output overwrites another.

    The first source with a given stem keeps it (``a.jpg`` -> ``a``); a later one with the same
    stem gets its suffix added (``a.png`` -> ``a_png``), then a number (``a_png_2``). Compared
    case-insensitively, for file systems that are. Sources without a path are ``image``,
    ``image_2``, ...
    """

    def __init__(self) -> None:
        self._taken: set[str] = set()

    def stem(self, source: str | Path | None) -> str:
        base = Path(source).stem if source else "image"
        suffix = Path(source).suffix.lstrip(".").lower() if source else ""
        candidates = [base] + ([f"{base}_{suffix}"] if suffix else [])
        name = next((c for c in candidates if c.lower() not in self._taken), None)
        n = 2
        while name is None:
            candidate = f"{candidates[-1]}_{n}"
            name, n = (candidate if candidate.lower() not in self._taken else None), n + 1
        self._taken.add(name.lower())
        return name


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
    """Class probabilities of one image (classification tasks), as Ultralytics users know them.

    ``data`` (nc,) probabilities; ``top1`` / ``top5`` class ids (int / list of int, best first);
    ``top1conf`` / ``top5conf`` their probabilities (tensors). Ties rank the lower class id first.
    """

    def __init__(self, data: torch.Tensor):
        if data.ndim != 1:
            raise ValueError(f"Probs expects one image's (nc,) probabilities, got shape {tuple(data.shape)}")
        self.data = data

    def _top(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        # stable sort: equal probabilities keep class-id order, on every device
        values, indices = torch.sort(self.data, descending=True, stable=True)
        return values[:k], indices[:k]

    @property
    def top1(self) -> int:
        return int(self._top(1)[1][0])

    @property
    def top5(self) -> list[int]:
        return self._top(min(5, self.data.numel()))[1].tolist()

    @property
    def top1conf(self) -> torch.Tensor:
        return self._top(1)[0][0]

    @property
    def top5conf(self) -> torch.Tensor:
        return self._top(min(5, self.data.numel()))[0]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    def __len__(self) -> int:
        return int(self.data.shape[0])

    def cpu(self) -> Probs:
        return Probs(self.data.cpu())

    def numpy(self) -> np.ndarray:
        return self.data.detach().cpu().numpy()

    def to(self, *args: Any, **kwargs: Any) -> Probs:
        return Probs(self.data.to(*args, **kwargs))

    def __repr__(self) -> str:
        return f"Probs(nc={len(self)}, top1={self.top1}, top1conf={float(self.top1conf):.4f})"


# --- task -> Results fields: the one table predict() and the export validator go through -----------
def _detect_fields(pred: dict[str, torch.Tensor], orig_shape: tuple[int, int]) -> dict[str, Any]:
    return {"boxes": Boxes(pred["xyxy"], pred["conf"], pred["cls"], orig_shape)}


def _detect_decoded(r: Results) -> dict[str, torch.Tensor]:
    return {"xyxy": r.boxes.xyxy, "conf": r.boxes.conf, "cls": r.boxes.cls}


def _classify_fields(pred: dict[str, torch.Tensor], orig_shape: tuple[int, int]) -> dict[str, Any]:
    return {"probs": Probs(pred["probs"])}


def _classify_decoded(r: Results) -> dict[str, torch.Tensor]:
    return {"probs": r.probs.data}


# task: (postprocess dict -> Results keyword arguments, Results -> postprocess dict)
TASK_FIELDS: dict[str, tuple[Any, Any]] = {
    "detect": (_detect_fields, _detect_decoded),
    "classify": (_classify_fields, _classify_decoded),
}


def register_task(task: str, fields: Any, decoded: Any) -> None:
    """Teach :func:`make_results` a new task: ``fields(pred, orig_shape) -> Results kwargs`` and
    ``decoded(results) -> pred`` (its inverse, used by the export validator)."""
    TASK_FIELDS[task] = (fields, decoded)


def _task_entry(task: str) -> tuple[Any, Any]:
    try:
        return TASK_FIELDS[task]
    except KeyError:
        raise ValueError(f"no Results fields are defined for task {task!r}; known tasks: "
                         f"{', '.join(sorted(TASK_FIELDS))} (add one with libreyolo.results.register_task)") from None


def make_results(task: str, pred: dict[str, torch.Tensor], *, names: dict[int, str], orig_shape: tuple[int, int],
                 **common: Any) -> Results:
    """The :class:`Results` of one image from what the family's postprocess returned for it."""
    return Results(names=names, orig_shape=orig_shape, **_task_entry(task)[0](pred, orig_shape), **common)


def decoded_predictions(task: str, result: Results) -> dict[str, torch.Tensor]:
    """The inverse of :func:`make_results`: a Results as the postprocess dict it was built from."""
    return _task_entry(task)[1](result)


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

    def verbose(self) -> str:
        """One line for logs and the CLI: ``3 detections`` or the top-5 classes with probabilities."""
        parts = []
        if self.boxes is not None:
            parts.append(f"{len(self.boxes)} detections")
        if self.probs is not None:
            parts.append(", ".join(f"{self.names.get(k, str(k))} {c:.3f}"
                                   for k, c in zip(self.probs.top5, self.probs.top5conf.tolist(), strict=True)))
        return "; ".join(parts) if parts else "no predictions"

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
        if self.path is not None:  # a file-backed result (see release_image): read it again
            from libreyolo.data.sources import read_image_file
            from libreyolo.errors import ImageError

            arr = read_image_file(self.path)
            if tuple(arr.shape[:2]) != tuple(self.orig_shape):
                raise ImageError(f"{self.path} changed since predict(): it is now {arr.shape[1]}x{arr.shape[0]}, "
                                 f"the boxes refer to {self.orig_shape[1]}x{self.orig_shape[0]}")
            return arr
        h, w = self.orig_shape
        return np.zeros((h, w, 3), np.uint8)

    def release_image(self) -> None:
        """Forget the source pixels of a result read from a file; :meth:`orig_rgb` reads the file
        again when needed (``predict()`` does this for lists, so that they stay small)."""
        if self.path is not None:
            self._orig_img = None

    def plot(self, *, line_width: int | None = None, labels: bool = True, conf: bool = True):
        """Draw the detections on the source image; returns a PIL image (RGB)."""
        from libreyolo.utils.plotting import draw_detections

        return draw_detections(self, line_width=line_width, labels=labels, show_conf=conf)

    def save(self, filename: str | Path | None = None) -> str:
        """Write the annotated image (format from the suffix) atomically; returns the path."""
        from libreyolo.checkpoint import atomic_write

        if filename is None:
            stem = Path(self.path).stem if self.path else "result"
            filename = f"{stem}_pred{save_suffix(self.path)}"
        filename = Path(filename)
        image = self.plot()
        fmt = SAVE_FORMATS.get(filename.suffix.lower(), "PNG")
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
