"""The kernel registry: which implementation computes a slot, chosen in one place.

A *slot* names what is computed (`fake_quant_fp8`, `ms_deform_attn`, ...).
Implementations register under a slot with a *name* (the backend: "triton",
"hub", "mybackend") and an optional *predicate*. Selection walks the
registrations newest first and takes the first whose predicate accepts the
call; with none eligible it falls back to the slot's reference implementation
(or to nothing, for slots whose callers keep their own portable path).

Predicates receive the call's arguments, so a provider can decline by input
(device, dtype, tracing). `resolve(slot)` and `active()` call them with no
arguments, which asks "could you run at all here?".
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from libreyolo.kernels.context import KernelWarning, compiling

__all__ = [
    "REFERENCE",
    "UNAVAILABLE",
    "Implementation",
    "KernelBinding",
    "KernelWarning",
    "active",
    "bind",
    "call",
    "call_or",
    "candidates",
    "define_slot",
    "disable",
    "register",
    "resolve",
    "selected",
    "selector",
    "slots",
    "unregister",
]

REFERENCE = "reference"
UNAVAILABLE = "unavailable"
_OFF_WORDS = frozenset({"off", REFERENCE})

# Slots known before any provider loads. The value is the reference
# implementation as "module:attribute" (imported on first use) or None for
# slots whose callers keep their own portable path.
_BUILTIN_SLOTS: dict[str, str | None] = {
    "fake_quant_fp8": "libreyolo.quant.fake_quant:fake_quant_fp8",
    "fake_quant_int8_per_channel": "libreyolo.quant.fake_quant:fake_quant_int8_per_channel",
    "fake_quant_int8_affine": "libreyolo.quant.fake_quant:fake_quant_int8_affine",
    "ms_deform_attn": None,
}


Predicate = Callable[..., bool]


@dataclass(frozen=True)
class Implementation:
    """One registered implementation of a slot."""

    slot: str
    name: str
    impl: Callable[..., Any]
    predicate: Predicate | None = None
    sequence: int = 0


@dataclass(frozen=True)
class _Selection:
    """Cached, argument-independent part of a slot's selection."""

    key: tuple[Any, ...]
    ordered: tuple[Implementation, ...]
    reference: Implementation | None


_lock = threading.RLock()
_references: dict[str, Callable[..., Any] | str | None] = dict(_BUILTIN_SLOTS)
_registrations: dict[str, list[Implementation]] = {}
_disabled: set[tuple[str, str]] = set()
_warned: set[tuple[Any, ...]] = set()
_cache: dict[str, _Selection] = {}
_generation = 0
_sequence = 0
_providers_loaded = False


def _warn_once(key: tuple[Any, ...], message: str) -> None:
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, KernelWarning, stacklevel=3)


_ENV_VARS = ("LIBREYOLO_KERNELS", "LIBREYOLO_QUANT_KERNELS", "LIBREYOLO_HUB_KERNELS")


def _env_key() -> tuple[str | None, ...]:
    get = os.environ.get
    return tuple(get(name) for name in _ENV_VARS)


def _selector_from(env: tuple[str | None, ...]) -> str | None:
    raw = (env[0] or "").strip() or (env[1] or "").strip()
    if not raw:
        return None
    value = raw.lower()
    return REFERENCE if value in _OFF_WORDS else value


def selector() -> str | None:
    """The active selector: None (all providers), "reference", or a provider name.

    `LIBREYOLO_KERNELS` wins; the legacy `LIBREYOLO_QUANT_KERNELS` is read
    only when `LIBREYOLO_KERNELS` is unset (an empty value counts as unset).
    """
    return _selector_from(_env_key())


def _bump() -> None:
    global _generation
    _generation += 1
    _cache.clear()


def define_slot(slot: str, reference: Callable[..., Any] | None = None) -> None:
    """Declare a slot and its reference implementation (None: callers keep a portable path)."""
    if not slot or not isinstance(slot, str):
        raise ValueError(f"slot must be a non-empty string, got {slot!r}")
    with _lock:
        _references[slot] = reference
        _bump()


def register(
    slot: str,
    impl: Callable[..., Any],
    *,
    name: str,
    predicate: Predicate | None = None,
) -> Implementation:
    """Register `impl` for `slot` under the backend `name`; it wins over older registrations.

    `predicate(*args, **kwargs)` receives the call's arguments and returns
    whether `impl` accepts them; with no arguments it answers "could you run
    at all here?". Registering the same (slot, name) again replaces the old
    entry and clears a previous `disable`.
    """
    global _sequence
    if not callable(impl):
        raise TypeError(f"impl for slot {slot!r} must be callable, got {type(impl).__name__}")
    if not name or not isinstance(name, str) or name.lower() in _OFF_WORDS:
        raise ValueError(
            f"name must be a non-empty string other than 'off'/'reference', got {name!r}; "
            "use the backend's name, e.g. name='triton'"
        )
    if predicate is not None and not callable(predicate):
        raise TypeError(f"predicate for {slot!r}/{name!r} must be callable or None")
    with _lock:
        _sequence += 1
        entry = Implementation(slot, name, impl, predicate, _sequence)
        entries = [e for e in _registrations.get(slot, []) if e.name != name]
        entries.append(entry)
        _registrations[slot] = entries
        _references.setdefault(slot, None)
        _disabled.discard((slot, name))
        _bump()
    return entry


def unregister(slot: str, name: str) -> bool:
    """Remove the registration `name` from `slot`; returns whether one was removed."""
    with _lock:
        entries = _registrations.get(slot, [])
        kept = [e for e in entries if e.name != name]
        if len(kept) == len(entries):
            return False
        _registrations[slot] = kept
        _bump()
        return True


def disable(slot: str, name: str, reason: object = None) -> None:
    """Take `name` out of selection for `slot` for the rest of the process; warns once."""
    with _lock:
        _disabled.add((slot, name))
        _bump()
    why = f": {reason!r}" if reason is not None else ""
    _warn_once(
        ("disabled", slot, name),
        f"kernel {name!r} for slot {slot!r} failed and is disabled for this process{why}; "
        "the next eligible implementation or the portable path runs instead. "
        "Set LIBREYOLO_KERNELS=off to silence this, or report the failure to the provider.",
    )


def slots() -> tuple[str, ...]:
    """Every known slot, sorted."""
    with _lock:
        return tuple(sorted(_references))


def _reference_of(slot: str) -> Implementation | None:
    target = _references[slot]
    if target is None:
        return None
    if isinstance(target, str):
        module_name, _, attribute = target.partition(":")
        target = getattr(importlib.import_module(module_name), attribute)
        with _lock:
            _references[slot] = target
    return Implementation(slot, REFERENCE, target)


def _known_names() -> set[str]:
    return {e.name.lower() for entries in _registrations.values() for e in entries}


class KernelBinding:
    """The slots' selections resolved for one inference copy: while it is active (:meth:`active`, around
    the copy's forward), a slot's selection is looked up here, without reading the environment or
    taking the registry's lock. It is stale once registrations change or the selector variables do
    (:meth:`current`); :func:`bind` then gives a new one. Predicates still see each call's arguments."""

    __slots__ = ("generation", "env", "selections")

    def __init__(self) -> None:
        global _providers_loaded
        self.env = _env_key()
        if not _providers_loaded and _selector_from(self.env) != REFERENCE:
            from libreyolo.kernels import _providers  # their registrations come before the binding's generation

            _providers_loaded = _providers.load_once()
        self.generation = _generation
        self.selections: dict[str, _Selection] = {}

    def current(self) -> bool:
        """Whether the registry and the selector variables are as when this binding was made."""
        return self.generation == _generation and self.env == _env_key()

    @contextlib.contextmanager
    def active(self) -> Iterator[KernelBinding]:
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)


_ACTIVE: contextvars.ContextVar[KernelBinding | None] = contextvars.ContextVar("libreyolo_kernels", default=None)


def bind(previous: KernelBinding | None = None) -> KernelBinding:
    """``previous`` while it is current, else a new :class:`KernelBinding` (resolved lazily, slot by slot)."""
    if previous is not None and previous.current():
        return previous
    return KernelBinding()


def _selection(slot: str) -> _Selection:
    bound = _ACTIVE.get()
    if bound is not None and bound.generation == _generation:  # the inference copy's: no environment read
        found = bound.selections.get(slot)
        if found is None:
            found = bound.selections[slot] = _select(slot, bound.env)
        return found
    return _select(slot, _env_key())


def _select(slot: str, env: tuple[str | None, ...]) -> _Selection:
    global _providers_loaded
    if not _providers_loaded and _selector_from(env) != REFERENCE:
        from libreyolo.kernels import _providers

        _providers_loaded = _providers.load_once()
    with _lock:
        cached = _cache.get(slot)
        if cached is not None and cached.key == (_generation, *env):
            return cached
    # Importing a reference module is done outside the lock.
    reference = _reference_of(slot) if slot in _references else None
    chosen = _selector_from(env)
    with _lock:
        key = (_generation, *env)
        if slot not in _references:
            raise KeyError(
                f"unknown kernel slot {slot!r}; known slots: {', '.join(sorted(_references))}. "
                "Check the spelling, or register an implementation for it first."
            )
        if chosen not in (None, REFERENCE) and chosen not in _known_names():
            _warn_once(
                ("selector", chosen),
                f"LIBREYOLO_KERNELS={chosen!r} matches no registered kernel "
                f"(registered: {', '.join(sorted(_known_names())) or 'none'}); references are used. "
                "Unset it, set it to 'off', or install the provider that registers that name.",
            )
        ordered: tuple[Implementation, ...] = ()
        if chosen != REFERENCE:
            ordered = tuple(
                e
                for e in sorted(_registrations.get(slot, []), key=lambda e: -e.sequence)
                if (slot, e.name) not in _disabled and (chosen is None or e.name.lower() == chosen)
            )
        entry = _Selection(key, ordered, reference)
        _cache[slot] = entry
        return entry


def _eligible(entry: Implementation, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if entry.predicate is None:
        return True
    try:
        return bool(entry.predicate(*args, **kwargs))
    except Exception as exc:  # a broken third-party predicate must not break inference
        _warn_once(
            ("predicate", entry.slot, entry.name),
            f"predicate of kernel {entry.name!r} for slot {entry.slot!r} raised {exc!r}; "
            "treating it as ineligible. Fix the predicate or unregister the kernel.",
        )
        return False


def candidates(slot: str, *args: Any, **kwargs: Any) -> Iterator[Implementation]:
    """Eligible implementations for this call, best first; the reference (if any) comes last.

    Predicates are evaluated lazily, one per step of the iteration.
    """
    entry = _selection(slot)
    for impl in entry.ordered:
        if (slot, impl.name) in _disabled:
            continue
        if _eligible(impl, args, kwargs):
            yield impl
    if entry.reference is not None:
        yield entry.reference


def selected(slot: str, *args: Any, **kwargs: Any) -> Implementation | None:
    """The implementation `resolve` would return, with its name; None when unavailable."""
    return next(candidates(slot, *args, **kwargs), None)


def resolve(slot: str, *args: Any, **kwargs: Any) -> Callable[..., Any] | None:
    """The callable chosen for `slot` (for these arguments, if given); None if there is none.

    Slots without a reference (attention, GEMM) return None when no provider
    is eligible: the caller then runs its own portable path.
    """
    chosen = selected(slot, *args, **kwargs)
    return None if chosen is None else chosen.impl


def active() -> dict[str, str]:
    """Map each known slot to the name of the implementation selected now, or "unavailable"."""
    result = {}
    for slot in slots():
        chosen = selected(slot)
        result[slot] = UNAVAILABLE if chosen is None else chosen.name
    return result


_NO_RESULT = object()


def _run(slot: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if compiling():
        # Dynamo traces the reference itself: compiled and exported graphs carry
        # the defining ops, and the registry's locks never enter a graph.
        reference = _reference_of(slot) if slot in _references else None
        return _NO_RESULT if reference is None else reference.impl(*args, **kwargs)
    for impl in candidates(slot, *args, **kwargs):
        if impl.name == REFERENCE:
            return impl.impl(*args, **kwargs)
        try:
            return impl.impl(*args, **kwargs)
        except Exception as exc:
            disable(slot, impl.name, exc)
    return _NO_RESULT


def call(slot: str, /, *args: Any, **kwargs: Any) -> Any:
    """Run the selected implementation; a provider that raises is disabled and the next one runs.

    Errors raised by the reference propagate unchanged (they are the caller's).
    While dynamo traces (`torch.compile`, `torch.export`) the reference runs
    directly, without consulting the registry.
    """
    result = _run(slot, args, kwargs)
    if result is _NO_RESULT:
        raise LookupError(
            f"slot {slot!r} has no eligible implementation and no reference; "
            "callers of such slots keep a portable path: use call_or(slot, portable_fn, ...)"
        )
    return result


def call_or(slot: str, fallback: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Like `call`, but runs `fallback(*args, **kwargs)` when no implementation succeeds."""
    result = _run(slot, args, kwargs)
    if result is _NO_RESULT:
        return fallback(*args, **kwargs)
    return result


def _snapshot() -> dict[str, Any]:
    """Copy of the registry state (tests restore it to stay independent)."""
    with _lock:
        return {
            "references": dict(_references),
            "registrations": {k: list(v) for k, v in _registrations.items()},
            "disabled": set(_disabled),
            "warned": set(_warned),
        }


def _restore(state: dict[str, Any]) -> None:
    with _lock:
        _references.clear()
        _references.update(state["references"])
        _registrations.clear()
        _registrations.update(state["registrations"])
        _disabled.clear()
        _disabled.update(state["disabled"])
        _warned.clear()
        _warned.update(state["warned"])
        _bump()
