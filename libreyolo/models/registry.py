"""Family registry: name -> adapter. Families register themselves when their folder is imported."""
from __future__ import annotations

import importlib
from typing import TypeVar

from libreyolo.errors import CheckpointError
from libreyolo.models.base import Family

_FAMILIES: dict[str, Family] = {}
# folders under libreyolo/models that hold a family; imported on first registry use
_BUILTIN = ("yolo9", "vit", "deit", "rtdetr", "swin", "yolox", "dfine", "segformer", "swinir")
_loaded = False

F = TypeVar("F", bound=type[Family])


def register_family(cls: F) -> F:
    """Class decorator: make a family available by ``cls.name``."""
    if cls.name in _FAMILIES and type(_FAMILIES[cls.name]) is not cls:
        raise ValueError(f"family {cls.name!r} is already registered by {type(_FAMILIES[cls.name]).__name__}")
    _FAMILIES[cls.name] = cls()
    return cls


def _load_builtins() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for mod in _BUILTIN:
            importlib.import_module(f"libreyolo.models.{mod}")


def families() -> dict[str, Family]:
    """All registered families by name."""
    _load_builtins()
    return dict(_FAMILIES)


def get_family(name: str) -> Family:
    _load_builtins()
    try:
        return _FAMILIES[name]
    except KeyError:
        raise CheckpointError(
            f"unknown model family {name!r}; known families: {', '.join(sorted(_FAMILIES))}"
        ) from None


def family_from_filename(stem: str) -> tuple[Family, str] | None:
    """(family, size) for a checkpoint stem such as ``LibreYOLO9t``, or None."""
    for fam in families().values():
        size = fam.match_filename(stem)
        if size is not None:
            return fam, size
    return None
