"""Errors raised for user mistakes. The CLI prints them as one line, without a traceback."""
from __future__ import annotations


class LibreYOLOError(Exception):
    """Base class: something the user can fix (a path, an argument, a file)."""


class CheckpointError(LibreYOLOError, ValueError):
    """A file is not a usable checkpoint (unreadable, wrong format, unknown family, key mismatch)."""


class ImageError(LibreYOLOError, ValueError):
    """An input image cannot be read or has an unusable shape or type."""


class ArgumentError(LibreYOLOError, ValueError):
    """A predict/export argument has a wrong value."""


class DatasetError(LibreYOLOError, ValueError):
    """A training or validation dataset is unusable (data YAML, folders, or no readable images)."""


class ExportError(LibreYOLOError, RuntimeError):
    """An export could not produce a valid artifact (toolchain failure or failed validation)."""


class MissingDependencyError(LibreYOLOError, ImportError):
    """An optional package is needed; the message names the extra to install."""


def require(module: str, extra: str, purpose: str):
    """Import an optional module or raise a message naming the extra that provides it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"{purpose} needs the optional package '{module.split('.')[0]}', which is not installed: "
            f"pip install 'libreyolo[{extra}]'"
        ) from exc


class TrainingDiverged(LibreYOLOError, RuntimeError):
    """A training run went non-finite (loss or weights); it stopped without writing a checkpoint of it."""

    exit_code = 1  # a failure of the work, not a user mistake
