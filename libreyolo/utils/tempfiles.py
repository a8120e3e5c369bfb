"""Temporary files that do not outlive a terminated process, and the crash-safe folder swap.

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


# --- folder artifacts: a crash-safe swap -------------------------------------------------------
# A multi-file artifact (a Triton model folder, a CoreML .mlpackage, an OpenVINO or NCNN folder)
# cannot be replaced by one rename. :func:`replace_folder` is the one way to install one:
#   1. the new folder is complete in a temporary sibling (the caller built it there);
#   2. the old folder is renamed aside (``.<name>.old-<pid>`` in ``aside_dir``);
#   3. the new folder is renamed onto the destination;
#   4. the aside folder is deleted.
# Steps 2 and 3 run with SIGTERM/SIGHUP/SIGINT deferred (main thread): a signal arriving between
# them is delivered once the new folder is in place. An exception in step 3 renames the old folder
# back. Only a hard kill (SIGKILL, power loss) between 2 and 3 can leave the destination missing,
# with the old folder aside: :func:`recover_folder`, run at the start of every swap, renames it
# back (destination missing) or deletes it (destination present: the new one made it).
_DEFERRED = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGINT") if hasattr(signal, name))


class deferred_signals:  # noqa: N801 (a context manager used like a function)
    """``with deferred_signals(): ...``: SIGTERM, SIGHUP and SIGINT arriving inside are held and
    delivered, in order, to the handlers that were installed before, when the block ends. Only the
    main thread can install handlers; elsewhere this does nothing."""

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}
        self._pending: list[int] = []

    def _hold(self, signum: int, frame: FrameType | None) -> None:
        self._pending.append(signum)

    def __enter__(self) -> deferred_signals:
        if _in_main_thread():
            for sig in _DEFERRED:
                try:
                    self._previous[sig] = signal.signal(sig, self._hold)
                except (ValueError, OSError):
                    pass
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()
        pending, self._pending = self._pending, []
        for sig in dict.fromkeys(pending):  # once each, in arrival order
            signal.raise_signal(sig)


def aside_prefix(final: Path) -> str:
    """The name prefix of ``final``'s old version while it is set aside (``.<name>.old-``)."""
    return f".{final.name}.old-"


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # ours: a swap of this process is never running when recovery runs
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def recover_folder(final: str | Path, aside_dir: str | Path | None = None) -> None:
    """Finish a swap into ``final`` that a hard kill interrupted: an old version left aside is
    renamed back when ``final`` is missing, and deleted when ``final`` is in place. Asides of a
    process that is still running (a concurrent swap) are left alone."""
    final = Path(final)
    aside_dir = Path(aside_dir) if aside_dir is not None else final.parent
    if not aside_dir.is_dir():
        return
    prefix = aside_prefix(final)
    leftovers = []
    for entry in aside_dir.iterdir():
        tail = entry.name[len(prefix):]
        if entry.name.startswith(prefix) and tail.isdigit() and not _alive(int(tail)):
            leftovers.append(entry)
    for entry in sorted(leftovers, key=lambda p: p.stat().st_mtime, reverse=True):
        if not final.exists() and not final.is_symlink():
            os.replace(entry, final)
        else:
            _remove(entry)


def replace_folder(built: str | Path, final: str | Path, *, aside_dir: str | Path | None = None) -> None:
    """Install the complete folder ``built`` at ``final`` (same file system), replacing an old
    ``final`` only once the new one is in place (see the steps above). ``aside_dir`` (default:
    ``final``'s parent) is where the old version waits between the two renames; a format whose
    parent folder is watched by a server (a Triton repository) passes a folder outside it."""
    built, final = Path(built), Path(final)
    aside_dir = Path(aside_dir) if aside_dir is not None else final.parent
    recover_folder(final, aside_dir)
    aside = aside_dir / f"{aside_prefix(final)}{os.getpid()}"
    installed = False
    with TempGuard() as guard:
        try:
            with deferred_signals():
                had_old = final.exists() or final.is_symlink()
                if had_old:
                    os.replace(final, aside)
                try:
                    os.replace(built, final)
                except BaseException:
                    if had_old and not (final.exists() or final.is_symlink()):
                        os.replace(aside, final)  # the old version back
                    raise  # (if the new one did arrive, the next swap's recovery removes the aside)
                installed = True
                if had_old:
                    guard.add(aside)  # SIGTERM delivered on leaving the block removes it, then kills
        finally:
            if installed and had_old:  # Ctrl-C delivered on leaving the block: removed here
                _remove(aside)
