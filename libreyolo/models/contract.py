"""The export contract a family declares, split by kind of family.

:class:`ExportContract` holds what every kind has: the input (name, layout, colour, scale), the
outputs and their dynamic axes, how each output is judged (groups, cosine floors, the decoded
matcher), the class axes and the largest tensor rank. Each kind adds its own fields in a subclass,
and a family declares the one kind that fits it (its base class says which: ``Family.contract_kind``):

- :class:`DenseContract`: dense detectors (one ``predictions`` tensor of candidates): the embedded
  NMS fields ``nms_input``, ``nms_decoder``, ``nms_free``;
- :class:`SetContract`: set predictors (DETR queries): ``row_sets``, ``max_moved_rows``, ``selection``;
- :class:`PixelContract`: per-pixel class maps (semantic segmentation);
- :class:`ImageContract`: one output per image as a whole (class logits, a restored image).

A field of another kind is no field of the class: ``DenseContract(row_sets=...)`` raises TypeError.
Consumers (export, validation, comparison, runtimes) never read a kind's field by name from an
unknown contract: they ask the methods every contract answers (:meth:`ExportContract.nms_output`,
:meth:`~ExportContract.nms_refusal`, :meth:`~ExportContract.nms_decoder_path`,
:meth:`~ExportContract.query_rows`), which a kind without the feature answers with "none".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from libreyolo.utils.tolerance import OutputGroup


@dataclass(frozen=True)
class QueryRows:
    """The rows of a set prediction that export validation and compile checks compare jointly.

    ``outputs``: outputs whose axis 1 holds one row per query; rows that only traded places between
    eager and artifact (a near-tie in the top-k query selection decided by one ulp) are matched
    before comparing, at most ``max_moved`` per image. ``selection``: the submodule whose output's
    maximum over the last axis scores the candidates the query top-k keeps (None: no selection).
    Empty (the default) for every kind without query rows.
    """

    outputs: tuple[str, ...] = ()
    max_moved: int = 0
    selection: str | None = None
    # whether a query's whole row follows its selected candidate (RT-DETR, D-FINE: content and box
    # are gathered with the candidate, so a near-tie moves whole rows, which are put back in order);
    # False where each query's content is its own (LW-DETR, RF-DETR: learned per query, only the
    # reference box is gathered): a near-tie inside the selection then changes part of two rows,
    # which no reordering undoes, and rows at near-tied ranks are left out instead
    whole_rows: bool = True
    # "module:attribute" of the network cut at the selection (head program -> the selection on the host ->
    # tail program, e.g. libreyolo.models.rtdetr.split:SPLIT): formats without top-k/gather (NCNN,
    # Format.selection_on_host) export the two programs and run the eager model's own selection between
    # them; None with a selection: such formats refuse the family
    host_selection: str | None = None


@dataclass(frozen=True)
class ExportContract:
    """What an exported artifact of this family looks like, and how closely it must match eager:
    the fields every kind of family has. Families declare a kind (a subclass), not this class.

    The export driver, the validator and every runtime read only this; none branches on a
    family name.
    """

    kind: ClassVar[str] = ""  # "dense", "set", "pixel", "image" in the subclasses

    input_name: str = "images"
    input_layout: str = "NCHW"  # float32 RGB in [0, 1]
    input_color: str = "RGB"
    input_scale: float = 1.0 / 255.0  # network input = 8-bit pixel * input_scale (then mean/std, if any)
    # True: the network input is the 8-bit image times input_scale, so image-typed inputs
    # (CoreML ImageType) carry it exactly; False: a normalised float tensor (the preprocessor
    # applies a per-channel mean/std), fed to every format as a tensor
    image_input: bool = True
    output_names: tuple[str, ...] = ()
    # axes of each output that follow the input's dynamic axes: {output: {axis: name}}
    output_axes: dict[str, dict[int, str]] = field(default_factory=dict)
    dynamic_batch: bool = True
    dynamic_spatial: bool = False
    # how each output is judged by export validation: slices sharing a unit (box coordinates,
    # scores, logits, maps, images), each allowed a multiple of the eager model's own float32
    # error against float64 (libreyolo.utils.tolerance); an output no group names is judged
    # as one "logit" group
    groups: tuple[OutputGroup, ...] = ()
    # minimum cosine similarity of raw outputs per precision
    min_cosine: dict[str, float] = field(default_factory=lambda: {"fp32": 0.99999, "fp16": 0.999})
    # outputs whose size along one axis follows the number of classes: {output: (axis, offset)}
    # meaning shape[axis] == nc + offset; runtimes check an artifact's 'nc' against its graph
    class_axes: dict[str, tuple[int, int]] = field(default_factory=dict)
    # "module:attribute" of the function that compares decoded predictions (the dicts the
    # family's postprocess returns) of eager and artifact during validation; it returns a dict
    # with at least "passed" (see libreyolo.comparison.matching); None: the task's own matcher
    # (libreyolo.tasks: detect match_detections, classify match_classes, semantic match_masks)
    decoded_match: str | None = None
    # the largest rank (batch axis included) of a tensor the traced forward builds: 4 for
    # convolutional networks, 5 for attention that splits q/k/v along a new axis, 6 for window
    # attention and deformable sampling; a format whose tensors hold fewer axes
    # (Exporter.max_tensor_rank) refuses the family before anything is built (checked against the
    # trace in tests/test_export_ncnn.py)
    tensor_rank: int = 4

    def __post_init__(self) -> None:
        names = set(self.output_names)
        named = {"output_axes": set(self.output_axes), "class_axes": set(self.class_axes),
                 "groups": {g.output for g in self.groups}, **self._named_outputs()}
        for what, used in named.items():
            unknown = sorted(used - names)
            if unknown:
                raise ValueError(f"{type(self).__name__}: {what} names output(s) {unknown} that are not among "
                                 f"output_names {self.output_names}; name only declared outputs")

    def _named_outputs(self) -> dict[str, set[str]]:
        """Outputs a kind's own fields name (checked against ``output_names``)."""
        return {}

    def cosine_floor(self, fmt: str, precision: str, device: str = "cpu") -> float:
        """The minimum cosine for one format, precision and device type (most specific key wins);
        the validator lowers it where the eager model's own drift would not meet it."""
        for key in (f"{fmt}:{device}:{precision}", f"{fmt}:{precision}", precision):
            if key in self.min_cosine:
                return self.min_cosine[key]
        if precision == "int8":  # no INT8 bar of its own: the fp16 one (the validator lowers it to the
            return self.cosine_floor(fmt, "fp16", device)  # quantized eager model's own measured drift)
        raise KeyError(f"no cosine floor for {fmt} {precision} on {device}")

    # --- what one kind adds, asked of any contract (a kind without it answers "none") ---------------
    def nms_output(self) -> str | None:
        """The output an embedded NMS reads ((B, 4 + nc, N) xyxy boxes in input pixels followed by
        class scores), or None when the family cannot embed NMS."""
        return None

    def nms_refusal(self) -> str | None:
        """Why the family's decoding has no NMS at all (export refuses nms=True with it), or None."""
        return None

    def nms_decoder_path(self) -> str | None:
        """``module:attribute`` of the decoder of an artifact's embedded NMS outputs, or None."""
        return None

    def query_rows(self) -> QueryRows:
        """The set prediction's query rows (empty for every kind but set prediction)."""
        return QueryRows()


@dataclass(frozen=True)
class DenseContract(ExportContract):
    """Dense detectors: candidates along the last axis of a ``predictions`` tensor (B, 4 + nc,
    anchors) of xyxy boxes in input pixels followed by class scores (the default outputs and groups)."""

    kind: ClassVar[str] = "dense"

    output_names: tuple[str, ...] = ("predictions",)
    output_axes: dict[str, dict[int, str]] = field(
        default_factory=lambda: {"predictions": {0: "batch", 2: "anchors"}})
    groups: tuple[OutputGroup, ...] = (OutputGroup("predictions", "box", axis=1, start=0, stop=4),
                                       OutputGroup("predictions", "score", axis=1, start=4))
    # embedded NMS (export option nms=True): the output holding (B, 4 + nc, N) xyxy boxes in
    # input pixels followed by class scores, or None when the family cannot embed NMS; and the
    # "module:attribute" of the decoder that turns the NMS outputs into detections at predict time
    nms_input: str | None = None
    nms_decoder: str = "libreyolo.export.nms:EmbeddedNmsDecoder"
    # why the family's decoding has no NMS at all (e.g. a one-to-one head: one box per object), or
    # None; export refuses nms=True for such a family with this reason instead of "not supported"
    nms_free: str | None = None

    def _named_outputs(self) -> dict[str, set[str]]:
        return {"nms_input": {self.nms_input} - {None}}

    def nms_output(self) -> str | None:
        return self.nms_input

    def nms_refusal(self) -> str | None:
        return self.nms_free

    def nms_decoder_path(self) -> str | None:
        return self.nms_decoder


@dataclass(frozen=True)
class SetContract(ExportContract):
    """Set predictors (DETR line): one row per query in each of ``row_sets`` (see :class:`QueryRows`)."""

    kind: ClassVar[str] = "set"

    # outputs whose axis 1 holds one row per query: compared jointly, rows that traded places
    # between eager and artifact matched first, at most ``max_moved_rows`` per image
    row_sets: tuple[str, ...] = ()
    max_moved_rows: int = 0
    # the submodule whose output scores the candidates the query top-k keeps (DETR's encoder score
    # head; libreyolo.comparison.selection), or None
    selection: str | None = None
    # see QueryRows.whole_rows
    rows_follow_candidates: bool = True
    # see QueryRows.host_selection
    host_selection: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_moved_rows < 0:
            raise ValueError(f"SetContract: max_moved_rows must be >= 0, got {self.max_moved_rows}")

    def _named_outputs(self) -> dict[str, set[str]]:
        return {"row_sets": set(self.row_sets)}

    def query_rows(self) -> QueryRows:
        return QueryRows(self.row_sets, self.max_moved_rows, self.selection, self.rows_follow_candidates,
                         self.host_selection)


@dataclass(frozen=True)
class PixelContract(ExportContract):
    """Per-pixel predictions: a class map (B, nc, h, w) decoded into one label per pixel (semantic)."""

    kind: ClassVar[str] = "pixel"


@dataclass(frozen=True)
class ImageContract(ExportContract):
    """One output per image as a whole: class logits (classify) or a restored image (restore)."""

    kind: ClassVar[str] = "image"


KINDS: tuple[type[ExportContract], ...] = (DenseContract, SetContract, PixelContract, ImageContract)
