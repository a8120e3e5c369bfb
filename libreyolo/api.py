"""``LibreYOLO(...)``: one entry point for checkpoints, architectures, Hub names and artifacts."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from libreyolo.checkpoint import check_link, default_names, hub_download, read_checkpoint
from libreyolo.errors import ArgumentError, CheckpointError
from libreyolo.export.formats import artifact_runtime
from libreyolo.models.registry import family_from_filename, get_family
from libreyolo.utils.checks import check_imgsz, check_names, check_nc, check_str, parse_bool, resolve_device


def _from_yaml(path: Path, nc: Any, names: Any, device: Any):
    from libreyolo.engine.model import Model

    spec: dict[str, Any] = {}
    if path.is_file():
        import yaml

        try:
            spec = yaml.safe_load(path.read_text()) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{path} is not a readable YAML file ({type(exc).__name__})") from None
        if not isinstance(spec, dict):
            raise CheckpointError(f"{path}: expected a mapping with family/size/nc, got {type(spec).__name__}")
    if "family" in spec:
        family = get_family(check_str(spec["family"], "family", str(path), CheckpointError))
        size = spec.get("size", family.default_size)
    else:
        found = family_from_filename(path.stem)
        if found is None:
            raise CheckpointError(
                f"{path.name}: cannot tell which architecture to build; use a name like LibreYOLO9t.yaml "
                "or a YAML file with 'family' and 'size'"
            )
        family, size = found
    if not isinstance(size, str) or size not in family.sizes:
        raise CheckpointError(f"{path}: unknown {family.name} size {size!r}; known: {', '.join(family.sizes)}")
    imgsz = spec.get("imgsz")
    imgsz = family.default_imgsz_for(size) if imgsz is None else check_imgsz(imgsz, family.stride, str(path),
                                                                            CheckpointError)
    from libreyolo.tasks import get_task

    task = get_task(family.task)
    if not task.has_classes:  # e.g. restoration: the fixed names of the task, as its checkpoints carry
        fixed_nc, fixed = task.class_defaults(nc, names)
        if spec.get("nc", fixed_nc) != fixed_nc or spec.get("names", fixed) not in (fixed, list(fixed.values())):
            raise CheckpointError(f"{path}: nc/names do not apply to {task.name} models (they carry "
                                  f"nc={fixed_nc}, names={fixed}); remove them from the file")
        return Model(family, size, nc=fixed_nc, names=fixed, imgsz=imgsz, device=device)
    # call arguments override the file; each is checked as coming from where it came from
    nc_where, nc_err = ("LibreYOLO()", ArgumentError) if nc is not None else (str(path), CheckpointError)
    names_where, names_err = ("LibreYOLO()", ArgumentError) if names is not None else (str(path), CheckpointError)
    nc = spec.get("nc") if nc is None else nc
    names = spec.get("names") if names is None else names
    if nc is not None:
        nc = check_nc(nc, nc_where, nc_err)
    elif names is not None:
        nc = check_nc(len(names) if isinstance(names, (dict, list, tuple)) else names, names_where, names_err)
    else:
        nc = 80
    names = default_names(nc) if names is None else check_names(names, nc, names_where, names_err)
    return Model(family, size, nc=nc, names=names, imgsz=imgsz, device=device)


def _bundled(name: str) -> Path | None:
    from libreyolo.assets import ASSETS

    candidate = ASSETS / name
    return candidate if name.endswith(".pt") and candidate.is_file() else None


def LibreYOLO(  # noqa: N802 - a factory named like the class users know
    model: str | Path,
    *,
    nc: int | None = None,
    names: dict[int, str] | list[str] | None = None,
    device: str | torch.device | None = None,
    verify: bool = True,
    compile: bool | str = False,  # noqa: A002 - the name torch users know
    **runtime_kwargs: Any,
):
    """Load a model.

    - ``"LibreYOLO9t.pt"`` or any path to a LibreYOLO checkpoint: the eager model with its weights.
      A name that is not a local file is downloaded from the Hugging Face Hub
      (``LibreYOLO/<stem>``, needs ``pip install 'libreyolo[hub]'``), unless the package ships a
      checkpoint of that name (``"LibreYOLO9t-shapes.pt"``, the demo detector of coloured shapes).
    - ``"LibreYOLO9t.yaml"``: the untrained architecture (``nc``/``names`` set the classes).
    - ``"x.onnx" | "x.pte" | "x.mlpackage" | "x.engine" | "x.pt2" | "x.tflite" | "x_ncnn_model/" |
      "x_openvino_model/"``: an exported artifact through its runtime, chosen by how the name ends
      (the format table, :mod:`libreyolo.export.formats`).
    - ``"grpc://host:8001/name"`` or ``"http://host:8000/name"``: a model served by Triton Inference Server
      (exported with ``format="triton"``; ``pip install 'libreyolo[triton]'``); a local Triton model folder
      (``<repository>/<name>``) runs the ``model.onnx`` it serves with ONNX Runtime.

    ``device``: ``cpu``, ``cuda``, ``cuda:N`` or ``mps`` (anything else is an error).
    ``verify`` (default True): refuse checkpoints whose weights hold NaN/Inf, and artifacts whose
    bytes or metadata no longer match the hashes recorded at export. ``verify=False`` loads them
    anyway (for inspection of a file you trust); metadata is still checked for consistency.
    ``compile`` (eager models; default False): run predict() through torch.compile of the inference
    copy, validated against the eager copy before first use (:meth:`Model.compile`): ``True``
    ("reduce-overhead" on CUDA, "default" on the CPU) or a torch.compile mode.
    """
    from libreyolo.engine.model import Model
    from libreyolo.engine.options import COMPILE_OPTION

    if not isinstance(model, (str, Path)):
        raise ArgumentError(f"model must be a path or a name such as 'LibreYOLO9t.pt', got {type(model).__name__}")
    verify = parse_bool("verify", verify)
    compile_mode = COMPILE_OPTION.check("compile", compile)  # checked before anything is loaded
    if compile_mode is not False:
        _refuse_artifact(model, compile_mode)  # before loading anything
        loaded = LibreYOLO(model, nc=nc, names=names, device=device, verify=verify, **runtime_kwargs)
        _refuse_artifact(loaded, compile_mode)
        return loaded.compile(compile_mode)
    from libreyolo.runtimes import triton

    if triton.is_url(model):  # only a Triton model (host:port/name); other URLs are refused, never fetched
        if nc is not None or names is not None:
            raise ArgumentError("nc/names do not apply to a Triton model: its classes come from the server's config")
        return triton.load(str(model), device=device, verify=verify, **runtime_kwargs)
    dev = resolve_device(device)
    path = Path(model)
    check_link(path)
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        if runtime_kwargs:
            raise TypeError(f"unexpected arguments for an architecture: {sorted(runtime_kwargs)}")
        return _from_yaml(path, nc, names, dev)
    if triton.is_model_folder(path):  # <repository>/<name> of export(format="triton"): the model.onnx it serves
        return triton.load(path, device=dev, verify=verify, **runtime_kwargs)
    if artifact_runtime(path) is not None:
        import importlib

        if not path.exists():
            raise CheckpointError(f"artifact not found: {path}")
        runtime = importlib.import_module(f"libreyolo.runtimes.{artifact_runtime(path)}")
        return runtime.load(path, device=dev, verify=verify, **runtime_kwargs)
    if runtime_kwargs:
        raise TypeError(f"unexpected arguments for an eager model: {sorted(runtime_kwargs)}")
    if not path.exists() and path.parent == Path(".") and _bundled(path.name) is not None:
        path = _bundled(path.name)  # a checkpoint shipped with the package (the demo's LibreYOLO9t-shapes.pt)
    if not path.exists():
        stem = path.stem if suffix in (".pt", "") else None
        looks_like_hub_name = stem is not None and path.parent == Path(".") and family_from_filename(stem)
        if not looks_like_hub_name:
            raise CheckpointError(f"model file not found: {path}")
        path = hub_download(stem)
    if nc is not None or names is not None:
        raise CheckpointError(
            "nc/names apply when building an architecture (LibreYOLO('LibreYOLO9t.yaml', nc=...)); "
            "a checkpoint carries its own classes"
        )
    ckpt = read_checkpoint(path, verify=verify)
    return Model.from_checkpoint(ckpt, device=dev)


def _refuse_artifact(model: Any, compile_mode: bool | str) -> None:
    """compile= applies to eager models only (a name or path here, or what was loaded)."""
    from libreyolo.engine.model import Model
    from libreyolo.runtimes import triton

    if isinstance(model, (str, Path)):
        what = model if (triton.is_url(model) or artifact_runtime(model) is not None) else None
    else:
        what = None if isinstance(model, Model) else type(model).__name__
    if what is not None:
        raise ArgumentError(f"compile={compile_mode!r} applies to eager models (a .pt checkpoint or a .yaml "
                            f"architecture), not to {str(what)[:80]!r}: an exported artifact is already compiled by "
                            "its runtime; drop compile=")
