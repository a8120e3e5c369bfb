"""A name -> instance registry whose built-in entries register themselves when their module is
imported (on first use): the one mechanism behind the family and the task registries."""
from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """``register`` (a class decorator) keeps one instance of each class under its ``name``;
    ``all()`` / ``get(name)`` import ``package.<module>`` for every built-in module first."""

    def __init__(self, what: str, plural: str, package: str, builtin: tuple[str, ...],
                 error: Callable[[str], Exception], check: Callable[[dict[str, T], type], None] | None = None):
        self.what, self.plural, self.package, self.builtin = what, plural, package, builtin
        self.error, self.check = error, check
        self._items: dict[str, T] = {}
        self._loaded = False

    def register(self, cls: Any) -> Any:
        held = self._items.get(cls.name)
        if held is not None and type(held) is not cls:
            raise ValueError(f"{self.what} {cls.name!r} is already registered by {type(held).__name__}")
        if self.check is not None:
            self.check(self._items, cls)
        self._items[cls.name] = cls()
        return cls

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True
            for mod in self.builtin:
                importlib.import_module(f"{self.package}.{mod}")

    def all(self) -> dict[str, T]:
        self._load()
        return dict(self._items)

    def get(self, name: str) -> T:
        self._load()
        try:
            return self._items[name]
        except KeyError:
            raise self.error(f"unknown {self.what} {name!r}; known {self.plural}: "
                             f"{', '.join(sorted(self._items))}") from None
