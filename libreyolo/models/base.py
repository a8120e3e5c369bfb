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
    """What an exported artifact of this family looks like, and how closely it must match eager.

    The export driver, the validator and every runtime read only this; none branches on a
    family name.
    """

    input_name: str = "images"
    input_layout: str = "NCHW"  # float32 RGB in [0, 1]
    input_color: str = "RGB"
    input_scale: float = 1.0 / 255.0  # network input = 8-bit pixel * input_scale (no mean/std)
    output_names: tuple[str, ...] = ("predictions",)
    # axes of each output that follow the input's dynamic axes: {output: {axis: name}}
    output_axes: dict[str, dict[int, str]] = field(
        default_factory=lambda: {"predictions": {0: "batch", 2: "anchors"}})
    dynamic_batch: bool = True
    dynamic_spatial: bool = False
    # max abs error on raw outputs allowed per precision, when validating an artifact; a key
    # "<format>:<precision>" (e.g. "executorch:fp32") overrides the precision's value for one format
    tolerances: dict[str, float] = field(default_factory=lambda: {"fp32": 1e-4, "fp16": 5e-2})
    # allowance relative to the reference value, added to the absolute one: outputs in pixels
    # (boxes up to ~1000 px) differ by one float32 ulp (6e-5 at 512, 1.2e-4 at 1024)
    rtol: dict[str, float] = field(default_factory=lambda: {"fp32": 1e-6, "fp16": 1e-2})
    # minimum cosine similarity of raw outputs per precision
    min_cosine: dict[str, float] = field(default_factory=lambda: {"fp32": 0.99999, "fp16": 0.999})
    # embedded NMS (export option nms=True): the output holding (B, 4 + nc, N) xyxy boxes in
    # input pixels followed by class scores, or None when the family cannot embed NMS; and the
    # "module:attribute" of the decoder that turns the NMS outputs into detections at predict time
    nms_input: str | None = None
    nms_decoder: str = "libreyolo.export.nms:EmbeddedNmsDecoder"

    def thresholds(self, fmt: str, precision: str) -> tuple[float, float, float]:
        """(atol, rtol, min cosine) for one format and precision."""
        def pick(table: dict[str, float]) -> float:
            return table.get(f"{fmt}:{precision}", table[precision])

        return pick(self.tolerances), pick(self.rtol), pick(self.min_cosine)


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
