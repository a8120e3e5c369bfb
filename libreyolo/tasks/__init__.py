"""Task plugins: ``detect``, ``classify``, ``semantic``. See :mod:`libreyolo.tasks.base`.

A task registers itself with :func:`register_task` when its module is imported; the built-in
ones are imported on first use. Everything outside a task's module asks :func:`get_task`.
"""
from __future__ import annotations

from typing import Any

from libreyolo.errors import ArgumentError, LibreYOLOError
from libreyolo.tasks.base import Task, TaskOptions
from libreyolo.utils.registry import Registry

__all__ = ["Task", "TaskOptions", "all_task_options", "check_data_task", "get_task", "payload_names", "register_task",
           "tasks"]

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


def all_task_options() -> dict:
    """Every predict option some task declares (the CLI's ``predict`` flags)."""
    out: dict = {}
    for t in tasks().values():
        for name, opt in t.options.items():
            out.setdefault(name, opt)
    return out


def _claim(task: Task, data: Any) -> str | None:
    try:
        return task.claims_data(data)
    except Exception:  # a layout probe is never the error; the task's loader says what is wrong
        return None


def check_data_task(task: str, data: Any) -> None:
    """Refuse ``data`` laid out as another task's dataset (and not as ``task``'s): an error naming
    both tasks, before any image is read. Each task says what its layout is
    (:meth:`Task.claims_data`); data no task recognises is left to ``task``'s own loader."""
    own = get_task(task)
    if _claim(own, data):
        return
    others = {t.name: why for t in tasks().values() if t.name != task and (why := _claim(t, data))}
    if others:
        other, why = next(iter(others.items()))
        raise ArgumentError(f"data={str(data)!r:.200} is a {other} dataset ({why}), but the model is a {task} model: "
                            f"validate a {other} model on it, or pass {own.data_help}")
