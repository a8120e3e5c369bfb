"""The export contract is split by kind of family (issue 45, item 5): each registered family declares a
contract of exactly one kind (the one its base class names), a field of another kind is refused, and no
code outside ``libreyolo/models`` reads a kind's field off a contract by name.

Mutations that fail these tests (checked by hand when they were written): moving ``row_sets`` into the
shared :class:`ExportContract` (the one flat contract) fails ``test_each_kind_adds_its_own_fields``;
registering without ``check_contract`` fails ``test_a_family_of_the_wrong_kind_is_refused_when_it_registers``;
dropping :meth:`SetContract._named_outputs` fails ``test_kind_fields_name_declared_outputs``; reading
``contract.row_sets`` in ``libreyolo/export/validate.py`` (as before the split) fails
``test_no_consumer_reads_a_kinds_field_by_name``.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from libreyolo.models.base import Family
from libreyolo.models.contract import (
    KINDS,
    DenseContract,
    ExportContract,
    ImageContract,
    PixelContract,
    QueryRows,
    SetContract,
)
from libreyolo.models.dense import DenseDetectFamily
from libreyolo.models.registry import check_contract, families, register_family

PACKAGE = Path(__file__).resolve().parents[1] / "libreyolo"
SHARED = {f.name for f in dataclasses.fields(ExportContract)}
KIND_FIELDS = {"row_sets", "max_moved_rows", "selection", "rows_follow_candidates", "host_selection",
               "nms_input", "nms_decoder", "nms_free"}


def own_fields(kind: type[ExportContract]) -> set[str]:
    return {f.name for f in dataclasses.fields(kind)} - SHARED


def test_each_kind_adds_its_own_fields():
    assert not SHARED & KIND_FIELDS, "a kind's field sits in the shared contract"
    assert own_fields(DenseContract) == {"nms_input", "nms_decoder", "nms_free"}
    assert own_fields(SetContract) == {"row_sets", "max_moved_rows", "selection", "rows_follow_candidates",
                                       "host_selection"}
    assert own_fields(PixelContract) == own_fields(ImageContract) == set()
    assert len({k.kind for k in KINDS}) == len(KINDS) and "" not in {k.kind for k in KINDS}


@pytest.mark.parametrize("name", sorted(families()))
def test_every_family_declares_one_kind_the_one_of_its_base(name):
    fam = families()[name]
    assert type(fam.export) in KINDS, (name, type(fam.export))
    assert isinstance(fam.export, type(fam).contract_kind), (name, type(fam.export), type(fam).contract_kind)
    # what the kind adds is asked through the methods every contract answers
    rows, nms = fam.export.query_rows(), fam.export.nms_output()
    assert (rows != QueryRows()) == bool(rows.outputs) == isinstance(fam.export, SetContract)
    assert set(rows.outputs) <= set(fam.export.output_names)
    assert nms is None or (isinstance(fam.export, DenseContract) and nms in fam.export.output_names)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_a_field_of_another_kind_is_refused(kind):
    foreign = KIND_FIELDS - own_fields(kind)
    assert foreign
    for name in sorted(foreign):
        with pytest.raises(TypeError, match=name):
            kind(**{name: None})


@pytest.mark.parametrize("name", sorted(families()))
def test_a_family_contract_takes_no_field_of_another_kind(name):
    contract = families()[name].export
    for field in sorted(KIND_FIELDS - own_fields(type(contract))):
        with pytest.raises(TypeError, match=field):
            dataclasses.replace(contract, **{field: None})


def test_a_family_of_the_wrong_kind_is_refused_when_it_registers():
    class SetInDense(DenseDetectFamily):
        name = "test-contract-kinds-set-in-dense"
        export = SetContract(output_names=("pred_logits",), row_sets=("pred_logits",))

    class SharedOnly(DenseDetectFamily):
        name = "test-contract-kinds-shared-only"
        export = ExportContract()

    class NoKind(Family):
        name = "test-contract-kinds-no-kind"
        export = ImageContract()

    for cls, says in ((SetInDense, "kind is DenseContract"), (SharedOnly, "declares export=ExportContract"),
                      (NoKind, "names no contract kind")):
        with pytest.raises(TypeError, match=says):
            register_family(cls)
        assert cls.name not in families()
    check_contract({}, type(families()["yolo9"]))  # a registered family passes the same check


def test_kind_fields_name_declared_outputs():
    with pytest.raises(ValueError, match=r"row_sets names output\(s\) \['boxes'\]"):
        SetContract(output_names=("pred_logits",), row_sets=("pred_logits", "boxes"))
    with pytest.raises(ValueError, match=r"nms_input names output\(s\) \['boxes'\]"):
        DenseContract(nms_input="boxes")
    with pytest.raises(ValueError, match=r"class_axes names output\(s\) \['logits'\]"):
        PixelContract(output_names=("map",), class_axes={"logits": (1, 0)})
    with pytest.raises(ValueError, match="max_moved_rows must be >= 0"):
        SetContract(max_moved_rows=-1)


READ = re.compile(r"\b(?:export|contract)\s*\.\s*(" + "|".join(sorted(KIND_FIELDS)) + r")\b"
                  r"|getattr\([^)]*[\"'](" + "|".join(sorted(KIND_FIELDS)) + r")[\"']")


def kind_field_reads(root: Path) -> list[str]:
    hits = []
    for path in sorted(root.rglob("*.py")):
        if path.parent.is_relative_to(root / "models"):
            continue  # the families declare their kind's fields; the contract module answers for them
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if READ.search(line):
                hits.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    return hits


def test_no_consumer_reads_a_kinds_field_by_name():
    """Export, validation, comparison and runtimes ask nms_output()/nms_refusal()/nms_decoder_path()/
    query_rows(); the pattern itself is shown to find such reads."""
    assert kind_field_reads(PACKAGE) == []
    assert READ.search("picked = family.export.selection if family.export.row_sets else None")
    assert READ.search('getattr(contract, "row_sets", ())')
