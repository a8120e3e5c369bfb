"""``LibreYOLO(...)``: one entry point for checkpoints, architectures, Hub names and artifacts."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from libreyolo.checkpoint import default_names, hub_download, read_checkpoint
from libreyolo.errors import CheckpointError
from libreyolo.models.registry import family_from_filename, get_family

# artifact suffix -> runtime module under libreyolo.runtimes (filled by the export layer)
ARTIFACT_SUFFIXES = {".onnx": "onnx", ".pte": "executorch", ".mlpackage": "coreml", ".engine": "tensorrt"}


def _from_yaml(path: Path, nc: int | None, names: Any, device: Any):
    from libreyolo.engine.model import Model

    spec: dict[str, Any] = {}
    if path.is_file():
        import yaml

        spec = yaml.safe_load(path.read_text()) or {}
        if not isinstance(spec, dict):
            raise CheckpointError(f"{path}: expected a mapping with family/size/nc, got {type(spec).__name__}")
    if "family" in spec:
        family = get_family(str(spec["family"]))
        size = str(spec.get("size", family.default_size))
    else:
        found = family_from_filename(path.stem)
        if found is None:
            raise CheckpointError(
                f"{path.name}: cannot tell which architecture to build; use a name like LibreYOLO9t.yaml "
                "or a YAML file with 'family' and 'size'"
            )
        family, size = found
    if size not in family.sizes:
        raise CheckpointError(f"{path}: unknown {family.name} size {size!r}; known: {', '.join(family.sizes)}")
    if names is None:
        names = spec.get("names")
    nc = int(nc if nc is not None else spec.get("nc", len(names) if names else 80))
    names = dict(enumerate(names)) if isinstance(names, (list, tuple)) else names
    names = {int(k): str(v) for k, v in (names or default_names(nc)).items()}
    if len(names) != nc:
        raise CheckpointError(f"names has {len(names)} entries but nc is {nc}")
    imgsz = int(spec.get("imgsz", family.default_imgsz))
    return Model(family, size, nc=nc, names=names, imgsz=imgsz, device=device)


def LibreYOLO(  # noqa: N802 - a factory named like the class users know
    model: str | Path,
    *,
    nc: int | None = None,
    names: dict[int, str] | list[str] | None = None,
    device: str | torch.device | None = None,
    **runtime_kwargs: Any,
):
    """Load a model.

    - ``"LibreYOLO9t.pt"`` or any path to a LibreYOLO checkpoint: the eager model with its weights.
      A name that is not a local file is downloaded from the Hugging Face Hub
      (``LibreYOLO/<stem>``, needs ``pip install 'libreyolo[hub]'``).
    - ``"LibreYOLO9t.yaml"``: the untrained architecture (``nc``/``names`` set the classes).
    - ``"x.onnx" | "x.pte" | "x.mlpackage" | "x.engine"``: an exported artifact through its runtime.
    """
    from libreyolo.engine.model import Model

    path = Path(model)
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        return _from_yaml(path, nc, names, device)
    if suffix in ARTIFACT_SUFFIXES:
        import importlib

        if not path.exists():
            raise CheckpointError(f"artifact not found: {path}")
        runtime = importlib.import_module(f"libreyolo.runtimes.{ARTIFACT_SUFFIXES[suffix]}")
        return runtime.load(path, device=device, **runtime_kwargs)
    if runtime_kwargs:
        raise TypeError(f"unexpected arguments for an eager model: {sorted(runtime_kwargs)}")
    if not path.exists():
        stem = path.stem if suffix in (".pt", "") else None
        looks_like_hub_name = stem is not None and path.parent == Path(".") and family_from_filename(stem)
        if not looks_like_hub_name:
            raise CheckpointError(f"model file not found: {path}")
        path = hub_download(stem)
    ckpt = read_checkpoint(path)
    if nc is not None or names is not None:
        raise CheckpointError(
            "nc/names apply when building an architecture (LibreYOLO('LibreYOLO9t.yaml', nc=...)); "
            "a checkpoint carries its own classes"
        )
    return Model.from_checkpoint(ckpt, device=device)
