"""One file written atomically: a temporary beside it, renamed into place; nothing half-written is ever
at the destination, and the file gets ordinary permissions. Used for checkpoints, JSON outputs,
metadata and every other single-file write."""
from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from libreyolo.errors import CheckpointError
from libreyolo.utils.tempfiles import TempGuard

__all__ = ["atomic_write", "file_mode_for"]


def _umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux: /proc)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore (briefly process-wide)
    os.umask(mask)
    return mask


def file_mode_for(path: Path) -> int:
    """Permissions for a file written at ``path``: an existing file's own, else those a plain
    ``open()`` would give (0o666 minus the umask). Temporary files start at 0o600."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o666 & ~_umask()


def atomic_write(path: str | Path, write) -> Path:
    """Call ``write(tmp_path)`` then rename onto ``path``; nothing is left at ``path`` on failure.
    The file gets ordinary permissions (see :func:`file_mode_for`), not the temporary's 0o600."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise CheckpointError(f"cannot write {path}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise CheckpointError(f"cannot write {path}: the folder {parent} is not writable")
    with TempGuard() as guard:  # SIGTERM/SIGHUP during the write remove the temporary too
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
        guard.add(tmp)
        os.close(fd)
        try:
            write(Path(tmp))
            os.chmod(tmp, file_mode_for(path))
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return path
