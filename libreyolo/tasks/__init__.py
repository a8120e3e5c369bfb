"""Task plugins: ``detect``, ``classify``, ``semantic``, ``restore``. See :mod:`libreyolo.tasks.base`.

A task registers itself with :func:`register_task` when its module is imported; the built-in
ones are imported on first use (:mod:`libreyolo.tasks.registry`). Everything outside a task's
module asks :func:`get_task`.
"""
from __future__ import annotations

from libreyolo.tasks.base import Task, TaskOptions
from libreyolo.tasks.registry import all_task_options, get_task, payload_names, register_task, tasks

__all__ = ["Task", "TaskOptions", "all_task_options", "get_task", "payload_names", "register_task", "tasks"]
