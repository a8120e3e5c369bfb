"""The task registry: name -> task plugin. Tasks register themselves when their module is imported;
the built-in ones are imported on first use. :mod:`libreyolo.tasks` re-exports these functions."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from libreyolo.errors import LibreYOLOError
from libreyolo.utils.registry import Registry

if TYPE_CHECKING:
    from libreyolo.tasks.base import Task

_BUILTIN = ("detect", "classify", "semantic", "restore")


def _one_payload_each(known: dict[str, Task], cls: type[Task]) -> None:
    taken = {t.payload: t.name for t in known.values() if t.name != cls.name}
    if cls.payload in taken:
        raise ValueError(f"Results attribute {cls.payload!r} already belongs to task {taken[cls.payload]!r}")


_REGISTRY: Registry[Task] = Registry("task", "tasks", "libreyolo.tasks", _BUILTIN, LibreYOLOError, _one_payload_each)


def register_task(cls: type[Task]) -> type[Task]:
    """Class decorator: make a task available by ``cls.name``."""
    return _REGISTRY.register(cls)


def tasks() -> dict[str, Task]:
    return _REGISTRY.all()


def get_task(name: str) -> Task:
    return _REGISTRY.get(name)


def payload_names() -> dict[str, str]:
    """Results attribute -> the task that fills it (``{"boxes": "detect", ...}``)."""
    return {t.payload: t.name for t in tasks().values()}


def all_task_options() -> dict[str, Any]:
    """Every predict option some task declares (the CLI's ``predict`` flags)."""
    out: dict[str, Any] = {}
    for t in tasks().values():
        for name, opt in t.options.items():
            out.setdefault(name, opt)
    return out
