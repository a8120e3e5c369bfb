"""One declared schema per option, used by every entry point (Python API and CLI alike).

An :class:`Opt` says what an option is: its type (``int``, ``float``, ``str`` or a converter such
as :func:`as_bool`), its range, whether it must be finite, its choices, unit, default and help
text. :meth:`Opt.check` takes a value from Python (``predict(conf=0.3)``) or from the command line
(the string ``"0.3"``) and returns the typed value or raises :class:`ArgumentError` naming the
option, the value and what is allowed. The option tables live where the options belong
(``libreyolo.engine.options`` for predict and benchmark, ``libreyolo.train.options`` for train
and val, ``libreyolo.export.options`` for export); ``libreyolo.cli`` builds its parser and its
``--help`` from the same tables, so a value refused in one place is refused in all.

Resource bounds (docs/predict.md, "Limits") are part of the schema; :data:`MAX_INPUT_PIXELS` bounds one
forward's input tensor (``batch * imgsz**2`` pixels) to about 3 GiB of float32.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from libreyolo.errors import ArgumentError, LibreYOLOError
from libreyolo.utils.checks import MAX_BATCH, MAX_IMGSZ, parse_bool

MAX_DET = 10_000          # detections kept per image
MAX_NMS = 100_000         # candidates per image entering NMS
MAX_WORKERS = 64          # DataLoader worker processes
MAX_EPOCHS = 100_000
MAX_BENCH_N = 100_000     # timed calls per benchmark mode
MAX_INPUT_PIXELS = 1 << 28  # batch * imgsz**2 of one forward: 3 x 4 bytes each, ~3 GiB of float32 input
MAX_STR = 4096            # characters in a path or name option
NETWORK_TIMEOUT_S = 5.0   # opening and reading a live stream: longer is an error, not a hang (stream_timeout)


@dataclass(frozen=True)
class Opt:
    """One option: ``Opt(int, 1, "images per batch", min=1, max=MAX_BATCH)``.

    ``type`` is ``int``, ``float``, ``str`` or a converter ``f(name, value) -> value`` that
    accepts both strings and Python values (:func:`as_bool`, :func:`as_device`, ...). ``min`` /
    ``max`` bound numbers (``min_open``: the lower bound itself is refused); floats must be finite
    unless ``finite=False``. ``flag_value`` is what a bare ``--flag`` means on the command line.
    ``none_ok`` lets ``None`` through (default: when the default is None).
    """

    type: Callable[..., Any]
    default: Any
    help: str
    flag_value: Any = None
    min: float | None = None
    max: float | None = None
    min_open: bool = False
    finite: bool = True
    choices: tuple[str, ...] = ()
    unit: str = ""
    none_ok: bool | None = None
    pair_ok: bool = False  # an int option that also takes a pair of equal values ((640, 640) for imgsz)

    # --- what it allows, in words ---------------------------------------------------------
    def allowed(self) -> str:
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.type is int or self.type is float:
            what = "an integer" if self.type is int else "a number"
            lo = None if self.min is None else _fmt(self.min)
            hi = None if self.max is None else _fmt(self.max)
            if lo is not None and hi is not None:
                what += f" in ({lo}, {hi}]" if self.min_open else f" from {lo} to {hi}"
            elif lo is not None:
                what += f" {'>' if self.min_open else '>='} {lo}"
            elif hi is not None:
                what += f" <= {hi}"
            return what + (f" ({self.unit})" if self.unit else "")
        if self.type is str:
            return "a non-empty text"
        return getattr(self.type, "allowed", "a valid value")

    # --- checking -------------------------------------------------------------------------
    def check(self, name: str, value: Any) -> Any:
        """The typed value of option ``name``, from a Python value or a command-line string."""
        if value is None:
            if self.none_ok or (self.none_ok is None and self.default is None):
                return None
            raise ArgumentError(f"{name} must be {self.allowed()}, got None")
        if self.type is int:
            value = self._int(name, value)
        elif self.type is float:
            value = self._float(name, value)
        elif self.type is str:
            value = self._str(name, value)
        else:
            try:
                value = self.type(name, value)
            except LibreYOLOError:
                raise
            except (TypeError, ValueError, OverflowError):
                raise ArgumentError(f"{name} must be {self.allowed()}, got {show_value(value)}") from None
        return value

    def _bad(self, name: str, value: Any) -> ArgumentError:
        return ArgumentError(f"{name} must be {self.allowed()}, got {show_value(value)}")

    def _range(self, name: str, value: float, shown: Any) -> None:
        if self.min is not None and (value < self.min or (self.min_open and value == self.min)):
            raise self._bad(name, shown)
        if self.max is not None and value > self.max:
            raise self._bad(name, shown)

    def _int(self, name: str, value: Any) -> int:
        shown = value
        if self.pair_ok and isinstance(value, (list, tuple)) and len(value) == 2 and value[0] == value[1]:
            value = value[0]
        if isinstance(value, str):
            text = value.strip()
            if not text or len(text) > 32:
                raise self._bad(name, shown)
            try:
                value = int(text)
            except ValueError:
                raise self._bad(name, shown) from None
        elif isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise self._bad(name, shown)
        value = int(value)
        self._range(name, value, shown)
        return value

    def _float(self, name: str, value: Any) -> float:
        shown = value
        if isinstance(value, str):
            text = value.strip()
            if not text or len(text) > 64:
                raise self._bad(name, shown)
            try:
                value = float(text)
            except ValueError:
                raise self._bad(name, shown) from None
        elif isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise self._bad(name, shown)
        try:
            value = float(value)
        except OverflowError:
            raise self._bad(name, shown) from None
        if self.finite and not math.isfinite(value):
            raise ArgumentError(f"{name} must be a finite number ({self.allowed()}), got {show_value(shown)}")
        self._range(name, value, shown)
        return value

    def _str(self, name: str, value: Any) -> str:
        if not isinstance(value, str) and not hasattr(value, "__fspath__"):
            raise ArgumentError(f"{name} must be a text, got {type(value).__name__} {show_value(value)}")
        text = str(value.__fspath__() if hasattr(value, "__fspath__") else value)
        if not text or len(text) > MAX_STR or "\x00" in text:
            raise ArgumentError(f"{name} must be a non-empty text of at most {MAX_STR} characters without NUL, "
                                f"got {show_value(text)}")
        if self.choices:
            low = {c.lower(): c for c in self.choices}
            if text.lower() not in low:
                raise self._bad(name, text)
            return low[text.lower()]
        return text


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def show_value(value: Any) -> str:
    """``repr(value)`` cut to 60 characters, for error messages."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --- converters for the types that are not plain numbers or text ---------------------------------
def option_converter(allowed: str):
    """Mark ``fn(name, value) -> value`` as an :class:`Opt` type; ``allowed`` is what its errors and ``--help`` say."""
    def wrap(fn: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
        fn.allowed = allowed  # type: ignore[attr-defined]
        return fn

    return wrap


@option_converter("true or false (or 1/0)")
def as_bool(name: str, value: Any) -> bool:
    return parse_bool(name, value)


@option_converter("cpu, cuda, cuda:N or mps")
def as_device(name: str, value: Any) -> Any:
    from libreyolo.utils.checks import resolve_device

    resolve_device(value, name)  # checked before any model is loaded
    return value.strip() if isinstance(value, str) else value


@option_converter("false, true or auto")
def as_graph_mode(name: str, value: Any) -> bool | str:
    if value == "auto":  # exactly: the Python API has always refused "AUTO"
        return "auto"
    try:
        return parse_bool(name, value)
    except ArgumentError:
        raise ArgumentError(f"{name} must be False, True or 'auto', got {show_value(value)}") from None


@option_converter("a file path in an existing, writable folder (not a folder itself)")
def as_output_file(name: str, value: Any) -> str:
    """A path a command will write a file to, checked before any work: not an existing folder,
    its folder existing and writable (the write itself is atomic: ``checkpoint.atomic_write``)."""
    import os
    from pathlib import Path

    text = Opt(str, None, "")._str(name, value)
    path = Path(text).expanduser()
    if path.is_dir():
        raise ArgumentError(f"{name}={text!r} is an existing folder; pass a file path such as {text.rstrip('/')}/"
                            "result.json")
    parent = path.absolute().parent
    if not parent.is_dir():
        raise ArgumentError(f"{name}: the folder {parent} of {text!r} does not exist; create it or pass another path")
    if not os.access(parent, os.W_OK):
        raise ArgumentError(f"{name}: the folder {parent} of {text!r} is not writable; pass another path")
    return text


# the torch.compile modes LibreYOLO(..., compile=<mode>) takes (libreyolo.engine.compiled)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@option_converter("false, true or a torch.compile mode: " + ", ".join(COMPILE_MODES))
def as_compile_mode(name: str, value: Any) -> bool | str:
    """``False`` (off), ``True`` (the device's mode: reduce-overhead on CUDA, default elsewhere) or
    one of :data:`COMPILE_MODES`, exactly as torch.compile spells it."""
    if isinstance(value, str) and value in COMPILE_MODES:
        return value
    try:
        return parse_bool(name, value)
    except ArgumentError:
        raise ArgumentError(f"{name} must be False, True or a torch.compile mode ({', '.join(COMPILE_MODES)}), "
                            f"got {show_value(value)}; compile=False runs the eager inference copy") from None


@option_converter("class ids such as 0,2,5")
def as_ids(name: str, value: Any) -> list[int]:
    """Non-negative class ids from ``"0,2"``, an int or a list (checked against the model later)."""
    if isinstance(value, str):
        parts = value.replace(",", " ").split()
        if not parts or len(parts) > 100_000:
            raise ArgumentError(f"{name} must be class ids like 0,2,5, got {show_value(value)}")
        try:
            items: Iterable[Any] = [int(p) for p in parts]
        except ValueError:
            raise ArgumentError(f"{name} must be class ids like 0,2,5, got {show_value(value)}") from None
    elif isinstance(value, numbers.Integral) and not isinstance(value, bool):
        items = [value]
    elif isinstance(value, (list, tuple, range, set, frozenset)) or (
            hasattr(value, "__iter__") and hasattr(value, "dtype")):  # numpy arrays and tensors of ids
        items = list(value.tolist() if hasattr(value, "tolist") else value)
        if len(items) > 100_000:
            raise ArgumentError(f"{name} must be at most 100000 class ids, got {len(items)}")
    else:
        raise ArgumentError(f"{name} must be class ids like [0, 2], got {type(value).__name__} {show_value(value)}")
    out = []
    for c in items:
        if isinstance(c, bool) or not isinstance(c, numbers.Integral) or c < 0:
            raise ArgumentError(f"{name} must be non-negative class ids, got {show_value(c)}")
        out.append(int(c))
    return out


# --- shared declarations ------------------------------------------------------------------------
def fraction(default: float, help: str) -> Opt:  # noqa: A002 - the field's name
    return Opt(float, default, help, min=0.0, max=1.0)


def imgsz_opt(help: str = "network input size (a multiple of the model stride; default from the model)"  # noqa: A002
              ) -> Opt:
    return Opt(int, None, help, min=1, max=MAX_IMGSZ, unit="pixels", pair_ok=True)


def batch_opt(default: int | None, help: str) -> Opt:  # noqa: A002
    return Opt(int, default, help, min=1, max=MAX_BATCH)


def check_all(table: Mapping[str, Opt], values: Mapping[str, Any], *, command: str = "") -> dict[str, Any]:
    """Every value of ``values`` checked against ``table`` (unknown keys are an error)."""
    unknown = sorted(k for k in values if k not in table)
    if unknown:
        where = f" for {command}" if command else ""
        raise ArgumentError(f"unknown option(s) {', '.join(map(repr, unknown))}{where}; valid: {', '.join(table)}")
    return {k: table[k].check(k, v) for k, v in values.items()}


def check_input_budget(batch: int, imgsz: int, *, explicit: bool) -> int:
    """The batch one forward may take at ``imgsz`` within :data:`MAX_INPUT_PIXELS`.

    An explicit ``batch`` over the budget is an error; a default one is lowered to fit.
    """
    fits = max(1, MAX_INPUT_PIXELS // (imgsz * imgsz))
    if batch <= fits:
        return batch
    if explicit:
        raise ArgumentError(f"batch={batch} at imgsz={imgsz} is {batch * imgsz * imgsz:,} input pixels, over the "
                            f"limit of {MAX_INPUT_PIXELS:,} (about 3 GiB of float32 input); use batch<={fits} "
                            "or a smaller imgsz")
    return fits
