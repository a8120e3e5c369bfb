"""Family registry: name -> adapter. Families register themselves when their folder is imported."""
from __future__ import annotations

from typing import TypeVar

from libreyolo.errors import CheckpointError
from libreyolo.models.base import Family
from libreyolo.utils.registry import Registry

# folders under libreyolo/models that hold a family; imported on first registry use
_BUILTIN = ("yolo9", "vit", "deit", "rtdetr", "swin", "yolox", "dfine", "segformer", "rtmdet", "swinir",
            "yolo9_e2e", "rtdetrv2", "deimv2", "rfdetr", "lwdetr", "deim", "rtdetrv4")
_REGISTRY: Registry[Family] = Registry("model family", "families", "libreyolo.models", _BUILTIN, CheckpointError)

F = TypeVar("F", bound=type[Family])


def register_family(cls: F) -> F:
    """Class decorator: make a family available by ``cls.name``."""
    return _REGISTRY.register(cls)


def families() -> dict[str, Family]:
    """All registered families by name."""
    return _REGISTRY.all()


def get_family(name: str) -> Family:
    return _REGISTRY.get(name)


def family_from_filename(stem: str) -> tuple[Family, str] | None:
    """(family, size) for a checkpoint stem such as ``LibreYOLO9t``, or None."""
    for fam in families().values():
        size = fam.match_filename(stem)
        if size is not None:
            return fam, size
    return None
