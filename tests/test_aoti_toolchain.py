"""The AOTInductor compile links the libstdc++ the process runs with (libreyolo.export.aoti.shared_libstdcxx).

On the H200 image the compiler had only the static libstdc++, so every package's wrapper carried
a private copy of it and the loader crashed (SIGSEGV in std::regex). These tests use a stand-in
compiler that answers like that install, and a real link through the wrapper script it gets.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from libreyolo.export import aoti

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="libstdc++ and /proc: Linux only")


def fake_compiler(tmp_path: Path, *, has_shared: bool) -> Path:
    """A compiler that answers -print-file-name like an install with (or without) the shared libstdc++,
    and logs every other call's arguments before handing them to the real one (if any)."""
    real = shutil.which("g++") or shutil.which("c++")
    answer = "/usr/lib/libstdc++.so" if has_shared else "libstdc++.so"
    script = tmp_path / "fake-g++"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$1" in -print-file-name=*) echo {answer}; exit 0;; esac\n'
        f'echo "$@" >> {tmp_path}/calls.log\n'
        + (f'exec {real} "$@"\n' if real else "exit 0\n"))
    script.chmod(0o755)
    return script


def test_a_compiler_with_the_shared_libstdcxx_is_left_alone(tmp_path):
    from torch._inductor import config

    cxx = fake_compiler(tmp_path, has_shared=True)
    before = config.cpp.cxx
    with aoti.shared_libstdcxx(str(cxx)) as done:
        assert done is None
        assert config.cpp.cxx == before


def test_a_static_only_compiler_is_pointed_at_the_process_libstdcxx(tmp_path):
    from torch._inductor import config

    lib = aoti.process_libstdcxx()
    if lib is None:
        pytest.skip("this process maps no shared libstdc++")
    cxx = fake_compiler(tmp_path, has_shared=False)
    assert "finds no shared libstdc++" in aoti.static_libstdcxx_reason(str(cxx))
    before = config.cpp.cxx
    with aoti.shared_libstdcxx(str(cxx)) as done:
        assert done is not None and lib in done
        (script,) = config.cpp.cxx
        libdir = Path(script).parent / "lib"
        assert os.path.realpath(libdir / "libstdc++.so") == os.path.realpath(lib)
        subprocess.run([script, "-c", "x.cpp", "-o", "x.o"], cwd=tmp_path, capture_output=True)
        logged = (tmp_path / "calls.log").read_text().split()
        assert logged[:4] == ["-c", "x.cpp", "-o", "x.o"] and logged[-1] == f"-L{libdir}"
    assert config.cpp.cxx == before
    assert not Path(script).exists()  # the wrapper and its folder are temporary


@pytest.mark.skipif(not (shutil.which("g++") and shutil.which("readelf")), reason="needs g++ and readelf")
def test_a_library_linked_through_the_wrapper_needs_the_shared_libstdcxx(tmp_path):
    """A real link through the wrapper (with -static-libstdc++ left to the compiler's choice) gives a
    library that loads the shared libstdc++, as the package's wrapper must."""
    from torch._inductor import config

    if aoti.process_libstdcxx() is None:
        pytest.skip("this process maps no shared libstdc++")
    src = tmp_path / "re.cpp"
    src.write_text('#include <regex>\n#include <string>\nextern "C" int ok() {\n'
                   '  std::regex re("(cpu|cuda)(:([0-9]+))?"); std::smatch m; std::string s = "cuda:0";\n'
                   "  return std::regex_match(s, m, re); }\n")
    cxx = fake_compiler(tmp_path, has_shared=False)
    with aoti.shared_libstdcxx(str(cxx)):
        (script,) = config.cpp.cxx
        subprocess.run([script, "-shared", "-fPIC", "-O1", str(src), "-o", str(tmp_path / "re.so")], check=True)
    needed = subprocess.run(["readelf", "-d", str(tmp_path / "re.so")], capture_output=True, text=True).stdout
    assert "libstdc++.so" in needed
    import ctypes

    assert ctypes.CDLL(str(tmp_path / "re.so")).ok() == 1
