"""The README's family, task and format tables are generated from the registries (tools/readme_tables.py).

A family, task or format added without regenerating the README fails here: run
``python tools/readme_tables.py --write``.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tables():
    spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "tools" / "readme_tables.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", ["families", "tasks", "formats"])
def test_readme_table_matches_the_registry(tables, name):
    text = (ROOT / "README.md").read_text()
    have = tables.current(text, name)
    assert have is not None, f"README.md lost its <!-- table:{name} --> markers"
    assert have == tables.TABLES[name](), f"README's {name} table drifted: run python tools/readme_tables.py --write"


@pytest.mark.parametrize("name", ["formats-detail"])
def test_docs_table_matches_the_registry(tables, name):
    """docs/formats.md's table is generated from the format table too."""
    have = tables.current((ROOT / "docs" / "formats.md").read_text(), name)
    assert have is not None, f"docs/formats.md lost its <!-- table:{name} --> markers"
    assert have == tables.DOC_TABLES[name](), "docs/formats.md drifted: run python tools/readme_tables.py --write"


def test_readme_lists_every_family_task_and_format(tables):
    from libreyolo.export.base import FORMATS
    from libreyolo.models.registry import families
    from libreyolo.tasks import tasks

    text = (ROOT / "README.md").read_text()
    for name in (*families(), *tasks(), *FORMATS):
        assert f"| `{name}` |" in text, name


def test_a_new_family_makes_the_table_drift(tables, monkeypatch):
    """The drift check can fail: a registered family the README does not list changes the table."""
    from libreyolo.models import registry

    before = tables.family_table()
    fams = dict(registry.families())
    clone = type("Clone", (type(fams["yolo9"]),), {"name": "yolo9clone"})()
    monkeypatch.setattr(registry, "families", lambda: {**fams, "yolo9clone": clone})
    assert tables.family_table() != before
    assert "`yolo9clone`" in tables.family_table()


def test_readme_is_a_front_door_not_a_notebook():
    """Issue 45: at most ~400 lines; measurements live in bench/results/."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 400
