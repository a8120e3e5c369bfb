"""Issue 49, defect 1 and the benchmark temp folder: writes that cannot lose the old artifact.

Every multi-file artifact is installed by :func:`libreyolo.utils.tempfiles.replace_folder`. These
tests interrupt it at each rename step: by an exception, by a real SIGTERM/SIGINT sent from a
wrapped ``os.replace`` (in a subprocess, so the process really dies of it), and by SIGKILL (no
handler runs; the next write recovers). After each, the destination holds a complete version, the
old or the new, and the old one is never lost. The Triton case runs the export driver end to end
(on the code before this change it lost both folders: exit -15, model folder gone).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from libreyolo.utils.tempfiles import aside_prefix, recover_folder, replace_folder

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 120  # seconds: a subprocess that imports torch; they take ~3 s here


def _folder(path: Path, version: str) -> Path:
    (path / "1").mkdir(parents=True)
    (path / "config.pbtxt").write_text(f"version {version}\n")
    (path / "1" / "model.onnx").write_text(version * 100)
    return path


def _version(path: Path) -> str:
    """The version a folder holds, checking it is complete (both files, consistent)."""
    config = (path / "config.pbtxt").read_text().split()[1]
    body = (path / "1" / "model.onnx").read_text()
    assert body == config * 100, f"{path} is incomplete or mixed"
    return config


def _asides(folder: Path, final: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.startswith(aside_prefix(final))]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# --- in-process: exceptions at each step ------------------------------------------------------
def test_a_new_folder_replaces_the_old_and_nothing_is_left_beside_it(tmp_path):
    final, built = _folder(tmp_path / "yolo", "old"), _folder(tmp_path / ".build" / "yolo", "new")
    replace_folder(built, final)
    assert _version(final) == "new" and not _asides(tmp_path, final) and not built.exists()


@pytest.mark.parametrize("step", [1, 2])
def test_an_exception_at_a_rename_leaves_the_old_folder_in_place(tmp_path, monkeypatch, step):
    final, built = _folder(tmp_path / "yolo", "old"), _folder(tmp_path / ".build" / "yolo", "new")
    real, calls = os.replace, []

    def failing(src, dst):
        calls.append(src)
        if len(calls) == step:
            raise OSError("simulated failure")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError, match="simulated"):
        replace_folder(built, final)
    monkeypatch.setattr(os, "replace", real)
    assert _version(final) == "old" and not _asides(tmp_path, final)
    assert _version(built) == "new"  # the caller's build folder is still there to remove


def test_an_exception_after_the_new_folder_arrived_keeps_the_new_one(tmp_path, monkeypatch):
    final, built = _folder(tmp_path / "yolo", "old"), _folder(tmp_path / ".build" / "yolo", "new")
    real, calls = os.replace, []

    def late(src, dst):
        calls.append(src)
        real(src, dst)
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", late)
    with pytest.raises(KeyboardInterrupt):
        replace_folder(built, final)
    monkeypatch.setattr(os, "replace", real)
    assert _version(final) == "new"
    replace_folder(_folder(tmp_path / ".b2" / "yolo", "newer"), final)  # the next write cleans the aside
    assert _version(final) == "newer" and not _asides(tmp_path, final)


def test_an_old_folder_left_aside_by_a_hard_kill_is_put_back(tmp_path):
    final = tmp_path / "yolo"
    _folder(tmp_path / f"{aside_prefix(final)}{_dead_pid()}", "old")  # killed between the two renames
    recover_folder(final)
    assert _version(final) == "old" and not _asides(tmp_path, final)


def test_an_old_folder_left_aside_after_the_new_one_arrived_is_removed(tmp_path):
    final = _folder(tmp_path / "yolo", "new")
    _folder(tmp_path / f"{aside_prefix(final)}{_dead_pid()}", "old")  # killed before the old one was deleted
    replace_folder(_folder(tmp_path / ".build" / "yolo", "newer"), final)
    assert _version(final) == "newer" and not _asides(tmp_path, final)


def test_the_aside_folder_of_a_running_swap_is_left_alone(tmp_path):
    final = _folder(tmp_path / "yolo", "new")
    running = _folder(tmp_path / f"{aside_prefix(final)}{os.getppid()}", "old")  # a live process's swap
    recover_folder(final)
    assert _version(running) == "old"


# --- subprocess: real signals at each step ----------------------------------------------------
SWAP = """
import os, signal, sys
from pathlib import Path
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, also when the suite runs in the background
from libreyolo.utils import tempfiles

final, built, step, sig = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), getattr(signal, sys.argv[4])
real, calls = os.replace, []

def signalling(src, dst):
    calls.append(src)
    real(src, dst)
    if len(calls) == step:
        os.kill(os.getpid(), sig)

os.replace = signalling
tempfiles.replace_folder(built, final)
print("returned")
"""


def _run(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=env, capture_output=True,
                          text=True, timeout=TIMEOUT)


@pytest.mark.parametrize("step", [1, 2])
def test_sigterm_after_each_rename_dies_with_the_new_folder_in_place(tmp_path, step):
    final, built = _folder(tmp_path / "yolo", "old"), _folder(tmp_path / ".build" / "yolo", "new")
    proc = _run(SWAP, str(final), str(built), str(step), "SIGTERM")
    assert proc.returncode == -signal.SIGTERM, proc.stderr  # it still dies of the signal
    assert "returned" not in proc.stdout
    assert _version(final) == "new" and not _asides(tmp_path, final)


def test_ctrl_c_between_the_renames_interrupts_after_the_new_folder_is_in_place(tmp_path):
    final, built = _folder(tmp_path / "yolo", "old"), _folder(tmp_path / ".build" / "yolo", "new")
    proc = _run(SWAP, str(final), str(built), "1", "SIGINT")
    assert proc.returncode == -signal.SIGINT and "KeyboardInterrupt" in proc.stderr, proc.stderr
    assert _version(final) == "new" and not _asides(tmp_path, final)


@pytest.mark.parametrize("step", [1, 2])
def test_sigkill_at_each_rename_loses_nothing_and_the_next_write_recovers(tmp_path, step):
    final, built = _folder(tmp_path / "yolo", "old"), _folder(tmp_path / ".build" / "yolo", "new")
    proc = _run(SWAP, str(final), str(built), str(step), "SIGKILL")
    assert proc.returncode == -signal.SIGKILL
    versions = {_version(p) for p in [final, *_asides(tmp_path, final)] if p.exists()}
    assert "old" in versions or step == 2  # the old version is still on disk until the new is in place
    recover_folder(final)  # what the next write does first
    assert _version(final) == ("old" if step == 1 else "new") and not _asides(tmp_path, final)


# --- the Triton export end to end -------------------------------------------------------------
TRITON = """
import os, shutil, signal, sys
from pathlib import Path
from libreyolo.export import triton
from tests.test_export_common import model

repo, served_onnx = Path(sys.argv[1]), sys.argv[2]
triton.export_onnx = lambda module, example, path, opts: shutil.copy(served_onnx, path)  # no second trace
real = os.replace

def signalling(src, dst):
    real(src, dst)
    if Path(src) == repo / "yolo":  # the old model folder was just moved aside
        os.kill(os.getpid(), signal.SIGTERM)

os.replace = signalling
model().export(format="triton", imgsz=64, output=repo, name="yolo", validate=False, verbose=False, max_batch=3)
"""


def test_sigterm_between_the_renames_of_a_triton_reexport_keeps_a_model_folder(tmp_path):
    pytest.importorskip("onnx")
    from libreyolo.export.triton import CONFIG, model_file
    from tests.test_export_common import model

    repo = tmp_path / "repo"
    first = model().export(format="triton", imgsz=64, output=repo, name="yolo", validate=False, verbose=False,
                           max_batch=2)
    saved = tmp_path / "served.onnx"
    saved.write_bytes(model_file(first.path).read_bytes())
    proc = _run(TRITON, str(repo), str(saved))
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    folder = repo / "yolo"
    assert (folder / CONFIG).is_file() and model_file(folder).is_file(), "the model folder was lost"
    assert "max_batch_size: 3" in (folder / CONFIG).read_text()  # the new version, complete
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo", "served.onnx"]  # no build or old folder left


# --- benchmark: its temporary folder goes on SIGTERM and Ctrl-C --------------------------------
BENCH = """
import signal, sys, time
from pathlib import Path
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, also when the suite runs in the background
from libreyolo.engine import benchmark_formats

def exporting(model, fmt, folder, *args, **kwargs):  # an export in progress: 1 MiB written, then waiting
    (Path(folder) / "artifact.bin").write_bytes(bytes(1 << 20))
    print("exporting into", folder, flush=True)
    time.sleep(60)

benchmark_formats._export_row = exporting
benchmark_formats._time = lambda *a, **k: {"timing": {}, "ms_per_image": 1.0, "images_per_s": 1.0}  # not timed here
from libreyolo.cli import main
sys.exit(main(["benchmark", "model=LibreYOLO9t.yaml", "formats=onnx", "imgsz=64", "n=1", "cuda_graph=false"]))
"""


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, -signal.SIGTERM), (signal.SIGINT, 130)])
def test_a_signal_during_benchmark_removes_its_temporary_folder(tmp_path, sig, code):
    import selectors

    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", BENCH], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            assert sel.select(timeout=TIMEOUT), "benchmark did not start exporting in time"
        line = proc.stdout.readline()
        assert "exporting into" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        folder = Path(line.split("exporting into", 1)[1].strip())
        assert folder.parent == tmp_path and (folder / "artifact.bin").is_file()
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == code
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not folder.exists() and not list(tmp_path.glob("libreyolo-benchmark-*"))


# --- output paths are checked before the work ------------------------------------------------
@pytest.mark.parametrize("command", [["benchmark", "model=LibreYOLO9t.yaml"],
                                     ["compare", "model=a.pt", "artifact=b.onnx"]])
def test_json_naming_a_folder_is_refused_before_any_work(tmp_path, command, capsys):
    from libreyolo.cli import main

    rc = main([*command, f"json={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "is an existing folder" in err, (rc, err)
    rc = main([*command, f"json={tmp_path / 'missing' / 'r.json'}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "does not exist" in err, (rc, err)
