"""Task plugins: ``detect``, ``classify``, ``semantic``, ``restore``. See :mod:`libreyolo.tasks.base`.

A task registers itself with :func:`register_task` when its module is imported; the built-in
ones are imported on first use (:mod:`libreyolo.tasks.registry`). Everything outside a task's
module asks :func:`get_task`.
"""
from __future__ import annotations

from typing import Any

from libreyolo.errors import ArgumentError
from libreyolo.tasks.base import Task, TaskOptions
from libreyolo.tasks.registry import all_task_options, get_task, payload_names, register_task, tasks

__all__ = ["Task", "TaskOptions", "all_task_options", "check_data_task", "get_task", "payload_names", "register_task",
           "tasks"]


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
