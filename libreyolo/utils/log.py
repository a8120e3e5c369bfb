"""The package's logger and its console output.

Library code never prints: it logs to ``logging.getLogger("libreyolo")``. Without any logging
set-up, Python shows WARNING and above on stderr (its last-resort handler), so skipped files and
similar warnings are seen; INFO lines (``verbose=True``, progress notes) are shown by the CLI and
whenever :func:`enable_console` was called or the application configured logging.
"""
from __future__ import annotations

import logging
import sys

LOGGER = logging.getLogger("libreyolo")


class _ConsoleHandler(logging.Handler):
    """Writes to the *current* ``sys.stderr`` (it may be swapped after set-up), through
    ``tqdm.write`` when tqdm is loaded so that a message does not break a progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            tqdm_module = sys.modules.get("tqdm")
            if tqdm_module is not None:
                tqdm_module.tqdm.write(text, file=sys.stderr)
            else:
                sys.stderr.write(text + "\n")
                sys.stderr.flush()
        except Exception:  # logging must never raise into the caller
            self.handleError(record)


class _ConsoleFormat(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        return text if record.levelno < logging.WARNING else f"{record.levelname}: {text}"


def enable_console(level: int = logging.INFO) -> None:
    """Show the ``libreyolo`` logger's messages at ``level`` and above on stderr (idempotent)."""
    if not any(isinstance(h, _ConsoleHandler) for h in LOGGER.handlers):
        handler = _ConsoleHandler()
        handler.setFormatter(_ConsoleFormat())
        LOGGER.addHandler(handler)
    LOGGER.setLevel(level)


def want_info() -> None:
    """A call asked for output (``verbose=True``): make sure INFO lines are emitted somewhere.

    With no handler anywhere (logging not configured) the console handler is added; with the
    application's own handlers, only the ``libreyolo`` level is lowered to INFO.
    """
    if not LOGGER.hasHandlers():
        enable_console(logging.INFO)
    elif not LOGGER.isEnabledFor(logging.INFO):
        LOGGER.setLevel(logging.INFO)
