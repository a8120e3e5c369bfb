"""What an exporter declares, and the registry the driver picks it from.

An exporter turns the traced :class:`~libreyolo.export.module.ExportModule` into one artifact
file (or package folder) and stores metadata in it. Its capabilities come from its row of the
format table (:mod:`libreyolo.export.formats`), so the driver checks options once for every format.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from libreyolo.errors import ArgumentError, ExportError, LibreYOLOError  # noqa: F401 - ExportError: its old home
from libreyolo.export.formats import FORMATS, Format, get_format  # noqa: F401 - FORMATS: read from here too


class ValidationFailed(ExportError):
    """The artifact was built and run, and it does not match the eager model (CLI exit status 1:
    a failure of the work, not a user mistake)."""

    exit_code = 1


@dataclass
class ExportOptions:
    """Checked, normalised export options (see :func:`libreyolo.export.export`)."""

    format: str
    imgsz: int
    batch: int = 1
    dynamic: bool = False
    half: bool = False
    opset: int | None = None
    simplify: bool = False
    nms: dict[str, Any] | None = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    workspace: float | None = None
    validate: bool = True
    require_validation: bool = False
    dynamic_spatial: bool = False   # dynamic height/width too (contract and format allow it)
    device_explicit: bool = False   # the user named the device
    autotune: bool = False          # AOTInductor on CUDA: Inductor max_autotune (longer compile)
    int8: bool = False              # an INT8 artifact (libreyolo.export.int8)
    data: str | None = None         # int8: calibration and accuracy-gate dataset
    max_drop: float = 0.02          # int8: the accuracy gate's largest allowed metric drop
    calibration: Any = None         # int8: the Int8Plan (quantized eager model, calibration batches)
    format_options: dict[str, Any] = field(default_factory=dict)  # options of one format (Exporter.format_options)
    e2e: dict[str, Any] | None = None  # end-to-end: the input normalisation the graph applies (libreyolo.export.e2e)

    @property
    def precision(self) -> str:
        return "int8" if self.int8 else ("fp16" if self.half else "fp32")

    def as_metadata(self) -> dict[str, Any]:
        return {"imgsz": self.imgsz, "batch": self.batch, "dynamic": self.dynamic, "half": self.half,
                "opset": self.opset, "simplify": self.simplify, "nms": self.nms is not None,
                "device": str(self.device), "workspace": self.workspace, "validate": self.validate,
                **({"autotune": True} if self.autotune else {}),
                **({"int8": True, "max_drop": self.max_drop} if self.int8 else {}),
                **({"e2e": True} if self.e2e else {}), **self.format_options}


# Exporter attribute -> Format field: the capabilities an exporter exposes, filled from its row of
# the format table (libreyolo.export.formats) and declared nowhere else
_FROM_ROW = {"name": "name", "suffix": "suffix", "runtime": "runtime", "extra": "extra", "is_directory": "directory",
             "dynamic_shapes": "dynamic_batch", "batch_axis_dynamic": "batch_axis_dynamic",
             "dynamic_spatial": "dynamic_spatial", "half": "half", "embedded_nms": "embedded_nms",
             "int8_mode": "int8", "format_options": "option_names", "benchmarked": "benchmarked",
             "max_tensor_rank": "max_tensor_rank", "rank_limit": "rank_limit", "e2e_input": "e2e_input",
             "selection_on_host": "selection_on_host"}


class Exporter:
    """Base class of one artifact format: ``class OnnxExporter(Exporter, format="onnx")``.

    What the format *is* (suffix, runtime, extra, capabilities, its own options) comes from its row of
    :data:`libreyolo.export.formats.FORMAT_TABLE` and is exposed as class attributes (``name``,
    ``suffix``, ``runtime``, ``extra``, ``is_directory``, ``dynamic_shapes``, ``batch_axis_dynamic``,
    ``dynamic_spatial``, ``half``, ``embedded_nms``, ``int8_mode``, ``format_options``, ``benchmarked``,
    ``max_tensor_rank``, ``rank_limit``, ``e2e_input``, ``selection_on_host``); the subclass says how to build,
    stamp and inspect it.
    """

    spec: ClassVar[Format]
    name: ClassVar[str]
    suffix: ClassVar[str]
    runtime: ClassVar[str]
    extra: ClassVar[str]
    is_directory: ClassVar[bool]
    dynamic_shapes: ClassVar[bool]
    batch_axis_dynamic: ClassVar[bool]
    dynamic_spatial: ClassVar[bool]
    half: ClassVar[str]
    embedded_nms: ClassVar[bool]
    e2e_input: ClassVar[bool]
    int8_mode: ClassVar[str]
    format_options: ClassVar[tuple[str, ...]]
    benchmarked: ClassVar[bool]
    max_tensor_rank: ClassVar[int | None]
    rank_limit: ClassVar[str]
    selection_on_host: ClassVar[bool]
    toolchain: ClassVar[tuple[str, ...]] = ()  # packages whose versions go into the metadata

    def __init_subclass__(cls, format: str | None = None, **kwargs: Any) -> None:  # noqa: A002
        super().__init_subclass__(**kwargs)
        if format is None:
            return
        redeclared = sorted(set(_FROM_ROW) & set(vars(cls)))
        if redeclared:
            raise TypeError(f"{cls.__name__} declares {', '.join(redeclared)}: a format's capabilities are declared "
                            f"once, in its row of libreyolo/export/formats.py ({format!r}); change them there")
        row = get_format(format)
        cls.spec = row
        for attr, field_name in _FROM_ROW.items():
            setattr(cls, attr, getattr(row, field_name))

    def check(self, opts: ExportOptions) -> None:
        """Format-specific argument checks, before anything is built."""

    def check_family(self, family: Any) -> None:
        """Refuse a family the format's converter cannot map (declared capabilities, before anything is built)."""
        rank = family.export.tensor_rank
        if self.max_tensor_rank is not None and rank > self.max_tensor_rank:
            raise ArgumentError(f"format={self.name} cannot convert family {family.name}: its network builds "
                                f"rank-{rank} tensors and {self.rank_limit}; export it to onnx or executorch instead")
        rows = family.export.query_rows()
        if self.selection_on_host and rows.selection is not None and rows.host_selection is None:
            raise ArgumentError(f"format={self.name} cannot convert family {family.name}: {self.name} has no top-k or "
                                "gather for its query selection and the family declares no split at it "
                                "(SetContract.host_selection); export it to onnx or openvino instead")

    def resolve_output(self, model: Any, output: Any, name: Any) -> Path:
        """Where the artifact goes (checked before anything is built); the default is one file or
        package named by the format's suffix (:func:`default_output`)."""
        return default_output(model, self, output, name)

    def work_parent(self, final: Path) -> Path:
        """The folder that holds the hidden build folder: on the file system of ``final``, so the
        finished artifact is renamed into place."""
        return final.parent

    def report_notes(self, final: Path, opts: ExportOptions) -> list[str]:
        """Lines the export report adds about this format (what was and was not checked here)."""
        return []

    def build(self, module: torch.nn.Module, example: torch.Tensor, path: Path, opts: ExportOptions,
              work: Path) -> None:
        """Write the artifact to ``path`` (``work`` is a scratch folder removed afterwards)."""
        raise NotImplementedError

    def write_metadata(self, path: Path, encoded: dict[str, str], meta: dict[str, Any]) -> None:
        raise NotImplementedError

    def content_sha256(self, path: Path) -> str:
        """Hash of the model bytes, unchanged by :meth:`write_metadata` (checked by the runtime on load)."""
        from libreyolo.export.metadata import sha256_file

        return sha256_file(path)

    def companions(self, path: Path) -> list[Path]:
        """Files that travel with the artifact (sidecar metadata), installed before it."""
        return []

    def not_validated_reason(self, opts: ExportOptions) -> str | None:
        """Why the artifact cannot be run on this machine, or None when it can."""
        return None

    def int8_metadata(self, path: Path, opts: ExportOptions) -> dict[str, Any]:
        """What this format did for ``int8=True``, merged into the artifact's ``quantization``
        metadata over the calibration's description (``own`` formats say how they quantized)."""
        return {}

    def runtime_config(self, opts: ExportOptions) -> dict[str, Any] | None:
        """Settings the runtime must apply to run the artifact as it was validated (recorded in the
        metadata as ``runtime_config`` and enforced by the runtime), or None."""
        return None

    def after_validation(self, path: Path, opts: ExportOptions, report: Any) -> None:
        """Format-specific findings added to a validation that ran (``report.notes``/``report.findings``),
        e.g. what the runtime's defaults would change."""

    def graph_ops(self, path: Path) -> set[str]:
        """Operator names in the artifact's program (portability checks)."""
        raise NotImplementedError


def default_output(model: Any, exporter: Exporter, output: Any, name: Any) -> Path:
    """Where the artifact goes: ``output`` if given, else next to the checkpoint, else the CWD."""
    if output is not None and name is not None:
        raise ArgumentError("pass either output (a path) or name (a file name), not both")
    stem = (Path(model.source).stem if getattr(model, "source", None)
            else f"{model.family.name}{model.size}")
    folder = Path(model.source).parent if getattr(model, "source", None) else Path(".")
    if name is not None:
        name = Path(str(name))
        if name.name != str(name):
            raise ArgumentError(f"name must be a file name without folders, got {str(name)!r}; use output= for a path")
        path = folder / (name.name if name.name.lower().endswith(exporter.suffix) else name.name + exporter.suffix)
    elif output is not None:
        path = Path(output)
        if path.is_dir() and not path.name.lower().endswith(exporter.suffix):
            path = path / (stem + exporter.suffix)
    else:
        path = folder / (stem + exporter.suffix)
    if not path.name.lower().endswith(exporter.suffix):  # a file suffix, or a folder's ending (_ncnn_model)
        raise ArgumentError(f"output {str(path)!r} must end in {exporter.suffix} for format={exporter.name} "
                            "(runtimes are chosen by the file suffix)")
    # what is in the way is found now, not after the export has run
    for target in (path, *exporter.companions(path)):
        wants_folder = exporter.is_directory and target == path
        if target.is_symlink() or (target.exists() and target.is_dir() != wants_folder):
            kind = "a link" if target.is_symlink() else ("a folder" if target.is_dir() else "not a folder")
            raise ArgumentError(f"cannot write {target}: it already exists and is {kind}; the {exporter.name} "
                                f"artifact needs {'a folder' if wants_folder else 'a file'} there. Remove it or "
                                "choose another output")
    parent = path.parent
    if not parent.is_dir():
        raise ArgumentError(f"cannot write {path}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise ArgumentError(f"cannot write {path}: the folder {parent} is not writable")
    return path


def get_exporter(fmt: Any) -> Exporter:
    """The exporter of a format name, alias or suffix (:data:`~libreyolo.export.formats.FORMATS`)."""
    module = importlib.import_module(f"libreyolo.export.{get_format(fmt).exporter}")
    return module.EXPORTER
