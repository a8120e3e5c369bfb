"""The child-process probe that keeps a crashing AOTInductor CUDA loader from killing the caller."""
from __future__ import annotations

import pytest

from libreyolo.runtimes import aoti
from libreyolo.runtimes.base import RuntimeUnavailableError


@pytest.fixture()
def package(tmp_path):
    path = tmp_path / "m.pt2"
    path.write_bytes(b"stand-in: the probe's code is replaced in these tests")
    return path


def test_a_loader_killed_by_a_signal_is_a_clear_error(package, monkeypatch):
    monkeypatch.setattr(aoti, "_PROBE_CODE", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    monkeypatch.setattr(aoti, "_PROBED", {})
    with pytest.raises(RuntimeUnavailableError, match=r"crashed \(SIGSEGV\) loading m\.pt2 on cuda:0"):
        aoti.probe_cuda_load(package, 0)
    assert not aoti._PROBED


def test_a_crash_names_a_static_libstdcxx_copy_when_the_package_carries_one(tmp_path, monkeypatch):
    """The H200 crash's cause: a wrapper library linked without the shared libstdc++."""
    import zipfile

    monkeypatch.setattr(aoti, "_PROBE_CODE", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    monkeypatch.setattr(aoti, "_PROBED", {})
    for name, needs_shared in (("static.pt2", False), ("shared.pt2", True)):
        pkg = tmp_path / name
        with zipfile.ZipFile(pkg, "w") as z:  # an ELF dynamic string table names the libraries it needs
            z.writestr("m/data/aotinductor/model/x.wrapper.so",
                       b"\x7fELF...libc.so.6\x00" + (b"libstdc++.so.6\x00" if needs_shared else b""))
        with pytest.raises(RuntimeUnavailableError) as err:
            aoti.probe_cuda_load(pkg, 0)
        assert ("static copy of libstdc++" in str(err.value)) is not needs_shared


def test_a_package_that_loads_is_probed_once_and_the_probe_can_be_turned_off(package, monkeypatch, tmp_path):
    marker = tmp_path / "runs"
    monkeypatch.setattr(aoti, "_PROBE_CODE", f"open({str(marker)!r}, 'a').write('x')")
    monkeypatch.setattr(aoti, "_PROBED", {})
    aoti.probe_cuda_load(package, 0)
    aoti.probe_cuda_load(package, 0)
    assert marker.read_text() == "x"  # the second load of the same file skips the probe
    aoti.probe_cuda_load(package, 1)
    assert marker.read_text() == "xx"  # another GPU is probed again
    monkeypatch.setenv(aoti.PROBE_ENV, "0")
    monkeypatch.setattr(aoti, "_PROBED", {})
    aoti.probe_cuda_load(package, 0)
    assert marker.read_text() == "xx"


def test_a_python_error_in_the_probe_is_left_to_the_real_load(package, monkeypatch):
    monkeypatch.setattr(aoti, "_PROBE_CODE", "raise RuntimeError('not a package')")
    monkeypatch.setattr(aoti, "_PROBED", {})
    aoti.probe_cuda_load(package, 0)  # no crash: the in-process load words the error for the user
