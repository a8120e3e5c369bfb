"""The format table (libreyolo/export/formats.py) is the one declaration of every format.

Each check here reads something the rest of the code derives from the table (exporter lookup,
artifact loading by suffix, option refusals, --help) and shows it follows a change of the table
(a planted row, a planted capability), so the derivation cannot be a second hand-kept list.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import subprocess
import sys

import pytest

from libreyolo.errors import ArgumentError
from libreyolo.export import formats
from libreyolo.export.formats import FORMAT_TABLE, FORMATS, Format


@pytest.mark.parametrize("row", FORMAT_TABLE, ids=lambda r: r.name)
def test_each_row_names_its_exporter_and_runtime_and_the_exporter_reads_its_row(row):
    from libreyolo.export.base import get_exporter

    exporter = get_exporter(row.name)
    assert exporter.spec is row and exporter.name == row.name and exporter.suffix == row.suffix
    assert (exporter.half, exporter.int8_mode, exporter.dynamic_shapes) == (row.half, row.int8, row.dynamic_batch)
    for alias in row.aliases:
        assert get_exporter(alias) is exporter
    assert callable(importlib.import_module(f"libreyolo.runtimes.{row.runtime}").load)
    if row.loads_by_suffix:
        assert formats.artifact_runtime(f"/x/model{row.suffix}") == row.runtime
        assert formats.artifact_runtime(f"/x/MODEL{row.suffix.upper()}") == row.runtime


def test_the_triton_row_lists_the_options_its_config_reads():
    from libreyolo.export.triton import DEFAULTS

    assert formats.TRITON_CONFIG.names == tuple(DEFAULTS)


def test_unknown_names_and_endings_are_refused_naming_every_format():
    with pytest.raises(ArgumentError, match="choose one of: " + ", ".join(FORMATS)):
        formats.format_name("caffe2")
    assert formats.artifact_runtime("model.pt") is None
    assert formats.artifact_runtime("model_tflite") is None


def test_a_planted_row_is_picked_up_by_lookup_loading_help_and_the_docs_table(monkeypatch):
    """Adding a format is its row (plus its modules): every reader follows the table."""
    row = Format("myrt", ".myrt", "onnx", "onnx", "myrt", "a planted format", aliases=("mr",), half="any")
    table = (*FORMAT_TABLE, row)
    monkeypatch.setattr(formats, "FORMAT_TABLE", table)
    monkeypatch.setattr(formats, "FORMATS", tuple(f.name for f in table))
    monkeypatch.setattr(formats, "_BY_NAME", {f.name: f for f in table})
    monkeypatch.setattr(formats, "_BY_ALIAS", {a: f.name for f in table for a in f.aliases})
    assert formats.format_name(".MR") == "myrt"
    assert formats.artifact_runtime("a/b.myrt") == "onnx"
    assert any(line.split()[0] == "myrt" for line in formats.help_lines())
    tool = sys.modules["tools_readme_tables"]
    format_table, format_detail_table = tool.format_table, tool.format_detail_table
    assert "| `myrt` |" in format_table() and "| `myrt` | `mr` |" in format_detail_table()


@pytest.fixture(autouse=True, scope="module")
def _tool_on_path():
    """tools/readme_tables.py importable as ``tools_readme_tables``."""
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "tools_readme_tables", Path(__file__).resolve().parents[1] / "tools" / "readme_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["tools_readme_tables"] = module
    yield
    sys.modules.pop("tools_readme_tables", None)


def test_a_capability_redeclared_on_an_exporter_class_is_refused():
    from libreyolo.export.base import Exporter

    with pytest.raises(TypeError, match="declared once, in its row of libreyolo/export/formats.py"):
        type("Planted", (Exporter,), {"half": "any"}, format="tflite")
    planted = type("Planted", (Exporter,), {}, format="tflite")  # without the redeclaration it is fine
    assert planted.half == formats.get_format("tflite").half


def test_scoped_options_are_refused_from_the_declared_groups():
    onnx, aoti = formats.get_format("onnx"), formats.get_format("aoti")
    assert formats.foreign_options(onnx, {"opset": 17}) is None
    assert formats.foreign_options(aoti, {"opset": 17}) == ("opset/simplify apply to ONNX-based formats (onnx, "
                                                           "tensorrt, triton, openvino), not format=aoti")
    assert formats.foreign_options(onnx, {"max_batch": 4, "instances": 2}) == (
        "max_batch, instances apply only to format=triton, not format=onnx")
    # a planted capability: a row that takes the ONNX options accepts them, nothing else to change
    assert formats.foreign_options(dataclasses.replace(aoti, options=(*aoti.options, formats.ONNX_GRAPH)),
                                   {"opset": 17}) is None


def test_the_format_table_and_export_options_import_without_torch():
    code = ("import sys; import libreyolo.export.formats, libreyolo.export.options; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_export_help_lists_every_format_and_scoped_option_from_the_table(capsys):
    from libreyolo.cli import main

    assert main(["export", "--help"]) == 0
    out = capsys.readouterr().out
    for row in FORMAT_TABLE:
        assert f"\n  {row.name} " in out
    assert "[format=tensorrt]" in out and "[format=aoti]" in out
