"""Temporary files that do not outlive a terminated process.

Writes go to a hidden temporary file (or folder) next to the destination and are renamed into
place at the end. An exception or Ctrl-C removes the temporary in a ``finally``; SIGTERM (and
SIGHUP) would kill the process before that runs, so while at least one :class:`TempGuard` is
open in the main thread, a handler for them is installed that removes every registered
temporary and then behaves as the previous handler did: with the default action it restores
that action and re-sends the signal, so the process still dies of SIGTERM (exit status -15);
a Python handler installed by the application is called as before (and what it raises
propagates); an ignored signal stays ignored and nothing is removed. The previous handlers
are restored when the last guard closes. Threads other than the main thread cannot install
signal handlers: their temporaries are removed on termination only while the main thread
holds a guard too, and otherwise by the usual exception path.
"""
from __future__ import annotations

import os
import shutil
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))
_lock = threading.RLock()  # re-entrant: the handler runs in the main thread, maybe inside a locked block
_registered: dict[int, Path] = {}
_previous: dict[int, Any] = {}
_depth = 0  # open guards in the main thread
_next_token = 0


def _remove(path: Path) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass


def remove_registered() -> None:
    """Remove every registered temporary now (what the signal handler does)."""
    with _lock:
        paths = list(_registered.values())
    for path in paths:
        _remove(path)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    previous = _previous.get(signum, signal.SIG_DFL)
    if previous is signal.SIG_IGN:
        return
    if callable(previous):
        try:
            previous(signum, frame)
        except BaseException:
            remove_registered()
            raise
        return
    remove_registered()  # default action (or a handler set outside Python): die of the signal, cleanly
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class TempGuard:
    """``with TempGuard() as guard: guard.add(tmp); ...``: ``tmp`` is removed if SIGTERM arrives inside."""

    def __init__(self) -> None:
        self._tokens: list[int] = []
        self._installed = False

    def __enter__(self) -> TempGuard:
        global _depth
        if _in_main_thread():
            with _lock:
                if _depth == 0:
                    for sig in _SIGNALS:
                        try:
                            _previous[sig] = signal.signal(sig, _on_signal)
                        except (ValueError, OSError):  # not allowed here (e.g. an embedded interpreter)
                            pass
                _depth += 1
                self._installed = True
        return self

    def add(self, path: str | Path) -> Path:
        global _next_token
        path = Path(path)
        with _lock:
            _next_token += 1
            _registered[_next_token] = path
            self._tokens.append(_next_token)
        return path

    def __exit__(self, *exc: Any) -> None:
        global _depth
        with _lock:
            for token in self._tokens:
                _registered.pop(token, None)
            self._tokens.clear()
            if self._installed:
                _depth -= 1
                self._installed = False
                if _depth == 0:
                    for sig, handler in list(_previous.items()):
                        if signal.getsignal(sig) is _on_signal:
                            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
                    _previous.clear()
