"""Reading and writing LibreYOLO checkpoints (schema 1.0, the reference library's format).

A checkpoint is a flat dict: ``model`` (the state dict) plus ``schema_version``,
``libreyolo_version``, ``model_family``, ``size``, ``task``, ``nc``, ``names`` (int -> str),
``imgsz`` and family extras. Files are read with ``torch.load(weights_only=True)``: nothing in
a checkpoint can run code.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from libreyolo._version import __version__
from libreyolo.errors import CheckpointError
from libreyolo.models.base import Family
from libreyolo.models.registry import family_from_filename, get_family
from libreyolo.utils.atomic import atomic_write, file_mode_for  # noqa: F401 - importers of their old home
from libreyolo.utils.checks import check_imgsz, check_names, check_nc, check_str, nonfinite_keys, tensor_problem

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


_SIGNATURES = ((b"\x89PNG\r\n\x1a\n", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"GIF8", "a GIF image"),
               (b"II*\x00", "a TIFF image"), (b"MM\x00*", "a TIFF image"), (b"%PDF", "a PDF document"),
               (b"\x1f\x8b", "a gzip archive"), (b"\x7fELF", "an executable (ELF)"))


def sniff(path: Path) -> str | None:
    """What a file that is not a PyTorch checkpoint looks like ("a PNG image", "a text file"...);
    None when it could be one (a zip archive, as torch.save writes, or a legacy pickle)."""
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not head:
        return "an empty file (0 bytes)"
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":
        return None
    for magic, what in _SIGNATURES:
        if head.startswith(magic):
            return what
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "a WebP image"
    if head[:2] == b"BM":
        return "a BMP image"
    if b"\x00" not in head:
        try:
            head.decode("utf-8")
            return "a text file"
        except UnicodeDecodeError as exc:
            if exc.start >= len(head) - 3:  # a character cut by the 512-byte window
                return "a text file"
    return "unknown binary data"


def _torch_load(path: Path) -> Any:
    what = sniff(path)
    if what is not None:
        raise CheckpointError(f"{path} is not a PyTorch checkpoint: it is {what}. Pass a LibreYOLO .pt checkpoint "
                              "(or a .yaml architecture, or an exported artifact)")
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


def check_state(state: dict[Any, Any], where: str, *, finite: bool = True) -> None:
    """A state dict is ``{str: tensor}``; with ``finite``, no floating tensor holds NaN or Inf."""
    odd = [f"{k!r:.60} ({type(v).__name__})" for k, v in state.items()
           if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if odd:
        more = f" (+{len(odd) - 5} more)" if len(odd) > 5 else ""
        raise CheckpointError(f"{where}: the state dict must map names to tensors; bad entries: "
                              f"{', '.join(odd[:5])}{more}")
    refused = [(k, why) for k, v in state.items() if (why := tensor_problem(v)) is not None]
    if refused:
        more = f" (+{len(refused) - 3} more)" if len(refused) > 3 else ""
        shown = ", ".join(f"{k[:60]!r} is {why}" for k, why in refused[:3])
        raise CheckpointError(f"{where}: {len(refused)} tensor(s) cannot be weights: {shown}{more}; re-save the "
                              "model as a plain float32 state dict")
    if finite:
        bad, count = nonfinite_keys(state)
        if bad:
            more = f" (+{count - len(bad)} more)" if count > len(bad) else ""
            raise CheckpointError(
                f"{where}: {count} weight tensor(s) hold NaN or Inf values: {', '.join(bad)}{more}. Such a model "
                "predicts nothing useful (e.g. training diverged, or the file is damaged); use another checkpoint, "
                "or pass verify=False to load it anyway for inspection"
            )


def _check_meta(meta: dict[str, Any], state: dict[str, Any], path: Path, by_name: tuple[Family, str] | None
                ) -> tuple[Family, str, int, dict[int, str], int]:
    """Every metadata field, checked before anything is built: (family, size, nc, names, imgsz)."""
    where = str(path)
    schema = meta.get("schema_version")
    if schema is not None and str(schema).split(".")[0] != SCHEMA_VERSION.split(".")[0]:
        raise CheckpointError(f"{where}: 'schema_version' is {schema!r}; this LibreYOLO reads schema "
                              f"{SCHEMA_VERSION.split('.')[0]}.x checkpoints (update libreyolo, or re-save the file)")
    family_name, size = meta.get("model_family"), meta.get("size")
    if family_name is None:
        if by_name is None:
            raise CheckpointError(
                f"{path}: cannot tell the model family: the checkpoint has no 'model_family' and the file "
                "name does not follow LibreYOLO<family><size>.pt (e.g. LibreYOLO9t.pt)"
            )
        family_name = by_name[0].name
    family = get_family(check_str(family_name, "model_family", where, CheckpointError))
    if size is None and by_name is not None and by_name[0] is family:
        size = by_name[1]
    if size is None:
        raise CheckpointError(f"{path}: the checkpoint does not say which {family.name} size it is ('size' missing)")
    if not isinstance(size, str) or size not in family.sizes:
        raise CheckpointError(f"{path}: unknown {family.name} size {size!r}; known sizes: {', '.join(family.sizes)}")
    task = meta.get("task")
    if task is not None and task != family.task:
        raise CheckpointError(f"{where}: 'task' is {task!r}, but family {family.name} is a {family.task!r} model; "
                              "the file's metadata is inconsistent")
    nc, names = meta.get("nc"), meta.get("names")
    if nc is None and names is None:
        from libreyolo.tasks import get_task

        nc, names = get_task(family.task).class_defaults(None, None)  # a task without classes: its fixed names
    head_nc = family.state_nc(state)
    if nc is not None:
        nc = check_nc(nc, where, CheckpointError)
    elif names is not None:
        nc = check_nc(len(names) if isinstance(names, (dict, list, tuple)) else names, where, CheckpointError)
    else:
        nc = head_nc if head_nc is not None else 80
    if head_nc is not None and head_nc != nc:
        raise CheckpointError(f"{where}: 'nc' is {nc} but the weights' class head has {head_nc} outputs "
                              f"({family.nc_key}); the metadata does not describe these weights")
    names = default_names(nc) if names is None else check_names(names, nc, where, CheckpointError)
    imgsz = meta.get("imgsz")
    imgsz = family.default_imgsz_for(size) if imgsz is None else check_imgsz(imgsz, family.stride, where,
                                                                            CheckpointError)
    return family, size, nc, names, imgsz


def read_checkpoint(path: str | Path, *, verify: bool = True) -> Checkpoint:
    """Read a reference-format ``.pt`` (or a bare state dict whose file name says the family).

    Every metadata field is checked before anything is built (bounds in
    :mod:`libreyolo.utils.checks`); with ``verify`` (the default) weights holding NaN or Inf
    are refused too.
    """
    path = Path(path)
    check_link(path)
    if path.is_dir():
        raise CheckpointError(f"{path} is a folder, not a checkpoint file")
    if path.exists() and not path.is_file():
        raise CheckpointError(f"{path} is not a regular file (a device, pipe or socket), so not a checkpoint")
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    obj = _torch_load(path)
    if isinstance(obj, dict) and not obj:
        raise CheckpointError(f"{path} is not a LibreYOLO checkpoint: it holds an empty dict (no weights)")
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path} is not a LibreYOLO checkpoint (expected a dict, got {type(obj).__name__})")
    if "model" in obj and isinstance(obj["model"], dict):
        state, meta = obj["model"], {k: v for k, v in obj.items() if k != "model"}
    elif all(isinstance(v, torch.Tensor) for v in obj.values()):
        state, meta = obj, {}
    else:
        raise CheckpointError(
            f"{path} is not a LibreYOLO checkpoint: no 'model' state dict inside (keys: {sorted(map(str, obj))[:8]})"
        )
    check_state(state, str(path), finite=False)
    family, size, nc, names, imgsz = _check_meta(meta, state, path, family_from_filename(path.stem))
    if verify:
        check_state(family.finite_check_view(state), str(path))
    return Checkpoint(family, size, nc, names, imgsz, state, meta, str(path))


def check_link(path: Path) -> None:
    """A symbolic link that leads nowhere (dangling, or a loop) is named as such, not as "not found"."""
    import errno

    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CheckpointError(f"{path} is a symbolic link loop (too many levels of links); point it at a "
                                  "checkpoint file") from None
        if path.is_symlink():
            raise CheckpointError(f"{path} is a symbolic link to {os.readlink(path)!r}, which does not exist") from None


def load_state(model: torch.nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    """Load a state dict strictly; on mismatch say which keys are missing, unexpected or misshaped."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}"
              for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    # an integer tensor where the model has a float weight would be cast silently (int64 weights: no detections)
    shapes += [f"{k} {str(state[k].dtype).replace('torch.', '')} vs {str(own[k].dtype).replace('torch.', '')}"
               for k in own if k in state and own[k].is_floating_point() and not state[k].is_floating_point()]
    if missing or unexpected or shapes:
        parts = []
        groups = (("missing", missing), ("unexpected", unexpected), ("shape or dtype mismatch (file vs model)", shapes))
        for label, keys in groups:
            if keys:
                more = f" (+{len(keys) - 5} more)" if len(keys) > 5 else ""
                parts.append(f"{label}: {', '.join(keys[:5])}{more}")
        raise CheckpointError(f"{where}: the state dict does not match the architecture; " + "; ".join(parts))
    model.load_state_dict(state, strict=True)


def save_checkpoint(path: str | Path, model: torch.nn.Module, *, family: Family, size: str, nc: int,
                    names: dict[int, str], imgsz: int, extra: dict[str, Any] | None = None) -> Path:
    """Write a reference-format checkpoint atomically; ``extra`` entries (e.g. a training run's
    ``train_state`` for resuming) are stored beside the reference keys, which readers ignore."""
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
        **(extra or {}),
    }
    return atomic_write(path, lambda tmp: torch.save(payload, tmp))


HUB_TIMEOUT = 5.0  # seconds to wait for the Hub before saying it cannot be reached


def _hub_timeout() -> float:
    """``HF_HUB_ETAG_TIMEOUT`` when the user set it, else :data:`HUB_TIMEOUT`."""
    try:
        return float(os.environ["HF_HUB_ETAG_TIMEOUT"])
    except (KeyError, ValueError):
        return HUB_TIMEOUT


def _hub_reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def hub_download(stem: str) -> Path:
    """Fetch ``LibreYOLO/<stem>`` / ``<stem>.pt`` from the Hugging Face Hub into its cache.

    Fails fast and quietly: with ``HF_HUB_OFFLINE=1`` only the cache is read; a cached file is
    refreshed with one short request and used as it is when the Hub does not answer; otherwise
    one request without retries (timeout :data:`HUB_TIMEOUT` s, or ``HF_HUB_ETAG_TIMEOUT``)
    tells whether the Hub can be reached before anything is downloaded.
    """
    import inspect

    from libreyolo.errors import require

    hub = require("huggingface_hub", "hub", f"downloading {stem}.pt from the Hugging Face Hub")
    repo, filename = f"{HUB_ORG}/{stem}", f"{stem}.pt"
    timeout = _hub_timeout()
    elsewhere = (f"download {filename} from https://huggingface.co/{repo} on a machine with internet access and "
                 f"pass its path, e.g. LibreYOLO('path/to/{filename}')")
    constants = require("huggingface_hub.constants", "hub", "reading the Hugging Face settings")
    offline = getattr(constants, "is_offline_mode", lambda: constants.HF_HUB_OFFLINE)()
    cached = hub.try_to_load_from_cache(repo, filename)
    if offline:
        if isinstance(cached, str):
            return Path(cached)
        raise CheckpointError(f"{filename} is not a local file, HF_HUB_OFFLINE is set and it is not in the Hugging "
                              f"Face cache: {elsewhere} (or unset HF_HUB_OFFLINE to download it)")
    if not isinstance(cached, str):
        # one quick request, no retries: an unreachable Hub is reported now, not after ~25 s of back-off
        url = hub.hf_hub_url(repo, filename)
        kwargs: dict[str, Any] = {"timeout": timeout}
        if "retry_on_errors" in inspect.signature(hub.get_hf_file_metadata).parameters:
            kwargs["retry_on_errors"] = False
        try:
            hub.get_hf_file_metadata(url, **kwargs)
        except Exception as exc:
            status = getattr(getattr(exc, "response", None), "status_code", None)
            if status in (401, 403, 404) or type(exc).__name__ in ("RepositoryNotFoundError", "EntryNotFoundError",
                                                                    "RemoteEntryNotFoundError", "GatedRepoError"):
                raise CheckpointError(f"{filename} is not a local file, and the Hugging Face Hub has no {filename} "
                                      f"in {repo} (or it is private): check the name (e.g. LibreYOLO9t.pt) or "
                                      "pass the path of a checkpoint you have") from None
            raise CheckpointError(f"{filename} is not a local file, and the Hugging Face Hub cannot be reached to "
                                  f"download it ({_hub_reason(exc)}). If you are offline, {elsewhere}") from None
    try:
        return Path(hub.hf_hub_download(repo_id=repo, filename=filename, etag_timeout=timeout))
    except Exception as exc:
        raise CheckpointError(f"{filename} could not be downloaded from the Hugging Face Hub (repo {repo}): "
                              f"{_hub_reason(exc)}. If you are offline, {elsewhere}") from None
