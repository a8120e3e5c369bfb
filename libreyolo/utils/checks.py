"""Checks of values that come from users and from files, written once and used everywhere.

``resolve_device`` is the one gate for ``device=`` (``LibreYOLO()``, ``predict()``,
``export()``, artifact runtimes and the CLI); ``parse_bool`` the one for flags given as
strings; the ``check_*`` functions bound what a checkpoint or an artifact's metadata may
declare, so that a hostile or damaged file gets a clear error before anything is allocated.
Each takes the error class to raise, so a file field raises :class:`CheckpointError` and a
call argument :class:`ArgumentError`.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from libreyolo.errors import ArgumentError, LibreYOLOError

MAX_CLASSES = 100_000  # classes a model may declare (the head and the names dict grow with it)
MAX_IMGSZ = 8192       # network input side, in pixels
MAX_BATCH = 1024       # images in one exported input
DEVICE_CHOICES = "cpu, cuda, cuda:N (N a GPU index) or mps"
TRUE_STRINGS, FALSE_STRINGS = ("true", "1"), ("false", "0")


def _is_int(value: Any) -> bool:
    import numbers

    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def parse_bool(name: str, value: Any, error: type[LibreYOLOError] = ArgumentError) -> bool:
    """``True``/``False``, or the strings ``true``/``false``/``1``/``0`` (any case); nothing else.

    A non-empty string such as ``"false"`` is truthy in Python; taking it as ``True`` silently
    does the opposite of what was asked, so every other value is an error.
    """
    if isinstance(value, bool):
        return value
    try:
        import numpy as np

        if isinstance(value, np.bool_):
            return bool(value)
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    if isinstance(value, str):
        text = value.strip().lower()
        if text in TRUE_STRINGS:
            return True
        if text in FALSE_STRINGS:
            return False
    raise error(f"{name} must be true or false (True/False or the strings 'true'/'false'/'1'/'0'), got {value!r}")


def resolve_device(value: Any, name: str = "device"):
    """A ``torch.device`` this machine can run on, or None for "the default".

    Accepts a ``torch.device``, ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"`` or a GPU index
    (``0`` or ``"0"`` meaning ``cuda:0``). Refuses pseudo devices such as ``"meta"`` (which
    has no storage: moving weights there destroys them), unknown names, and CUDA or MPS when
    they are not available, with an :class:`ArgumentError` that lists the valid values.
    """
    if value is None:
        return None
    import torch

    if _is_int(value) or (isinstance(value, str) and value.strip().isdigit()):
        value = f"cuda:{int(value)}"
    if isinstance(value, torch.device):
        dev = value
    elif isinstance(value, str):
        try:
            dev = torch.device(value.strip().lower())
        except (RuntimeError, ValueError):
            raise ArgumentError(f"{name} {value!r} is not a device; use {DEVICE_CHOICES}") from None
    else:
        raise ArgumentError(f"{name} must be a string such as 'cpu' or 'cuda:0', got {type(value).__name__} "
                            f"{value!r}; use {DEVICE_CHOICES}")
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ArgumentError(f"{name} {str(dev)!r} requested but CUDA is not available on this machine; "
                                "use device='cpu'")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ArgumentError(f"{name} {str(dev)!r} does not exist: this machine has {count} CUDA device(s) "
                                f"(cuda:0..cuda:{count - 1})")
        return dev
    if dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ArgumentError(f"{name} 'mps' requested but Apple MPS is not available on this machine; "
                                "use device='cpu'")
        return dev
    raise ArgumentError(f"{name} {str(dev)!r} cannot run a model; use {DEVICE_CHOICES}")


def _at(where: str) -> str:
    return f"{where}: " if where else ""


def check_nc(value: Any, where: str, error: type[LibreYOLOError]) -> int:
    """The number of classes: an integer from 1 to :data:`MAX_CLASSES`."""
    if not _is_int(value) or not 1 <= int(value) <= MAX_CLASSES:
        raise error(f"{_at(where)}'nc' (number of classes) must be an integer from 1 to {MAX_CLASSES}, got {value!r}")
    return int(value)


def check_names(value: Any, nc: int, where: str, error: type[LibreYOLOError]) -> dict[int, str]:
    """Class names as ``{0: str, ..., nc - 1: str}``, from a dict (int or digit-string keys) or a list."""
    if isinstance(value, (list, tuple)):
        items = list(enumerate(value))
    elif isinstance(value, Mapping):
        items = list(value.items())
    else:
        raise error(f"{_at(where)}'names' must be a dict {{class id: name}} or a list of names, "
                    f"got {type(value).__name__}")
    if len(items) != nc:
        raise error(f"{_at(where)}'names' has {len(items)} entries but 'nc' is {nc}; they must agree "
                    "(one name per class)")
    out: dict[int, str] = {}
    for key, name in items:
        idx = int(key) if _is_int(key) or (isinstance(key, str) and key.strip().isdigit()) else None
        if idx is None or not 0 <= idx < nc:
            raise error(f"{_at(where)}'names' keys must be the class ids 0..{nc - 1}, got {key!r}")
        if not isinstance(name, str):
            raise error(f"{_at(where)}class names must be strings, got {type(name).__name__} {name!r} for class {idx}")
        out[idx] = name
    if len(out) != nc:
        raise error(f"{_at(where)}'names' repeats class ids; expected each of 0..{nc - 1} once")
    return dict(sorted(out.items()))


def check_imgsz(value: Any, stride: int, where: str, error: type[LibreYOLOError], name: str = "imgsz") -> int:
    """A square input size: a multiple of ``stride`` from ``stride`` to :data:`MAX_IMGSZ`."""
    if not _is_int(value) or not stride <= int(value) <= MAX_IMGSZ or int(value) % stride:
        raise error(f"{_at(where)}'{name}' must be a multiple of the stride {stride} from {stride} to {MAX_IMGSZ} "
                    f"(e.g. 640), got {value!r}")
    return int(value)


def check_stride_imgsz(value: Any, stride: int) -> int:
    """The input size a predict call or a family runs at: a multiple of ``stride`` up to
    :data:`MAX_IMGSZ` (``[n, n]`` is ``n``); an ArgumentError saying what is allowed."""
    if isinstance(value, (list, tuple)) and len(value) == 2 and value[0] == value[1]:
        value = value[0]
    if (isinstance(value, bool) or not isinstance(value, int) or value < stride or value % stride
            or value > MAX_IMGSZ):
        raise ArgumentError(
            f"imgsz must be a positive multiple of the model stride {stride} up to {MAX_IMGSZ} (e.g. 320, 640), "
            f"got {value!r}"
        )
    return value


def check_batch(value: Any, where: str, error: type[LibreYOLOError], name: str = "batch") -> int:
    if not _is_int(value) or not 1 <= int(value) <= MAX_BATCH:
        raise error(f"{_at(where)}{name} must be a positive integer up to {MAX_BATCH}, got {value!r}")
    return int(value)


def check_str(value: Any, field: str, where: str, error: type[LibreYOLOError]) -> str:
    if not isinstance(value, str) or not value or len(value) > 200:
        raise error(f"{_at(where)}'{field}' must be a short non-empty string, got {type(value).__name__} {value!r:.60}")
    return value


# --- tensors and JSON from files: checked by what they hold, never by what they declare ---------
def _tensor_dtypes():
    import torch

    floats = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
    ints = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
    return floats, ints


def tensor_problem(t: Any) -> str | None:
    """Why a tensor read from a file cannot be a weight (None when it can).

    Allowed: dense (strided) CPU tensors of the real floating types we run (float32, float16,
    bfloat16, float64) and integer/bool buffers. Meta, sparse, quantized, complex and float8
    tensors are refused by name, before anything reads their values.
    """
    import torch

    if t.is_meta or t.device.type == "meta":
        return "a meta tensor (no data)"
    if t.layout != torch.strided:
        return f"a {str(t.layout).replace('torch.', '')} tensor (only dense tensors are weights)"
    floats, ints = _tensor_dtypes()
    if t.dtype not in floats and t.dtype not in ints:
        return f"dtype {str(t.dtype).replace('torch.', '')} (supported: float32, float16, bfloat16, float64)"
    return None


def _finite(t: Any) -> bool:
    """Whether every value a tensor can show is finite, reading its storage, not its declared shape:
    a zero-stride ``expand`` of a tiny storage to 10**14 elements costs what the storage holds."""
    import torch

    size = t.untyped_storage().nbytes() // max(1, t.element_size())
    if t.numel() <= size:
        return bool(torch.isfinite(t).all())
    flat = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (size,), (1,))
    return bool(torch.isfinite(flat).all())


def nonfinite_keys(state: Mapping[str, Any], limit: int = 5) -> tuple[list[str], int]:
    """The first ``limit`` floating-point entries holding NaN or Inf, and how many there are.

    Tensors that :func:`tensor_problem` refuses are skipped here (they are refused by name
    elsewhere); the check reads storage, so its cost is bounded by the file's size.
    """
    import torch

    bad: list[str] = []
    count = 0
    for key, t in state.items():
        if (isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() and tensor_problem(t) is None
                and not _finite(t)):
            count += 1
            if len(bad) < limit:
                bad.append(key)
    return bad, count


MAX_JSON_BYTES = 16 << 20  # metadata entries and sidecar files
MAX_JSON_DEPTH = 32
_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]')


def load_json(text: Any, where: str, error: type[LibreYOLOError], *, max_bytes: int = MAX_JSON_BYTES,
              max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` that cannot be made to recurse or to read without bound: the size and the
    nesting depth are measured first (one pass, no recursion)."""
    import json

    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise error(f"{where} is not UTF-8 text, so not JSON") from None
    if not isinstance(text, str):
        raise error(f"{where} is not JSON text but {type(text).__name__}")
    if len(text) > max_bytes:
        raise error(f"{where} holds {len(text):,} characters of JSON, over the limit of {max_bytes:,}")
    depth = 0
    for token in _JSON_TOKENS.finditer(text):  # strings as whole tokens, so brackets inside them do not count
        ch = token.group()
        if ch in "[{":
            depth += 1
            if depth > max_depth:
                raise error(f"{where} is JSON nested more than {max_depth} levels deep; not LibreYOLO metadata")
        elif ch in "]}":
            depth -= 1
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise error(f"{where} is not valid JSON: {text[:60]!r}") from None


def free_memory(device: Any) -> int | None:
    """Bytes a new allocation can take on ``device`` now (CUDA: free plus PyTorch's cached blocks;
    CPU: the kernel's MemAvailable), or None where it cannot be known."""
    if device.type == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    if device.type == "cpu":
        try:
            with open("/proc/meminfo", encoding="ascii") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None


def check_forward_memory(need: int, device: Any, shape: tuple[int, ...], hint: str) -> None:
    """Refuse a forward estimated to need more memory than ``device`` has free, in one line,
    before it runs (instead of a traceback, an OOM kill or swapping for minutes)."""
    free = free_memory(device)
    if free is not None and need > free:
        raise ArgumentError(f"a forward of a {'x'.join(map(str, shape))} batch needs about {need / 2**30:.1f} GiB "
                            f"(estimated), more than the {free / 2**30:.1f} GiB free on {device}; {hint}")
