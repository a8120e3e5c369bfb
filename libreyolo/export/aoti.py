"""AOTInductor export: ``torch.export`` -> Inductor (fused kernels) -> one self-describing ``.pt2`` package.

The network (Conv-BN folded, :func:`libreyolo.engine.inference.fold_conv_bn`) is exported with
``torch.export`` and compiled ahead of time by ``torch._inductor.aoti_compile_and_package``:
generated C++ (CPU) or Triton (CUDA) kernels plus a C++ wrapper, linked into a shared library
inside a PT2 archive. Compile time is paid once, here (a C++ compiler is needed: g++ or
clang++); loading the package takes well under a second. ``autotune=True`` (CUDA only) turns
on Inductor's ``max_autotune`` (benchmarks kernel configurations; much longer compile) with the
convolutions other than 1x1 left to cuDNN (:data:`CUDA_AUTOTUNE_CONFIGS` says why).

The package is self-describing: the LibreYOLO metadata is an extra file of the archive
(``extra/libreyolo_metadata.json``, the same key/value strings ONNX keeps in
``metadata_props``), and ``extra/libreyolo_build.json`` records the compile (seconds, Inductor
options, graph input/output shapes and operators). ``content_sha256`` covers every record
except the metadata file, so writing the metadata (twice: before and after validation) leaves
it unchanged, and the runtime checks both hashes on load.

The artifact runs on the device it was compiled for (recorded in ``export_args.device``).
Shapes: the exported batch and imgsz; ``dynamic=True`` makes the batch dynamic (1 to
``MAX_DYNAMIC_BATCH``), height and width stay fixed.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from libreyolo.export.base import Exporter, ExportError, ExportOptions

METADATA_FILE = "extra/libreyolo_metadata.json"
BUILD_FILE = "extra/libreyolo_build.json"
MAX_DYNAMIC_BATCH = 256
# records the torch archive writer adds by itself (written anew on every rewrite)
_WRITER_RECORDS = (".data/",)
# CPU: weights frozen into the program (constant folding, prepacked convolution weights) and
# channels-last convolutions: about 10% faster than neither on the 2-core test machine (YOLOv9-t,
# 160: 18.1 vs 20.8 ms, one thread) and a shorter compile; line tables only cost compile time
CPU_INDUCTOR_CONFIGS: dict[str, Any] = {"aot_inductor.enable_line_tables": False, "freezing": True}
# autotune=True on CUDA: max_autotune benchmarks Triton configurations of the pointwise and
# reduction kernels and of the matrix products, which include every 1x1 convolution (Inductor
# lowers a stride-1, unpadded 1x1 convolution to a matmul with its bias and activation fused in
# when it autotunes). The other convolutions keep cuDNN: Inductor's Triton convolution templates
# cost about 9 s of benchmarking per convolution shape on the H200 (YOLOv9-t has 26 such shapes
# besides its 28 1x1 ones: the full search did not finish in 7 minutes,
# bench/results/2026-12-04-aoti-autotune-h200-timeout.log), and torch's own config notes that
# on CUDA they show no gains on an H100 (it keeps them off for the backward convolutions).
CUDA_AUTOTUNE_CONFIGS: dict[str, Any] = {"max_autotune": True, "max_autotune_conv_backends": "ATEN"}


def cxx_compiler() -> str | None:
    """The C++ compiler Inductor will use for a CPU package (``CXX`` or the usual names), or None."""
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def process_libstdcxx() -> str | None:
    """Path of the libstdc++ shared library this process runs with (Linux), or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if line.strip() else ""
                if "/libstdc++.so" in path and os.path.isfile(path):
                    return path
    except OSError:
        return None
    return None


def static_libstdcxx_reason(cxx: str) -> str | None:
    """Why ``cxx`` would link libstdc++ statically into a shared library, or None.

    A compiler install that has only ``libstdc++.a`` (``cxx -print-file-name=libstdc++.so``
    answers the bare name: the shared one is not on its search path) links a private copy of
    libstdc++ into the package's wrapper library, and exports its symbols.
    """
    try:
        found = subprocess.run([cxx, "-print-file-name=libstdc++.so"], capture_output=True, text=True,
                               timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if not found or os.path.isabs(found):
        return None
    return f"{cxx} finds no shared libstdc++ (-print-file-name=libstdc++.so gives {found!r}), only the static one"


@contextlib.contextmanager
def shared_libstdcxx(cxx: str | None = None) -> Iterator[str | None]:
    """Compile with Inductor so that the package links the libstdc++ this process runs with.

    Why: a wrapper library with a private static copy of libstdc++, loaded into a process that
    runs the shared one (every PyTorch process), mixes the two copies' locale tables, and the
    package loader dies with SIGSEGV inside ``std::regex`` (``parse_device_str``, while the
    model container is built). Seen on the H200 image (GCC 13.3 under /opt/gcc without its
    shared libstdc++, torch 2.11): every CUDA package crashed there, or most of them, depending
    on the process's state.

    Only when the compiler would link statically (:func:`static_libstdcxx_reason`): the compile
    runs through a two-line wrapper script that adds ``-L`` a temporary folder holding
    ``libstdc++.so`` -> this process's library (``-L`` folders come before the compiler's own).
    Yields what was done (for the build record), or None when nothing was needed.
    """
    from torch._inductor import config
    from torch._inductor.cpp_builder import get_cpp_compiler

    if cxx is None:
        try:
            cxx = get_cpp_compiler()
        except Exception:  # no compiler: the compile itself reports it
            yield None
            return
    reason = static_libstdcxx_reason(cxx)
    lib = process_libstdcxx() if reason else None
    if lib is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="libreyolo-cxx-") as tmp:
        libdir = Path(tmp, "lib")
        libdir.mkdir()
        (libdir / "libstdc++.so").symlink_to(lib)
        script = Path(tmp, "cxx")
        script.write_text(f'#!/bin/sh\nexec {shlex.quote(cxx)} "$@" -L{shlex.quote(str(libdir))}\n')
        script.chmod(0o755)
        with config.patch({"cpp.cxx": (str(script),)}):
            yield f"{reason}; linked against {lib} instead"


def carries_static_libstdcxx(path: str | Path) -> bool | None:
    """Whether the package's wrapper library was linked without the shared libstdc++ (so it carries
    a static copy: see :func:`shared_libstdcxx`); None if the archive holds no library or cannot be read.

    Read from the library's bytes: a library that loads the shared libstdc++ names
    ``libstdc++.so.6`` among the libraries it needs."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            libs = [n for n in z.namelist() if n.endswith(".so")]
            if not libs:
                return None
            return not any(b"libstdc++.so.6" in z.read(n) for n in libs)
    except (OSError, zipfile.BadZipFile):
        return None


# --- the archive ------------------------------------------------------------------------------
def _open(path: Path) -> Any:
    """A PT2 archive reader, or a CheckpointError when ``path`` is not a PT2 package."""
    from torch.export.pt2_archive import PT2ArchiveReader

    try:
        return PT2ArchiveReader(str(path))
    except Exception as exc:  # noqa: BLE001 - any reader failure means "not a PT2 package"
        from libreyolo.errors import CheckpointError

        first = str(exc).split(". ")[0].strip()
        raise CheckpointError(f"{path} is not a readable PT2 package ({type(exc).__name__}: {first})") from None


def _records(path: Path) -> dict[str, bytes]:
    reader = _open(path)
    return {name: reader.read_bytes(name) for name in reader.get_file_names()}


def read_record(path: Path, name: str) -> bytes | None:
    """One record of the package, or None when it has none of that name."""
    reader = _open(path)
    return reader.read_bytes(name) if name in reader.get_file_names() else None


def archive_prefix(path: Path) -> str:
    """The folder every record of the package sits under (the file's stem when it was written)."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        names = z.namelist()
    return names[0].split("/", 1)[0] if names else Path(path).stem


def rewrite(path: Path, replace: dict[str, bytes]) -> None:
    """Write the package again with ``replace``'s records added or replaced (atomically).

    The archive writer names the records' top folder after the file it writes, so the temporary
    file carries the package's own prefix (in a private folder beside it): a package whose records
    moved under another folder no longer loads on CUDA."""
    import shutil
    import tempfile

    from torch.export.pt2_archive import PT2ArchiveWriter

    records = _records(path)
    records.update(replace)
    work = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".rewrite", dir=path.parent))
    tmp = work / f"{archive_prefix(path)}.pt2"
    try:
        with PT2ArchiveWriter(str(tmp)) as writer:
            for name in sorted(records):
                if not name.startswith(_WRITER_RECORDS):
                    writer.write_bytes(name, records[name])
        os.replace(tmp, path)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def pt2_content_sha256(path: str | Path) -> str:
    """sha256 of every record of the package except the LibreYOLO metadata (name, then its hash)."""
    h = hashlib.sha256()
    for name, data in sorted(_records(Path(path)).items()):
        if name == METADATA_FILE or name.startswith(_WRITER_RECORDS):
            continue
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def read_metadata_strings(path: str | Path) -> dict[str, str]:
    """The stored key/value metadata strings (empty when the package has none)."""
    from libreyolo.errors import CheckpointError

    raw = read_record(Path(path), METADATA_FILE)
    if raw is None:
        return {}
    from libreyolo.utils.checks import load_json

    props = load_json(raw, f"{path}: its LibreYOLO metadata", CheckpointError)  # bounded size and depth
    if not isinstance(props, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in props.items()):
        raise CheckpointError(f"{path}: its LibreYOLO metadata is not a mapping of strings; re-export it")
    return props


def read_build_info(path: str | Path) -> dict[str, Any]:
    from libreyolo.errors import CheckpointError
    from libreyolo.utils.checks import load_json

    raw = read_record(Path(path), BUILD_FILE)
    info = load_json(raw, f"{path}: its build record", CheckpointError) if raw else {}
    if not isinstance(info, dict):
        raise CheckpointError(f"{path}: its build record is not a mapping; re-export it")
    return info


# --- the compile ------------------------------------------------------------------------------
def compile_package(module: torch.nn.Module, example: torch.Tensor, path: Path, opts: ExportOptions) -> dict[str, Any]:
    """Export ``module`` and compile it into a ``.pt2`` at ``path``; returns the build record."""
    from libreyolo.engine.inference import fold_conv_bn

    folded = fold_conv_bn(module, example.dtype)
    channels_last = opts.device.type == "cpu"
    if channels_last:
        module = module.to(memory_format=torch.channels_last)
    dynamic_shapes = None
    if opts.dynamic:
        batch = torch.export.Dim("batch", min=1, max=MAX_DYNAMIC_BATCH)
        dynamic_shapes = ({0: batch},)
        if example.shape[0] == 1:  # torch.export specialises a size-1 example dimension to a constant
            example = example.expand(2, *example.shape[1:]).contiguous()
    configs = dict(CPU_INDUCTOR_CONFIGS) if opts.device.type == "cpu" else {}
    if getattr(opts, "autotune", False):
        configs.update(CUDA_AUTOTUNE_CONFIGS)
    recorded = dict(configs)  # aoti_compile_and_package adds its own entries to the dict it is given
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            program = torch.export.export(module, (example,), dynamic_shapes=dynamic_shapes, strict=False)
        except Exception as exc:
            raise ExportError(f"torch.export failed for the AOTInductor package: {type(exc).__name__}: {exc}") from exc
        exported = time.perf_counter()
        try:
            with shared_libstdcxx() as libstdcxx:
                torch._inductor.aoti_compile_and_package(program, package_path=str(path), inductor_configs=configs)
        except Exception as exc:
            raise ExportError(f"AOTInductor compilation failed: {type(exc).__name__}: {exc}") from exc
    done = time.perf_counter()
    names = list(module.output_names())
    outputs = [n.meta.get("val") for n in program.graph.output_node().args[0]] if program.graph else []
    build = {
        "export_s": round(exported - start, 2), "compile_s": round(done - exported, 2),
        "inductor_configs": recorded, "conv_bn_folded": folded, "channels_last": channels_last,
        "libstdcxx": libstdcxx or "as the compiler links it",
        "device": str(opts.device), "torch": torch.__version__,
        "inputs": {module.contract.input_name: _shape(example, {0} if opts.dynamic else set())},
        "outputs": {n: _shape(v, {0} if opts.dynamic else set()) for n, v in zip(names, outputs, strict=False)},
        "ops": sorted({str(n.target) for n in program.graph.nodes if n.op == "call_function"}),
    }
    rewrite(path, {BUILD_FILE: json.dumps(build, sort_keys=True).encode()})
    return build


def _shape(t: Any, dynamic: set[int]) -> list[int | None]:
    shape = getattr(t, "shape", ())
    return [None if i in dynamic else int(s) for i, s in enumerate(shape)]


class AotiExporter(Exporter, format="aoti"):
    toolchain = ()

    def check(self, opts: ExportOptions) -> None:
        if opts.device.type not in ("cpu", "cuda"):
            from libreyolo.errors import ArgumentError

            raise ArgumentError(f"AOTInductor packages are compiled for cpu or cuda, got device={opts.device}")
        if opts.device.type == "cpu" and cxx_compiler() is None:
            raise ExportError("format=aoti on the CPU compiles C++ and needs a C++ compiler (g++ or clang++; "
                              "e.g. apt-get install g++), or set CXX; none was found on PATH")
        if getattr(opts, "autotune", False) and opts.device.type != "cuda":
            from libreyolo.errors import ArgumentError

            raise ArgumentError("autotune=True applies to CUDA packages (Triton kernel tuning); export with "
                                "device=cuda or without autotune")

    def build(self, module: torch.nn.Module, example: torch.Tensor, path: Path, opts: ExportOptions,
              work: Path) -> None:
        compile_package(module, example, path, opts)

    def write_metadata(self, path: Path, encoded: dict[str, str], meta: dict[str, Any]) -> None:
        rewrite(path, {METADATA_FILE: json.dumps(encoded, sort_keys=True).encode()})

    def content_sha256(self, path: Path) -> str:
        return pt2_content_sha256(path)

    def graph_ops(self, path: Path) -> set[str]:
        return set(read_build_info(path).get("ops", []))


EXPORTER = AotiExporter()
