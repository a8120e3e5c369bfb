"""One comparison package (libreyolo.comparison) and the task boundary of export validation (issue 45, item 5).

The numerics are the validation tests' (tests/test_validation_power.py, tests/test_compile.py,
tests/test_selection_edge.py, ...): this file checks the wiring only: the old module names are the
same module objects as the package's, the three users import the package, and what export
validation compares at (and whether INT8 is offered) is read from the task plugin.
"""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from libreyolo.errors import ArgumentError

ROOT = Path(__file__).resolve().parents[1]
MOVED = {"libreyolo.export.checks": "libreyolo.comparison.groups",
         "libreyolo.export.selection": "libreyolo.comparison.selection",
         "libreyolo.export.matching": "libreyolo.comparison.matching",
         "libreyolo.export.match_images": "libreyolo.comparison.images"}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_the_old_names_are_the_package_modules(old):
    assert importlib.import_module(old) is importlib.import_module(MOVED[old])


@pytest.mark.parametrize("user", ["libreyolo/export/validate.py", "libreyolo/engine/compiled.py",
                                  "libreyolo/graphs/parity.py"])
def test_export_compile_and_graph_validation_use_the_package(user):
    text = (ROOT / user).read_text()
    assert "from libreyolo.comparison" in text
    assert "libreyolo.export.checks" not in text and "libreyolo.export.selection" not in text


def test_no_detect_option_or_task_name_is_written_in_export_validation_or_runtimes():
    """conf/iou/max_det defaults and task names come from tasks/ (the embedded-NMS branch reads the
    validation options' conf, which only detect families reach)."""
    for user in ("libreyolo/export/validate.py", "libreyolo/runtimes/base.py", "libreyolo/export/int8.py",
                 "libreyolo/export/openvino.py"):
        text = (ROOT / user).read_text()
        for needle in ('"conf":', '"iou":', '"max_det":', "iou=0.45", "max_det=300", '== "restore"', '== "detect"',
                       "VALIDATION_CONF"):
            assert needle not in text, (user, needle)


def test_detect_declares_what_export_validation_compares_at():
    from libreyolo.tasks import get_task

    detect = get_task("detect")
    plain = detect.export_validation_options(None)
    assert (plain.conf, plain.iou, plain.max_det) == (0.25, 0.45, 300)
    baked = detect.export_validation_options({"conf": 0.5, "iou": 0.6, "max_det": 50, "topk": 1000, "iterations": 32})
    assert (baked.conf, baked.iou, baked.max_det) == (0.5, 0.6, 50)
    assert detect.match_options(plain) == {"conf": 0.25, "max_det": 300, "nms_iou": 0.45}
    assert detect.validation_note(plain) is None and "conf=0.1" in detect.validation_note(plain.replace(conf=0.1))
    for name in ("classify", "semantic", "restore"):
        task = get_task(name)
        assert task.match_options(task.export_validation_options(None)) == {}


def test_int8_is_refused_from_the_task_capability_not_its_name(monkeypatch):
    """Restoration declares int8_unavailable; planting it on detect refuses a detector the same way
    (and a detector is not refused without it: see tests/test_export_int8.py)."""
    from libreyolo import LibreYOLO
    from libreyolo.export import int8 as int8_export
    from libreyolo.tasks import get_task

    with pytest.raises(ArgumentError, match=r"int8=True is not available for restore models \(their pixel outputs"):
        int8_export.plan(LibreYOLO("LibreSwinIRs.yaml"), "unused.yaml")
    monkeypatch.setattr(type(get_task("detect")), "int8_unavailable", "planted")
    with pytest.raises(ArgumentError, match=r"not available for detect models \(planted\)"):
        int8_export.plan(LibreYOLO("LibreYOLO9t-shapes.pt"), "unused.yaml")
