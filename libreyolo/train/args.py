"""Every training option with its default: :class:`TrainArgs` (``model.train(**kwargs)`` and
``libreyolo train``), each field checked by its declaration in :data:`libreyolo.train.options.TRAIN_OPTIONS`."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from libreyolo.errors import ArgumentError

NOMINAL_BATCH = 64  # gradients are accumulated up to about this many images per optimizer step


@dataclass
class TrainArgs:
    """Every training option, with its default (``model.train(**kwargs)`` and ``libreyolo train``)."""

    data: str | None = None
    epochs: int = 100
    imgsz: int | None = None  # default: the model's
    batch: int = 16
    workers: int = 2
    device: str | None = None  # None: the model's GPU, else cuda:0 when there is one, else the model's device
    optimizer: str = "auto"
    lr0: float = 0.01
    lrf: float = 0.01
    momentum: float = 0.937
    weight_decay: float = 5e-4
    warmup_epochs: float = 3.0
    cos_lr: bool = True
    amp: bool = True  # CUDA only; ignored on the CPU
    ema: bool = True
    clip: float = 10.0
    nbs: int = NOMINAL_BATCH  # nominal batch: gradients are accumulated up to about this many images
    label_smoothing: float = 0.1
    mosaic: float = 1.0
    close_mosaic: int = 10
    degrees: float = 0.0  # detection augmentation (libreyolo.train.augment.AugmentConfig)
    translate: float = 0.1
    scale: float = 0.5
    shear: float = 0.0
    fliplr: float = 0.5
    flipud: float = 0.0
    hsv_h: float = 0.015
    hsv_s: float = 0.7
    hsv_v: float = 0.4
    seed: int = 0
    project: str = "runs/train"
    name: str = "exp"
    exist_ok: bool = False
    resume: bool = False
    val: bool = True
    cuda_graph: bool = False
    graph_after: int = 3  # cuda_graph: capture once a batch shape has been seen this many times
    pin_memory: bool = True
    conf: float = 0.001  # validation thresholds (mAP is computed over all confidences)
    iou: float = 0.7
    max_det: int = 300
    plots: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> TrainArgs:
        known = {f.name for f in fields(cls)} - {"extra"}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ArgumentError(f"unknown training argument(s) {unknown}; valid: {', '.join(sorted(known))}")
        args = cls(**kwargs)
        args.check()
        return args

    def check(self) -> None:
        """Every field against its declaration (:data:`libreyolo.train.options.TRAIN_OPTIONS`)."""
        from libreyolo.train.options import TRAIN_OPTIONS

        for name, opt in TRAIN_OPTIONS.items():
            setattr(self, name, opt.check(name, getattr(self, name)))
        if not self.data and not self.resume:
            raise ArgumentError("train needs data=: a dataset YAML (detect) or an image-folder root (classify)")
