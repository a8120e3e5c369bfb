"""The metadata every artifact carries, so that a runtime needs nothing but the file.

Written by the exporters, read by the runtimes. ONNX keeps it in ``metadata_props``, CoreML
in the package's user-defined metadata (one string per key); ExecuTorch programs and
TensorRT engines have no room for it, so it goes into a sidecar ``<artifact>.json`` bound to
the artifact by its sha256.
"""
from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path
from typing import Any

from libreyolo.errors import CheckpointError

METADATA_VERSION = "1"

# key -> type; strings are stored as they are, everything else as JSON
FIELDS: dict[str, type] = {
    "libreyolo_metadata": str,
    "format": str,
    "family": str,
    "size": str,
    "task": str,
    "nc": int,
    "names": dict,
    "imgsz": int,
    "batch": int,
    "stride": int,
    "input_name": str,
    "output_names": list,
    "input_dtype": str,
    "normalization": dict,
    "letterbox": dict,
    "precision": str,
    "dynamic_axes": dict,
    "nms": dict,
    "export_args": dict,
    "versions": dict,
    "source_weights_sha256": str,
    "validation": dict,
}
REQUIRED = ("libreyolo_metadata", "format", "family", "size", "task", "names", "imgsz", "batch", "stride",
            "input_name", "output_names", "input_dtype", "letterbox", "precision", "dynamic_axes")


def encode(meta: dict[str, Any]) -> dict[str, str]:
    """Metadata as strings, for formats that store key/value strings."""
    out = {}
    for key, value in meta.items():
        if value is None:
            continue
        out[key] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return out


def decode(props: dict[str, str], where: str) -> dict[str, Any]:
    """Inverse of :func:`encode`; raises a CheckpointError naming the keys that are missing."""
    missing = [k for k in REQUIRED if k not in props]
    if missing:
        raise CheckpointError(
            f"{where} has no LibreYOLO metadata (missing keys: {', '.join(missing)}); export it with "
            "`libreyolo export` or model.export(), which records what the runtime needs"
        )
    meta: dict[str, Any] = {}
    for key, raw in props.items():
        kind = FIELDS.get(key)
        if kind is None or kind is str:
            meta[key] = raw
            continue
        try:
            meta[key] = json.loads(raw)
        except (TypeError, ValueError):
            raise CheckpointError(f"{where}: metadata key {key!r} is not valid JSON: {raw[:60]!r}") from None
    meta["names"] = {int(k): str(v) for k, v in meta["names"].items()}
    return meta


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sha256_state(net: Any) -> str:
    """Hash of a network's weights, for a model that was not loaded from a file."""
    h = hashlib.sha256()
    for key, value in sorted(net.state_dict().items()):
        h.update(key.encode())
        h.update(value.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def sidecar_path(artifact: str | Path) -> Path:
    artifact = Path(artifact)
    return artifact.with_name(artifact.name + ".json")


def write_sidecar(artifact: str | Path, meta: dict[str, Any]) -> Path:
    """Write ``<artifact>.json`` holding the metadata and the artifact's sha256."""
    path = sidecar_path(artifact)
    payload = {"artifact": Path(artifact).name, "sha256": sha256_file(artifact), "metadata": meta}
    path.write_text(json.dumps(payload, indent=1, sort_keys=True))
    return path


def read_sidecar(artifact: str | Path) -> dict[str, Any]:
    """Metadata from the sidecar of ``artifact``, after checking that it belongs to this file."""
    artifact = Path(artifact)
    path = sidecar_path(artifact)
    if not path.is_file():
        raise CheckpointError(
            f"{artifact}: its metadata file {path.name} is missing; keep the two files together "
            "(re-export to recreate them)"
        )
    try:
        payload = json.loads(path.read_text())
        digest, meta = payload["sha256"], payload["metadata"]
    except (ValueError, KeyError, TypeError):
        raise CheckpointError(f"{path} is not a LibreYOLO metadata file (corrupt JSON)") from None
    if digest != sha256_file(artifact):
        raise CheckpointError(
            f"{path.name} describes another file than {artifact.name} (sha256 differs): the artifact was "
            "changed or replaced after export; re-export it"
        )
    return decode(encode(meta), str(artifact))


def package_version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def toolchain_versions(*dists: str) -> dict[str, str]:
    """Versions of the packages that produced an artifact (only those installed)."""
    from libreyolo._version import __version__

    versions = {"libreyolo": __version__, "python": platform.python_version()}
    for name in ("torch", *dists):
        found = package_version(name)
        if found is not None:
            versions[name] = found
    return versions
