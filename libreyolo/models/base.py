"""The contract a family declares once; everything else (predict, graphs, export, runtimes) reads it.

A family is one folder under ``libreyolo/models/`` with a :class:`Family` subclass registered
by :func:`libreyolo.models.registry.register_family`. No code outside the family's folder
branches on family names.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from libreyolo.ops.letterbox import Letterbox, LetterboxMeta


@dataclass(frozen=True)
class ExportContract:
    """What an exported artifact of this family looks like, and how closely it must match eager."""

    input_name: str = "images"
    input_layout: str = "NCHW"  # float32 RGB in [0, 1]
    output_names: tuple[str, ...] = ("predictions",)
    dynamic_batch: bool = True
    dynamic_spatial: bool = False
    # max abs error on raw outputs allowed per precision, when validating an artifact
    tolerances: dict[str, float] = field(default_factory=lambda: {"fp32": 1e-4, "fp16": 5e-2})
    # minimum cosine similarity of raw outputs per precision
    min_cosine: dict[str, float] = field(default_factory=lambda: {"fp32": 0.99999, "fp16": 0.999})


class Family:
    """Base class of a model family adapter. Subclasses set the class attributes and ``build``."""

    name: ClassVar[str]
    task: ClassVar[str]
    sizes: ClassVar[tuple[str, ...]]
    default_size: ClassVar[str]
    default_imgsz: ClassVar[int] = 640
    stride: ClassVar[int] = 32
    # checkpoint file names this family recognises, e.g. r"LibreYOLO9(?P<size>[tsmc])"
    filename_pattern: ClassVar[str]
    # what the reference checkpoints store next to the state dict for this family
    extra_meta: ClassVar[dict[str, Any]] = {}
    export: ClassVar[ExportContract] = ExportContract()
    SUPPORTS_CUDA_GRAPH: ClassVar[bool] = False

    # --- network ---------------------------------------------------------------------
    def build(self, size: str, nc: int) -> nn.Module:
        raise NotImplementedError(f"family {self.name!r} does not define build()")

    def export_outputs(self, outputs: Any) -> tuple[torch.Tensor, ...]:
        """The network's outputs reduced to the tensors named in ``export.output_names``."""
        return (outputs["predictions"],)

    def named_outputs(self, outputs: Any) -> dict[str, torch.Tensor]:
        """Network outputs as {output name: tensor}; what postprocessing consumes."""
        return dict(zip(self.export.output_names, self.export_outputs(outputs), strict=True))

    # --- pre/post ----------------------------------------------------------------------
    def letterbox(self, imgsz: int) -> Letterbox:
        return Letterbox(imgsz)

    def postprocess(self, outputs: dict[str, torch.Tensor], metas: list[LetterboxMeta], **kw: Any) -> list[dict]:
        raise NotImplementedError(f"family {self.name!r} does not define postprocess()")

    # --- names -------------------------------------------------------------------------
    def match_filename(self, stem: str) -> str | None:
        """The size encoded in a checkpoint file stem (``LibreYOLO9t`` -> ``t``), else None."""
        m = re.fullmatch(self.filename_pattern, stem, flags=re.IGNORECASE)
        return m.group("size").lower() if m else None

    def filename(self, size: str) -> str:
        """Canonical checkpoint stem for a size (the Hub repo/file name the reference uses)."""
        raise NotImplementedError
