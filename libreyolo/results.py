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
    """Detections of one image. Tensors stay on the device they were computed on. ``id``: the
    track ids (int64, from 1) of boxes that ``track()`` returned, else None."""

    def __init__(self, xyxy: torch.Tensor, conf: torch.Tensor, cls: torch.Tensor, orig_shape: tuple[int, int],
                 id: torch.Tensor | None = None):  # noqa: A002 - the name users know (Ultralytics' boxes.id)
        self.xyxy = xyxy
        self.conf = conf
        self.cls = cls
        self.orig_shape = orig_shape
        self.id = id

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
        return Boxes(self.xyxy.cpu(), self.conf.cpu(), self.cls.cpu(), self.orig_shape,
                     None if self.id is None else self.id.cpu())

    # --- the payload protocol (libreyolo.results.Results) ----------------------------------
    def n_predictions(self) -> int:
        return len(self)

    def verbose(self, names: dict[int, str]) -> str:
        return f"{len(self)} detections"

    def summary(self, names: dict[int, str]) -> list[dict[str, Any]]:
        b = self.cpu()
        out = [{"name": names.get(int(k), str(int(k))), "class": int(k), "confidence": round(c, 5),
                "box": {"x1": round(xyxy[0], 3), "y1": round(xyxy[1], 3), "x2": round(xyxy[2], 3),
                        "y2": round(xyxy[3], 3)}}
               for xyxy, c, k in zip(b.xyxy.tolist(), b.conf.tolist(), b.cls.tolist(), strict=True)]
        if b.id is not None:
            for row, i in zip(out, b.id.tolist(), strict=True):
                row["track_id"] = int(i)
        return out

    def draw(self, image: Any, names: dict[int, str], *, line_width: int | None = None, labels: bool = True,
             conf: bool = True) -> Any:
        from libreyolo.utils.plotting import draw_boxes

        draw_boxes(image, self, names, line_width=line_width, labels=labels, show_conf=conf)
        return image

    def __repr__(self) -> str:
        tracked = "" if self.id is None else ", tracked"
        return f"Boxes(n={len(self)}, orig_shape={self.orig_shape}{tracked})"


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

    # --- the payload protocol (libreyolo.results.Results) ----------------------------------
    def n_predictions(self) -> int:
        return 1

    def verbose(self, names: dict[int, str]) -> str:
        return ", ".join(f"{names.get(k, str(k))} {c:.3f}" for k, c in zip(self.top5, self.top5conf.tolist(),
                                                                           strict=True))

    def summary(self, names: dict[int, str]) -> list[dict[str, Any]]:
        return [{"name": names.get(k, str(k)), "class": k, "confidence": round(c, 5)}
                for k, c in zip(self.top5, self.top5conf.tolist(), strict=True)]

    def draw(self, image: Any, names: dict[int, str], *, conf: bool = True, **_: Any) -> Any:
        from libreyolo.utils.plotting import draw_top5

        draw_top5(image, self, names, show_conf=conf)
        return image

    def __repr__(self) -> str:
        return f"Probs(nc={len(self)}, top1={self.top1}, top1conf={float(self.top1conf):.4f})"


# --- the payloads' Results fields: the task table predict() and the export validator go through ----
def make_results(task: str, pred: dict[str, torch.Tensor], *, names: dict[int, str], orig_shape: tuple[int, int],
                 **common: Any) -> Results:
    """The :class:`Results` of one image from what the family's postprocess returned for it
    (the task, :mod:`libreyolo.tasks`, turns it into its payload)."""
    from libreyolo.tasks import get_task

    t = get_task(task)
    return Results(names=names, orig_shape=orig_shape, **{t.payload: t.make_payload(pred, orig_shape)}, **common)


def decoded_predictions(task: str, result: Results) -> dict[str, torch.Tensor]:
    """The inverse of :func:`make_results`: a Results as the postprocess dict it was built from."""
    from libreyolo.tasks import get_task

    t = get_task(task)
    return t.decoded(getattr(result, t.payload))


class Results:
    """Everything predicted for one image: the payload of its model's task under the attribute
    name users know (``boxes``, ``probs``, ``semantic_mask``, ...; :mod:`libreyolo.tasks`), the
    others None. A payload has ``n_predictions()``, ``summary(names)``, ``verbose(names)``,
    ``draw(image, names, **kw)`` and ``cpu()``; Results delegates to it. A video frame's Results
    also carry ``frame`` (its index in the video) and ``timestamp`` (seconds); None for images."""

    def __init__(self, *, names: dict[int, str], orig_shape: tuple[int, int], path: str | None = None,
                 orig_img: Any = None, speed: dict[str, float] | None = None, frame: int | None = None,
                 timestamp: float | None = None, **payloads: Any):
        from libreyolo.tasks import payload_names

        known = payload_names()
        unknown = sorted(k for k in payloads if k not in known)
        if unknown:
            raise TypeError(f"Results got unknown payload(s) {unknown}; registered: {sorted(known)}")
        own = {"_payloads": {k: v for k, v in payloads.items() if v is not None}, "names": names,
               "orig_shape": orig_shape, "path": path, "_orig_img": orig_img,
               "speed": speed or {"preprocess": 0.0, "inference": 0.0, "postprocess": 0.0},
               "frame": frame, "timestamp": timestamp}  # a video frame's index and time (s); None otherwise
        self.__dict__.update(own)  # its own fields: no payload lookup per result

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        from libreyolo.tasks import payload_names

        if name in payload_names():
            return self.__dict__["_payloads"].get(name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        from libreyolo.tasks import payload_names

        if name in payload_names():
            if value is None:
                self._payloads.pop(name, None)
            else:
                self._payloads[name] = value
            return
        object.__setattr__(self, name, value)

    @property
    def payloads(self) -> dict[str, Any]:
        """The payloads present, by attribute name."""
        return dict(self._payloads)

    def __len__(self) -> int:
        return sum(p.n_predictions() for p in self._payloads.values())

    def __repr__(self) -> str:
        what = ", ".join(f"{k}={p.n_predictions()}" for k, p in self._payloads.items()) or "empty"
        return f"Results({what}, orig_shape={self.orig_shape}, path={self.path!r})"

    def verbose(self) -> str:
        """One line for logs and the CLI: ``3 detections``, the top-5 classes with probabilities, ..."""
        parts = [p.verbose(self.names) for p in self._payloads.values()]
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
        """Draw the predictions on the source image (each payload draws itself: boxes, top-5
        classes, a class overlay with its legend); returns a PIL image (RGB)."""
        from PIL import Image

        image = Image.fromarray(self.orig_rgb()).convert("RGB")
        for p in self._payloads.values():
            image = p.draw(image, self.names, line_width=line_width, labels=labels, conf=conf)
        return image

    def save(self, filename: str | Path | None = None) -> str:
        """Write the annotated image (format from the suffix) atomically; returns the path."""
        from libreyolo.utils.atomic import atomic_write

        if filename is None:
            stem = Path(self.path).stem if self.path else "result"
            filename = f"{stem}_pred{save_suffix(self.path)}"
        filename = Path(filename)
        image = self.plot()
        fmt = SAVE_FORMATS.get(filename.suffix.lower(), "PNG")
        atomic_write(filename, lambda tmp: image.save(tmp, format=fmt))
        for p in self._payloads.values():  # what a payload writes beside the picture (a class-map PNG)
            extra = getattr(p, "save_extra", None)
            if extra is not None:
                extra(filename)
        return str(filename)

    # --- serialisation ---------------------------------------------------------------------
    def summary(self) -> list[dict[str, Any]]:
        """The predictions as JSON-ready dicts (one per detection, per top-5 class, per segmented class)."""
        out: list[dict[str, Any]] = []
        for p in self._payloads.values():
            out += p.summary(self.names)
        return out

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.summary(), indent=indent)
