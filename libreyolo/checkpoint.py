"""Reading and writing LibreYOLO checkpoints (schema 1.0, the reference library's format).

A checkpoint is a flat dict: ``model`` (the state dict) plus ``schema_version``,
``libreyolo_version``, ``model_family``, ``size``, ``task``, ``nc``, ``names`` (int -> str),
``imgsz`` and family extras. Files are read with ``torch.load(weights_only=True)``: nothing in
a checkpoint can run code.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from libreyolo._version import __version__
from libreyolo.errors import CheckpointError
from libreyolo.models.base import Family
from libreyolo.models.registry import family_from_filename, get_family

SCHEMA_VERSION = "1.0"
HUB_ORG = "LibreYOLO"


@dataclass
class Checkpoint:
    family: Family
    size: str
    nc: int
    names: dict[int, str]
    imgsz: int
    state_dict: dict[str, torch.Tensor] | None
    meta: dict[str, Any] = field(default_factory=dict)
    path: str | None = None


def default_names(nc: int) -> dict[int, str]:
    if nc == 80:
        from libreyolo.assets import COCO80

        return dict(enumerate(COCO80))
    return {i: f"class{i}" for i in range(nc)}


def _normalise_names(names: Any, nc: int | None, where: str) -> dict[int, str]:
    if names is None:
        return default_names(nc or 80)
    if isinstance(names, (list, tuple)):
        names = dict(enumerate(names))
    if not isinstance(names, dict):
        raise CheckpointError(f"{where}: 'names' must be a dict or list of class names, got {type(names).__name__}")
    try:
        return {int(k): str(v) for k, v in sorted(names.items(), key=lambda kv: int(kv[0]))}
    except (TypeError, ValueError):
        raise CheckpointError(f"{where}: class ids in 'names' must be integers, got {list(names)[:5]}") from None


def _torch_load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for bad files
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "Weights only load failed" in str(exc) or "Unsupported global" in str(exc):
            raise CheckpointError(
                f"{path}: refusing to load: the file holds Python objects that could run code, and "
                "checkpoints are loaded with weights_only=True. Re-save it as a plain state dict."
            ) from None
        raise CheckpointError(f"{path} is not a readable PyTorch checkpoint ({text})") from None


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Read a reference-format ``.pt`` (or a bare state dict whose file name says the family)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    obj = _torch_load(path)
    if not isinstance(obj, dict) or not obj:
        raise CheckpointError(f"{path} is not a LibreYOLO checkpoint (expected a dict, got {type(obj).__name__})")
    if "model" in obj and isinstance(obj["model"], dict):
        state, meta = obj["model"], {k: v for k, v in obj.items() if k != "model"}
    elif all(isinstance(v, torch.Tensor) for v in obj.values()):
        state, meta = obj, {}
    else:
        raise CheckpointError(
            f"{path} is not a LibreYOLO checkpoint: no 'model' state dict inside (keys: {sorted(obj)[:8]})"
        )
    family_name, size = meta.get("model_family"), meta.get("size")
    by_name = family_from_filename(path.stem)
    if family_name is None:
        if by_name is None:
            raise CheckpointError(
                f"{path}: cannot tell the model family: the checkpoint has no 'model_family' and the file "
                "name does not follow LibreYOLO<family><size>.pt (e.g. LibreYOLO9t.pt)"
            )
        family_name = by_name[0].name
    family = get_family(str(family_name))
    if size is None and by_name is not None and by_name[0] is family:
        size = by_name[1]
    if size is None:
        raise CheckpointError(f"{path}: the checkpoint does not say which {family.name} size it is ('size' missing)")
    size = str(size)
    if size not in family.sizes:
        raise CheckpointError(f"{path}: unknown {family.name} size {size!r}; known sizes: {', '.join(family.sizes)}")
    nc = meta.get("nc")
    names = _normalise_names(meta.get("names"), nc, str(path))
    nc = int(nc) if nc is not None else len(names)
    if len(names) != nc:
        names = {i: names.get(i, f"class{i}") for i in range(nc)}
    imgsz = int(meta.get("imgsz") or family.default_imgsz)
    return Checkpoint(family, size, nc, names, imgsz, state, meta, str(path))


def load_state(model: torch.nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    """Load a state dict strictly; on mismatch say which keys are missing, unexpected or misshaped."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}"
              for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or shapes:
        parts = []
        groups = (("missing", missing), ("unexpected", unexpected), ("shape mismatch (file vs model)", shapes))
        for label, keys in groups:
            if keys:
                more = f" (+{len(keys) - 5} more)" if len(keys) > 5 else ""
                parts.append(f"{label}: {', '.join(keys[:5])}{more}")
        raise CheckpointError(f"{where}: the state dict does not match the architecture; " + "; ".join(parts))
    model.load_state_dict(state, strict=True)


def atomic_write(path: str | Path, write) -> Path:
    """Call ``write(tmp_path)`` then rename onto ``path``; nothing is left at ``path`` on failure."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise CheckpointError(f"cannot write {path}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise CheckpointError(f"cannot write {path}: the folder {parent} is not writable")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def save_checkpoint(path: str | Path, model: torch.nn.Module, *, family: Family, size: str, nc: int,
                    names: dict[int, str], imgsz: int) -> Path:
    state = {k: v.detach().to("cpu", copy=True).float() if v.is_floating_point() else v.detach().cpu()
             for k, v in model.state_dict().items()}
    payload = {
        "model": state,
        "schema_version": SCHEMA_VERSION,
        "libreyolo_version": __version__,
        "model_family": family.name,
        "size": size,
        "task": family.task,
        "nc": int(nc),
        "names": {int(k): str(v) for k, v in names.items()},
        "imgsz": int(imgsz),
        **family.extra_meta,
    }
    return atomic_write(path, lambda tmp: torch.save(payload, tmp))


def hub_download(stem: str) -> Path:
    """Fetch ``LibreYOLO/<stem>`` / ``<stem>.pt`` from the Hugging Face Hub into its cache."""
    from libreyolo.errors import require

    hub = require("huggingface_hub", "hub", f"downloading {stem}.pt from the Hugging Face Hub")
    repo = f"{HUB_ORG}/{stem}"
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "10")
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "10")
    try:
        return Path(hub.hf_hub_download(repo_id=repo, filename=f"{stem}.pt"))
    except Exception as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(
            f"{stem}.pt is not a local file and could not be downloaded from the Hugging Face Hub "
            f"(repo {repo}): {reason}. If you are offline, download the file elsewhere and pass its path."
        ) from None
