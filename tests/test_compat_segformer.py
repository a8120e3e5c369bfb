"""SegFormer matches the reference: checkpoints load strictly, key for key, and compute its logits.

Every fixture whose schema names family "segformer" under ``LIBREYOLO_COMPAT_DIR`` is a test
case: the filled state dict and ``meta.json`` are written as a reference-format checkpoint, read
back by ``LibreYOLO(path)``, and the network's eval output on each probe (logits at the input
resolution) must be within 1e-4 of ``probes.npz``. The size tests need no fixture: every size is
built on the meta device and checked against its configuration (and the published parameter
counts), and a b1 checkpoint must come back as b1.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.errors import CheckpointError
from libreyolo.models.registry import families, family_from_filename
from libreyolo.models.segformer.network import HEADS, MLP_RATIO, PATCH_KERNELS, SIZES, SR_RATIOS
from tests.compat_utils import assert_probe_parity, model_from_fixture, schema

# parameters (millions) of each size with the 150-class ADE20K head, as published (Xie et al.
# 2021, Table 1: 3.8, 13.7, 27.5, 47.3, 64.1, 84.7)
PUBLISHED_PARAMS_M = {"b0": 3.8, "b1": 13.7, "b2": 27.5, "b3": 47.3, "b4": 64.1, "b5": 84.7}


def _segformer_fixture_names() -> list[str]:
    root = os.environ.get("LIBREYOLO_COMPAT_DIR")
    folder = Path(root) / "fixtures" if root else None
    if folder is None or not folder.is_dir():
        return ["(no compat dir)"]
    names = [d.name for d in sorted(folder.iterdir())
             if (d / "schema.json").is_file() and json.loads((d / "schema.json").read_text())["family"] == "segformer"]
    return names or ["(no segformer fixtures)"]


@pytest.fixture(params=_segformer_fixture_names())
def segformer_fixture(request, compat_dir) -> Path:
    d = compat_dir / "fixtures" / request.param
    if not d.is_dir():
        pytest.skip(f"{request.param} under {compat_dir}")
    return d


def _save_reference_checkpoint(path: Path, state: dict[str, torch.Tensor], meta: dict) -> Path:
    """A flat dict as the reference's ``save()`` writes it (``names`` keys back to ints)."""
    meta = dict(meta)
    if "names" in meta:
        meta["names"] = {int(k): v for k, v in meta["names"].items()}
    torch.save({"model": state, **meta}, path)
    return path


def _untrained_state(size: str, nc: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return families()["segformer"].build(size, nc).state_dict()


# --- the fixtures ---------------------------------------------------------------------------------
def test_fixture_reproduces_probe_logits(segformer_fixture, compat_fill):
    model = model_from_fixture(segformer_fixture, compat_fill)
    s = schema(segformer_fixture)
    assert (model.family.name, model.family.task, model.size, model.nc) == ("segformer", "semantic", s["size"], s["nc"])
    assert_probe_parity(model, segformer_fixture, compat_fill)


def test_fixture_schema_lists_exactly_our_keys_and_shapes_in_order(segformer_fixture):
    s = schema(segformer_fixture)
    with torch.device("meta"):
        net = families()["segformer"].build(s["size"], s["nc"])
    ours = [(k, list(v.shape)) for k, v in net.state_dict().items()]
    assert ours == [(t["key"], t["shape"]) for t in s["tensors"]]


def test_fixture_loads_as_written_through_a_checkpoint_in_tmp_path(segformer_fixture, compat_fill, tmp_path):
    meta = json.loads((segformer_fixture / "meta.json").read_text())
    state = compat_fill.fill(segformer_fixture)
    model = LibreYOLO(_save_reference_checkpoint(tmp_path / "weights.pt", state, meta))
    assert (model.size, model.nc, model.imgsz, model.names[0]) == (meta["size"], meta["nc"], meta["imgsz"],
                                                                   meta["names"]["0"])
    for key, value in model.net.state_dict().items():
        assert torch.equal(value, state[key]), key


def test_a_missing_or_unexpected_key_is_refused(segformer_fixture, compat_fill, tmp_path):
    meta = json.loads((segformer_fixture / "meta.json").read_text())
    state = compat_fill.fill(segformer_fixture)
    dropped = {k: v for k, v in state.items() if k != "decode_head.linear_fuse.weight"}
    with pytest.raises(CheckpointError, match="missing: decode_head.linear_fuse.weight"):
        LibreYOLO(_save_reference_checkpoint(tmp_path / "dropped.pt", dropped, meta))
    extra = {**state, "decode_head.linear_fuse.bias": torch.zeros(state["decode_head.linear_fuse.weight"].shape[0])}
    with pytest.raises(CheckpointError, match="unexpected: decode_head.linear_fuse.bias"):
        LibreYOLO(_save_reference_checkpoint(tmp_path / "extra.pt", extra, meta))


def test_our_checkpoints_carry_the_reference_metadata_keys(segformer_fixture, compat_fill, tmp_path):
    model = model_from_fixture(segformer_fixture, compat_fill)
    saved = torch.load(model.save(tmp_path / f"{model.family.filename(model.size)}.pt"), weights_only=True)
    meta = json.loads((segformer_fixture / "meta.json").read_text())
    assert set(saved) - {"model"} == set(meta)
    assert {k: saved[k] for k in meta if k not in ("names", "libreyolo_version")} == \
        {k: v for k, v in meta.items() if k not in ("names", "libreyolo_version")}


# --- every size -----------------------------------------------------------------------------------
@pytest.mark.parametrize("size", sorted(SIZES))
def test_every_size_has_the_keys_and_shapes_of_its_configuration(size):
    spec, nc = SIZES[size], 150
    with torch.device("meta"):
        state = families()["segformer"].build(size, nc).state_dict()
    cin = 3
    for i, (depth, dim) in enumerate(zip(spec.depths, spec.dims, strict=True)):
        stage = f"encoder.stages.{i}."
        k = PATCH_KERNELS[i]
        assert tuple(state[stage + "patch_embeddings.proj.weight"].shape) == (dim, cin, k, k)
        blocks = {int(key[len(stage + "blocks."):].split(".")[0]) for key in state if key.startswith(stage + "blocks.")}
        assert blocks == set(range(depth)), (size, i)
        for j in range(depth):
            block = f"{stage}blocks.{j}."
            assert tuple(state[block + "attention.q_proj.weight"].shape) == (dim, dim)
            assert tuple(state[block + "mlp.fc1.weight"].shape) == (MLP_RATIO * dim, dim)
            assert tuple(state[block + "mlp.dwconv.dwconv.weight"].shape) == (MLP_RATIO * dim, 1, 3, 3)
            sr_key = block + "attention.sequence_reduction.sequence_reduction.weight"
            sr = SR_RATIOS[i]
            assert (tuple(state[sr_key].shape) == (dim, dim, sr, sr)) if sr > 1 else sr_key not in state
        assert dim % HEADS[i] == 0
        assert tuple(state[f"decode_head.linear_projections.{i}.proj.weight"].shape) == (spec.decoder_dim, dim)
        cin = dim
    width = spec.decoder_dim
    assert tuple(state["decode_head.linear_fuse.weight"].shape) == (width, 4 * width, 1, 1)
    assert "decode_head.linear_fuse.bias" not in state
    assert tuple(state["decode_head.classifier.weight"].shape) == (nc, width, 1, 1)
    params = sum(v.numel() for k, v in state.items() if not k.startswith("decode_head.batch_norm.r")
                 and not k.endswith("num_batches_tracked"))
    assert abs(params / 1e6 - PUBLISHED_PARAMS_M[size]) < 0.06, (size, params)


def test_a_b1_checkpoint_loads_as_b1_from_its_metadata(tmp_path):
    state = _untrained_state("b1", 3)
    meta = {"schema_version": "1.0", "libreyolo_version": "1.6.0", "model_family": "segformer", "size": "b1",
            "task": "semantic", "nc": 3, "names": {0: "a", 1: "b", 2: "c"}, "imgsz": 512}
    model = LibreYOLO(_save_reference_checkpoint(tmp_path / "weights.pt", state, meta))
    assert (model.size, model.nc, model.imgsz, model.names[2]) == ("b1", 3, 512, "c")
    assert torch.equal(model.net.state_dict()["encoder.stages.3.blocks.1.mlp.fc2.weight"],
                       state["encoder.stages.3.blocks.1.mlp.fc2.weight"])


def test_a_bare_state_dict_takes_size_and_classes_from_its_file_name_and_head(tmp_path):
    state = _untrained_state("b1", 7)
    torch.save(state, tmp_path / "LibreSegformerb1-sem.pt")
    model = LibreYOLO(tmp_path / "LibreSegformerb1-sem.pt")
    assert (model.family.name, model.size, model.nc, model.imgsz) == ("segformer", "b1", 7, 512)


def test_metadata_naming_the_wrong_size_is_refused(tmp_path):
    state = _untrained_state("b1", 3)
    meta = {"model_family": "segformer", "size": "b0", "task": "semantic", "nc": 3}
    with pytest.raises(CheckpointError, match="does not match the architecture"):
        LibreYOLO(_save_reference_checkpoint(tmp_path / "weights.pt", state, meta))


def test_file_names_follow_the_reference_pattern():
    family = families()["segformer"]
    for size in SIZES:
        assert family_from_filename(family.filename(size)) == (family, size)
    assert family.filename("b0") == "LibreSegformerb0-sem"
    assert family_from_filename("LibreSegformerb0") is None  # the reference requires the task suffix
    assert family_from_filename("LibreSegformerb6-sem") is None


def test_default_input_size_is_512_and_640_for_b5():
    family = families()["segformer"]
    assert {s: family.default_imgsz_for(s) for s in SIZES} == {**{s: 512 for s in SIZES}, "b5": 640}
