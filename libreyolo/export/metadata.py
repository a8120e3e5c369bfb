"""The metadata every artifact carries, so that a runtime needs nothing but the file.

Written by the exporters, read by the runtimes. ONNX keeps it in ``metadata_props``, CoreML
in the package's user-defined metadata (one string per key); ExecuTorch programs and
TensorRT engines have no room for it, so it goes into a sidecar ``<artifact>.json`` bound to
the artifact by its sha256.

Integrity: every artifact's metadata carries ``content_sha256`` (the model bytes: the whole
file for ``.pte``/``.engine``, the ONNX model minus its ``metadata_props`` so that writing
metadata does not change what is hashed) and ``metadata_sha256`` (every metadata entry except
``validation`` and the two hashes). Runtimes check both on load (:func:`check_integrity`);
``LibreYOLO(path, verify=False)`` skips the check for a file the user trusts.
"""
from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path
from typing import Any

from libreyolo.errors import CheckpointError
from libreyolo.utils.checks import MAX_JSON_BYTES, load_json

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
    "quantization": dict,
    "runtime_config": dict,
    "e2e": dict,
    "content_sha256": str,
    "metadata_sha256": str,
}
# entries outside metadata_sha256: the validation report is written after the first stamp, and
# the hashes cannot cover themselves
UNHASHED = ("validation", "content_sha256", "metadata_sha256")
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
        meta[key] = load_json(raw, f"{where}: metadata key {key!r}", CheckpointError)
    names = meta["names"]
    if isinstance(names, dict) and all(isinstance(k, str) and k.isdigit() for k in names):
        meta["names"] = {int(k): v for k, v in names.items()}  # checked by the runtime (check_names)
    return meta


def json_normalised(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` as it reads back from JSON (int keys become strings, tuples lists), without the hashes."""
    return json.loads(json.dumps({k: v for k, v in meta.items() if k not in UNHASHED[1:]}))


def metadata_sha256(encoded: dict[str, str]) -> str:
    """Hash of the encoded metadata entries, except :data:`UNHASHED`, in key order."""
    body = json.dumps(sorted((k, v) for k, v in encoded.items() if k not in UNHASHED))
    return hashlib.sha256(body.encode()).hexdigest()


def stamp(meta: dict[str, Any], content_sha256: str) -> dict[str, str]:
    """The encoded metadata to store, with ``content_sha256`` and ``metadata_sha256`` added."""
    encoded = encode(json_normalised(meta))
    encoded["content_sha256"] = content_sha256
    encoded["metadata_sha256"] = metadata_sha256(encoded)
    return encoded


def check_integrity(encoded: dict[str, str], content_sha256: str, where: str) -> None:
    """Compare an artifact's bytes and metadata with the hashes stored at export."""
    missing = [k for k in REQUIRED if k not in encoded]
    if missing:  # not a LibreYOLO artifact at all: say that, not that its hashes are missing
        decode(encoded, where)
    again = "Re-export it, or load it with LibreYOLO(path, verify=False) if you trust the file"
    stored_content, stored_meta = encoded.get("content_sha256"), encoded.get("metadata_sha256")
    if not stored_content or not stored_meta:
        raise CheckpointError(f"{where} carries no integrity hashes (content_sha256/metadata_sha256: exported by an "
                              f"older LibreYOLO, or its metadata was rewritten), so it cannot be verified. {again}")
    if content_sha256 != stored_content:
        raise CheckpointError(
            f"{where}: the model bytes do not match the hash recorded at export (sha256 differs: "
            f"{content_sha256[:12]}... vs {stored_content[:12]}...): the file is damaged or was changed after "
            f"export. {again}"
        )
    if metadata_sha256(encoded) != stored_meta:
        raise CheckpointError(
            f"{where}: its LibreYOLO metadata was edited after export (it no longer matches metadata_sha256; "
            f"classes, shapes, NMS settings or other recorded fields differ from what was exported). {again}"
        )


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _records(view: memoryview):
    """(field number, record start, payload start, record end) of each top-level protobuf record."""
    pos = 0
    while pos < len(view):
        start = pos
        key, pos = _varint(view, pos)
        field_number, wire = key >> 3, key & 7
        payload = pos
        if wire == 0:
            _, pos = _varint(view, pos)
        elif wire == 1:
            pos += 8
        elif wire == 2:
            length, payload = _varint(view, pos)
            pos = payload + length
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > len(view) or field_number == 0:
            raise ValueError("truncated protobuf record")
        yield field_number, start, payload, pos


def _hash_proto(view: memoryview, h: Any, skip: dict[int, Any]) -> None:
    """Feed ``view``'s records to ``h``, leaving out fields mapped to None and descending into
    fields mapped to a nested ``skip`` table (their tag and contents are hashed, not their length)."""
    for number, start, payload, end in _records(view):
        rule = skip.get(number, ...)
        if rule is None:
            continue
        if isinstance(rule, dict):
            h.update(view[start:start + 1])
            _hash_proto(view[payload:end], h, rule)
        else:
            h.update(view[start:end])


ONNX_SKIP = {14: None}  # ModelProto.metadata_props
COREML_SKIP = {2: {100: None}}  # Model.description.metadata (author, version, user-defined entries)


def onnx_content_sha256(data: bytes) -> str:
    """sha256 of a serialised ONNX ModelProto without its ``metadata_props`` records.

    Read from the wire format: every other byte of the file is hashed as it is, so the hash
    does not depend on how a protobuf library re-serialises the model, and writing metadata
    (field 14) never changes it. Raises ``ValueError`` for bytes that are not a protobuf message.
    """
    h = hashlib.sha256()
    _hash_proto(memoryview(data), h, ONNX_SKIP)
    return h.hexdigest()


def mlpackage_content_sha256(package: str | Path) -> str:
    """sha256 of a CoreML package: every file by relative path, the model spec without its metadata.

    ``Manifest.json`` (an index of the files, rewritten on save) is left out; the spec
    (``*.mlmodel``) is hashed without ``description.metadata``, where the LibreYOLO metadata lives.
    """
    package = Path(package)
    h = hashlib.sha256()
    for file in sorted(p for p in package.rglob("*") if p.is_file() and p.name != "Manifest.json"):
        h.update(file.relative_to(package).as_posix().encode() + b"\0")
        data = file.read_bytes()
        if file.suffix == ".mlmodel":
            _hash_proto(memoryview(data), h, COREML_SKIP)
        else:
            h.update(hashlib.sha256(data).digest())
    return h.hexdigest()


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
    """Write ``<artifact>.json`` holding the metadata, stamped with the artifact's hashes."""
    path = sidecar_path(artifact)
    encoded = stamp(meta, sha256_file(artifact))
    stored = json_normalised(meta) | {k: encoded[k] for k in UNHASHED[1:]}
    payload = {"artifact": Path(artifact).name, "sha256": encoded["content_sha256"], "metadata": stored}
    from libreyolo.utils.atomic import atomic_write

    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(payload, indent=1, sort_keys=True)))
    return path


def read_sidecar(artifact: str | Path, *, verify: bool = True) -> dict[str, Any]:
    """Metadata from the sidecar of ``artifact``; with ``verify``, checked against the artifact's hashes."""
    artifact = Path(artifact)
    path = sidecar_path(artifact)
    if not path.is_file():
        raise CheckpointError(
            f"{artifact}: its metadata file {path.name} is missing; keep the two files together "
            "(re-export to recreate them)"
        )
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise CheckpointError(f"{path} is {path.stat().st_size:,} bytes, too large for a metadata file")
        payload = load_json(path.read_bytes(), str(path), CheckpointError)
        meta = payload["metadata"]
        if not isinstance(meta, dict):
            raise TypeError
    except CheckpointError:
        raise
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise CheckpointError(f"{path} is not a LibreYOLO metadata file (corrupt JSON)") from None
    encoded = encode(meta)
    if verify:
        check_integrity(encoded, sha256_file(artifact), f"{artifact} (with {path.name})")
    return decode(encoded, str(artifact))


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


FOLDER_METADATA = "metadata.json"  # a folder artifact's metadata file (NCNN)


def folder_content_sha256(folder: str | Path, skip: tuple[str, ...] = (FOLDER_METADATA,),
                          data: dict[str, bytes] | None = None) -> str:
    """sha256 of a folder artifact: every file by relative path and content, except ``skip``; a
    file's content is ``data[relative path]`` where given (the bytes a runtime read and will load,
    so what is checked is what runs)."""
    folder = Path(folder)
    data = data or {}
    h = hashlib.sha256()
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = file.relative_to(folder).as_posix()
        if rel in skip:
            continue
        digest = hashlib.sha256(data[rel]).hexdigest() if rel in data else sha256_file(file)
        h.update(rel.encode() + b"\0" + bytes.fromhex(digest))
    return h.hexdigest()


def write_folder_metadata(folder: str | Path, encoded: dict[str, str], meta: dict[str, Any]) -> Path:
    """``<folder>/metadata.json``: the metadata stamped with the folder's hashes (``encoded``)."""
    path = Path(folder) / FOLDER_METADATA
    stored = json_normalised(meta) | {k: encoded[k] for k in UNHASHED[1:]}
    from libreyolo.checkpoint import atomic_write

    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(stored, indent=1, sort_keys=True)))
    return path


def read_folder_metadata(folder: str | Path, *, verify: bool = True, content: str | None = None) -> dict[str, Any]:
    """Metadata of a folder artifact; with ``verify``, checked against the folder's hashes
    (``content``: the folder's content hash where the caller computed it, else computed here)."""
    folder = Path(folder)
    path = folder / FOLDER_METADATA
    if not path.is_file():
        raise CheckpointError(f"{folder}: its metadata file {FOLDER_METADATA} is missing; it is not a LibreYOLO "
                              "export (or the folder is incomplete): re-export it")
    if path.stat().st_size > MAX_JSON_BYTES:
        raise CheckpointError(f"{path} is {path.stat().st_size:,} bytes, too large for a metadata file")
    meta = load_json(path.read_bytes(), str(path), CheckpointError)
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path} is not a LibreYOLO metadata file (expected a JSON object)")
    encoded = encode(meta)
    if verify:
        check_integrity(encoded, folder_content_sha256(folder) if content is None else content, str(folder))
    return decode(encoded, str(folder))
