"""Task plugins: ``detect``, ``classify``, ``semantic``. See :mod:`libreyolo.tasks.base`.

A task registers itself with :func:`register_task` when its module is imported; the built-in
ones are imported on first use. Everything outside a task's module asks :func:`get_task`.
"""
from __future__ import annotations

import importlib

from libreyolo.errors import LibreYOLOError
from libreyolo.tasks.base import Task, TaskOptions

__all__ = ["Task", "TaskOptions", "all_task_options", "get_task", "payload_names", "register_task", "tasks"]

_TASKS: dict[str, Task] = {}
_BUILTIN = ("detect", "classify", "semantic", "restore")
_loaded = False


def register_task(cls: type[Task]) -> type[Task]:
    """Class decorator: make a task available by ``cls.name``."""
    if cls.name in _TASKS and type(_TASKS[cls.name]) is not cls:
        raise ValueError(f"task {cls.name!r} is already registered by {type(_TASKS[cls.name]).__name__}")
    taken = {t.payload: t.name for t in _TASKS.values() if t.name != cls.name}
    if cls.payload in taken:
        raise ValueError(f"Results attribute {cls.payload!r} already belongs to task {taken[cls.payload]!r}")
    _TASKS[cls.name] = cls()
    return cls


def _load_builtins() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for mod in _BUILTIN:
            importlib.import_module(f"libreyolo.tasks.{mod}")


def tasks() -> dict[str, Task]:
    _load_builtins()
    return dict(_TASKS)


def get_task(name: str) -> Task:
    _load_builtins()
    try:
        return _TASKS[name]
    except KeyError:
        raise LibreYOLOError(f"unknown task {name!r}; known tasks: {', '.join(sorted(_TASKS))}") from None


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
