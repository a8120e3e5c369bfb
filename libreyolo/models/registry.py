"""Family registry: name -> adapter. Families register themselves when their folder is imported."""
from __future__ import annotations

from typing import TypeVar

from libreyolo.errors import CheckpointError
from libreyolo.models.base import Family
from libreyolo.models.contract import KINDS, ExportContract
from libreyolo.utils.registry import Registry

# folders under libreyolo/models that hold a family; imported on first registry use
_BUILTIN = ("yolo9", "vit", "deit", "rtdetr", "swin", "yolox", "dfine", "segformer", "rtmdet", "swinir",
            "yolo9_e2e", "rtdetrv2", "deimv2", "rfdetr", "lwdetr", "deim", "rtdetrv4")


def check_contract(_registered: dict[str, Family], cls: type[Family]) -> None:
    """A family's export contract is of exactly one kind, the one its base class names
    (``contract_kind``): raises TypeError otherwise, when the family registers."""
    kind = getattr(cls, "contract_kind", None)
    if not (isinstance(kind, type) and issubclass(kind, ExportContract) and kind in KINDS):
        raise TypeError(f"family {cls.__name__} names no contract kind (contract_kind={kind!r}); derive it from "
                        f"the base class of its kind or set contract_kind to one of "
                        f"{[k.__name__ for k in KINDS]}")
    contract = getattr(cls, "export", None)
    if type(contract) not in KINDS or not isinstance(contract, kind):
        raise TypeError(f"family {cls.__name__} declares export={type(contract).__name__}, but its kind is "
                        f"{kind.__name__}; declare export={kind.__name__}(...) (libreyolo.models.contract)")


_REGISTRY: Registry[Family] = Registry("model family", "families", "libreyolo.models", _BUILTIN, CheckpointError,
                                       check=check_contract)

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
