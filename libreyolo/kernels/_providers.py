"""Lazy loading of accelerated providers.

Nothing here runs at `import libreyolo` or `import libreyolo.kernels`: the
registry calls `load_once()` on the first selection that is not forced to the
references (`LIBREYOLO_KERNELS=off`). In-tree providers register first, then
an installed `libreyolo_kernels` package, so out-of-tree kernels win ties.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import warnings

from libreyolo.kernels.context import KernelWarning

__all__ = ["load_once", "package_present", "triton_usable"]

_IN_TREE_LOADERS = (
    "libreyolo.kernels.quant:register_providers",
    "libreyolo.kernels.attention:register_providers",
)
OUT_OF_TREE_PACKAGE = "libreyolo_kernels"

_load_lock = threading.RLock()
_state = "pending"  # pending -> loading -> done


def package_present(name: str) -> bool:
    """Whether `import name` could succeed, without importing it."""
    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def triton_usable() -> bool:
    """Triton installed and a CUDA device visible (checked without importing Triton)."""
    import torch

    return package_present("triton") and torch.cuda.is_available()


def _warn(message: str) -> None:
    warnings.warn(message, KernelWarning, stacklevel=4)


def _run_loader(target: str) -> None:
    module_name, _, function = target.partition(":")
    try:
        getattr(importlib.import_module(module_name), function)()
    except Exception as exc:  # a provider that cannot load must not break inference
        _warn(f"kernel provider {target} failed to load ({exc!r}); the portable paths are used instead.")


def _import_out_of_tree() -> None:
    if not package_present(OUT_OF_TREE_PACKAGE):
        return
    try:
        importlib.import_module(OUT_OF_TREE_PACKAGE)
    except Exception as exc:
        _warn(
            f"the installed {OUT_OF_TREE_PACKAGE!r} package failed to import ({exc!r}); its kernels are "
            f"skipped. Reinstall it or uninstall it (pip uninstall {OUT_OF_TREE_PACKAGE.replace('_', '-')})."
        )


def load_once() -> bool:
    """Import every available provider once per process; returns whether loading is complete.

    A re-entrant call (a provider that resolves a slot while being imported)
    returns False at once instead of loading again.
    """
    global _state
    if _state == "done":
        return True
    with _load_lock:
        if _state != "pending":
            return _state == "done"
        _state = "loading"
        try:
            for target in _IN_TREE_LOADERS:
                _run_loader(target)
            _import_out_of_tree()
        finally:
            _state = "done"
    return True
