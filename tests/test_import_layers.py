"""The package's layers point one way and no module imports itself in a circle (issue 45).

Both checks run the import graph that import-linter builds (grimp): the layer contracts declared in
``pyproject.toml`` ([tool.importlinter]) and ``tools/import_cycles.py``. Each is shown to fail on a
copy of the package with one planted import.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter", reason="import-linter is in the dev extra")

ROOT = Path(__file__).resolve().parents[1]
LINT = ("import sys\nfrom importlinter.cli import lint_imports\n"
        "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))")
CYCLES = "import sys\nsys.path.insert(0, 'tools')\nfrom import_cycles import main\nsys.exit(main([]))"


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(cwd)})


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A copy of the package (and the files the checks read) to plant imports in."""
    root = tmp_path_factory.mktemp("planted")
    shutil.copytree(ROOT / "libreyolo", root / "libreyolo", ignore=shutil.ignore_patterns("__pycache__", "assets"))
    (root / "libreyolo" / "assets").mkdir()
    shutil.copy(ROOT / "libreyolo" / "assets" / "__init__.py", root / "libreyolo" / "assets" / "__init__.py")
    shutil.copytree(ROOT / "tools", root / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def _plant(root: Path, module: str, line: str) -> str:
    path = root.joinpath(*module.split(".")).with_suffix(".py")
    before = path.read_text()
    path.write_text(before + f"\n\ndef _planted():\n    {line}\n")
    return before


def test_no_import_circles():
    out = _run(CYCLES, ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 import circle(s)" in out.stdout


def test_layer_contracts_hold():
    out = _run(LINT, ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "BROKEN" not in out.stdout


def test_a_planted_circle_is_found(planted):
    """A function-level import from errors back to utils.checks (which imports errors) closes a circle."""
    before = _plant(planted, "libreyolo.errors", "from libreyolo.utils import checks  # noqa: F401")
    try:
        out = _run(CYCLES, planted)
    finally:
        (planted / "libreyolo" / "errors.py").write_text(before)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "libreyolo.errors <-> libreyolo.utils.checks" in out.stdout


def test_a_planted_upward_import_breaks_the_layers(planted):
    """ops (a low layer) importing the export layer breaks the contract, even inside a function."""
    before = _plant(planted, "libreyolo.ops.boxes", "from libreyolo.export import driver  # noqa: F401")
    try:
        out = _run(LINT, planted)
    finally:
        (planted / "libreyolo" / "ops" / "boxes.py").write_text(before)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-2000:]
    assert "libreyolo.ops is not allowed to import libreyolo.export" in out.stdout
