"""What a task is: the one place that owns everything task-specific.

A :class:`Task` subclass in ``libreyolo/tasks/<task>.py`` declares, once:

- its ``Results`` payload (:attr:`Task.payload`, the attribute name users know: ``boxes``,
  ``probs``, ``semantic_mask``) and how a family's postprocess dict becomes one
  (:meth:`Task.make_payload`) and back (:meth:`Task.decoded`);
- its predict options (:attr:`Task.options`, :class:`~libreyolo.options.Opt` declarations)
  and their check against the model (:meth:`Task.check_options`); ``predict()``, ``val``, the
  CLI and export validation all read the same table, and one :class:`TaskOptions` travels
  from ``predict()`` to the family's postprocessing;
- how export validation compares decoded outputs (:attr:`Task.decoded_match`), what decoded
  outputs the validator compares at (:meth:`Task.validation_options`);
- datasets, collate, metrics and the headline metric for training and ``val``
  (:meth:`Task.load_data`, :meth:`Task.train_dataset`, :meth:`Task.val_dataset`,
  :meth:`Task.metrics`, :meth:`Task.score_batch`, :attr:`Task.metric`), and its synthetic
  data for tests (:meth:`Task.synthetic_dataset`);
- whether ``nc``/``names`` apply (:attr:`Task.has_classes`; else the fixed :attr:`Task.fixed_names`
  every model of the task carries), and whether it can be trained (:attr:`Task.training_unavailable`).

The predictor, the graphs, export, the runtimes, the trainer and the CLI call the task of the
model's family (``family.task`` names it; :func:`libreyolo.tasks.get_task` returns it); none of
them branches on a task name. docs/tasks.md walks through adding one.
"""
from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from libreyolo.errors import ArgumentError, LibreYOLOError
from libreyolo.options import Opt
from libreyolo.tasks.registry import all_task_options

if TYPE_CHECKING:  # torch loads on first use, so the CLI reads its options without it
    import torch

PROBE_IMAGES = 16  # images Task.claims_data looks at to recognise a dataset's layout


class TaskOptions(Mapping):
    """The checked predict options of one call, read by attribute (``opts.conf``) or as a mapping
    (``**opts``). Immutable; :meth:`replace` gives a changed copy."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any] | None = None, **more: Any) -> None:
        object.__setattr__(self, "_values", {**(values or {}), **more})

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"no predict option {name!r} for this task (it has: "
                                 f"{', '.join(self._values) or 'none'})") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("TaskOptions are immutable; use replace()")

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def get(self, key: str, default: Any = None) -> Any:
        return self._values.get(key, default)

    def replace(self, **changes: Any) -> TaskOptions:
        return TaskOptions({**self._values, **changes})

    def __repr__(self) -> str:
        return f"TaskOptions({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"


def resolve(spec: str) -> Any:
    """The object a ``"package.module:attribute"`` string names."""
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


class Task:
    """Base of a task plugin. Subclasses set the class attributes and override what differs."""

    name: ClassVar[str]
    # the Results attribute this task fills, and the payload class (libreyolo.results)
    payload: ClassVar[str]
    # class names and a class count apply to this task's models (False: e.g. image restoration)
    has_classes: ClassVar[bool] = True
    # the names (and so nc) every model of a task without classes carries, e.g. {0: "image"}
    fixed_names: ClassVar[dict[int, str]] = {}
    # why models of this task cannot be trained, in one sentence; None: they can (where the family
    # declares a loss). train() and ``libreyolo train`` stop with it before reading any argument
    training_unavailable: ClassVar[str | None] = None
    # why INT8 artifacts (export int8=True) are not offered for this task's models, in one clause; None:
    # they are (the export's accuracy gate then judges each one)
    int8_unavailable: ClassVar[str | None] = None
    # whether track() can follow this task's predictions across frames (libreyolo.track: it follows
    # Results.boxes, so only tasks whose payload is boxes); the others say so in one line
    trackable: ClassVar[bool] = False
    # predict options this task takes, declared once (predict(), the CLI and val read this table)
    options: ClassVar[dict[str, Opt]] = {}
    # val options beyond data/imgsz/batch/workers/device, and their val defaults
    val_options: ClassVar[dict[str, Opt]] = {}
    # the headline validation metric (benchmark tables, best-checkpoint fitness, CLI summary)
    metric: ClassVar[str] = ""
    # "module:attr" of the decoded-output matcher of export validation (libreyolo.comparison.matching)
    decoded_match: ClassVar[str] = ""
    # what data= is for this task, in words (error messages, --help)
    data_help: ClassVar[str] = ""
    # what the predictions are called in logs ("detections", "classes", "segmentation")
    what: ClassVar[str] = "predictions"

    # --- predict ---------------------------------------------------------------------------
    def predict_options(self, given: Mapping[str, Any]) -> TaskOptions:
        """The checked options of one predict call: every option of this task (its default where
        not given). Options another task declares are accepted (checked, then ignored), so one
        command line serves every model; anything else is an error naming what is valid."""
        known = all_task_options()
        unknown = sorted(k for k in given if k not in known)
        if unknown:
            raise ArgumentError(f"unknown predict option(s) {', '.join(map(repr, unknown))}; valid for {self.name}: "
                                f"{', '.join(self.options) or 'none beyond the common ones'}")
        out = {}
        for name, value in given.items():
            checked = known[name].check(name, value)
            if name in self.options:
                out[name] = checked
        for name, opt in self.options.items():
            out.setdefault(name, opt.check(name, opt.default) if opt.default is not None else None)
        return TaskOptions(out)

    def check_options(self, opts: TaskOptions, *, nc: int) -> None:
        """Checks of the options against the model (e.g. class ids within ``nc``)."""
        classes = opts.get("classes")
        if classes is not None:
            bad = [c for c in classes if not 0 <= c < nc]
            if bad:
                raise ArgumentError(f"classes must be class ids in 0..{nc - 1}, got {bad}")

    def make_payload(self, pred: dict[str, torch.Tensor], orig_shape: tuple[int, int]) -> Any:
        """The Results payload of one image from what the family's postprocess returned for it."""
        raise NotImplementedError

    def decoded(self, payload: Any) -> dict[str, torch.Tensor]:
        """The inverse of :meth:`make_payload`: the postprocess dict a payload was built from."""
        raise NotImplementedError

    # --- export validation -------------------------------------------------------------------
    def matcher(self) -> Any:
        return resolve(self.decoded_match)

    def export_validation_options(self, embedded: dict[str, Any] | None) -> TaskOptions:
        """The options an artifact's decoded outputs are compared at, before :meth:`validation_options`
        adapts them to the model (``embedded``: the artifact's embedded NMS settings, or None)."""
        return self.predict_options({})

    def validation_options(self, model: Any, sample: torch.Tensor, metas: list, opts: Any) -> TaskOptions:
        """The options decoded outputs are compared at during export validation."""
        return self.predict_options({})

    def validation_note(self, opts: Any) -> str | None:
        """A line for the validation report about the options :meth:`validation_options` chose, or None."""
        return None

    def match_options(self, opts: Any) -> dict[str, Any]:
        """Keyword arguments of this task's decoded-output matcher (:attr:`decoded_match`) from the
        validation options ``opts``."""
        return {}

    # --- training and val --------------------------------------------------------------------
    def require_trainable(self) -> None:
        """Raise :class:`ArgumentError` with :attr:`training_unavailable` if this task cannot be trained."""
        if self.training_unavailable:
            raise ArgumentError(self.training_unavailable)

    def class_defaults(self, nc: int | None, names: Any) -> tuple[int | None, Any]:
        """(nc, names) of a new model: the given ones, or :attr:`fixed_names` for a task without
        classes (where giving nc or names is an error: they do not apply)."""
        if self.has_classes:
            return nc, names
        if nc is not None or names is not None:
            raise ArgumentError(f"nc/names do not apply to {self.name} models (they have no classes; every one "
                                f"carries nc={len(self.fixed_names)}, names={self.fixed_names}); leave them out")
        return len(self.fixed_names), dict(self.fixed_names)

    def check_data_arg(self, data: Any) -> None:
        if not isinstance(data, (str, bytes)) and not hasattr(data, "__fspath__"):
            raise ArgumentError(f"data must be {self.data_help}, got {data!r}")

    def claims_data(self, data: Any) -> str | None:
        """If ``data`` is laid out as this task's dataset, a few words saying how (``"its images
        have masks under masks/"``), else None. Cheap (a few files looked at) and never raises:
        :func:`libreyolo.tasks.check_data_task` asks every task, so data of another task is an
        error naming both instead of a metric of 0."""
        return None

    def load_data(self, data: Any) -> Any:
        """The dataset description of ``data`` (a :class:`~libreyolo.train.data.DataConfig`)."""
        raise LibreYOLOError(f"training and validation for task {self.name!r} are not available")

    def require_extras(self, *, validating: bool = True) -> None:
        """Optional packages training/val of this task needs, checked before any data is read."""

    def train_dataset(self, model: Any, cfg: Any, imgsz: int, args: Any) -> tuple[Any, Any]:
        """(augmenting training dataset, collate function)."""
        raise LibreYOLOError(f"training for task {self.name!r} is not available")

    def val_dataset(self, model: Any, cfg: Any, imgsz: int) -> tuple[Any, Any]:
        """(evaluation dataset of ``cfg``'s val split, collate function)."""
        raise LibreYOLOError(f"validation for task {self.name!r} is not available")

    def batch_targets(self, batch: Any) -> Any:
        """The training targets of a collated batch (what the family's loss takes)."""
        return batch[1]

    def loss_hyp(self, args: Any) -> dict[str, Any]:
        """Training hyperparameters this task's losses take (passed to the family's loss factory)."""
        return {}

    def metrics(self, model: Any) -> Any:
        """A fresh metrics accumulator: ``compute() -> {name: value}``."""
        raise NotImplementedError

    def score_batch(self, model: Any, metrics: Any, named: dict[str, torch.Tensor], batch: Any,
                    opts: TaskOptions) -> None:
        """Add one validation batch (network outputs ``named``) to ``metrics``."""
        raise NotImplementedError

    def fitness(self, metrics: Mapping[str, float]) -> float | None:
        """The number the best checkpoint is chosen by (default: the headline metric)."""
        value = metrics.get(self.metric)
        return None if value is None else float(value)

    def synthetic_batch(self, model: Any, batch: int, imgsz: int, generator: torch.Generator) -> Any:
        """Seeded training targets of ``batch`` images, for the training-graph benchmark and tests."""
        raise NotImplementedError

    def synthetic_dataset(self, root: str | Path, **kw: Any) -> Path:
        """Write this task's synthetic dataset under ``root``; returns what ``data=`` takes."""
        raise NotImplementedError(f"task {self.name!r} has no synthetic dataset")
