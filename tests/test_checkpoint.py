"""Loading and saving checkpoints: formats, custom classes, and errors that say what is wrong."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time

import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.checkpoint import read_checkpoint
from libreyolo.errors import CheckpointError


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model = LibreYOLO("LibreYOLO9t.yaml", nc=3, names=["cat", "dog", "bird"])
    path = tmp_path_factory.mktemp("ckpt") / "pets.pt"
    model.save(path)
    return model, path


def test_yaml_name_builds_the_untrained_architecture():
    model = LibreYOLO("LibreYOLO9s.yaml")
    assert (model.family.name, model.size, model.nc, model.imgsz) == ("yolo9", "s", 80, 640)
    assert model.names[0] == "person"


def test_yaml_file_with_family_size_and_names(tmp_path):
    spec = tmp_path / "my.yaml"
    spec.write_text("family: yolo9\nsize: t\nnames: [a, b]\nimgsz: 320\n")
    model = LibreYOLO(spec)
    assert model.nc == 2 and model.names == {0: "a", 1: "b"} and model.imgsz == 320


def test_save_writes_the_reference_schema_and_custom_classes_roundtrip(tiny):
    model, path = tiny
    raw = torch.load(path, weights_only=True)
    assert raw["schema_version"] == "1.0" and raw["model_family"] == "yolo9" and raw["size"] == "t"
    assert raw["task"] == "detect" and raw["nc"] == 3 and raw["names"] == {0: "cat", 1: "dog", 2: "bird"}
    assert raw["imgsz"] == 640 and raw["letterbox_pad"] == "topleft"
    again = LibreYOLO(path)
    assert again.nc == 3 and again.names[2] == "bird"
    assert again.net.head.cv3[0][2].out_channels == 3


def test_family_falls_back_to_the_file_name(tiny, tmp_path):
    _, path = tiny
    raw = torch.load(path, weights_only=True)
    bare = tmp_path / "LibreYOLO9t.pt"
    torch.save({"model": raw["model"], "nc": 3}, bare)
    ckpt = read_checkpoint(bare)
    assert (ckpt.family.name, ckpt.size, ckpt.nc) == ("yolo9", "t", 3)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        LibreYOLO(tmp_path / "nope.pt")


def test_a_file_that_is_not_a_checkpoint(tmp_path):
    path = tmp_path / "LibreYOLO9t.pt"
    path.write_text("hello")
    with pytest.raises(CheckpointError, match="not a PyTorch checkpoint: it is a text file"):
        LibreYOLO(path)
    path.write_bytes(b"PK\x03\x04 a damaged zip")
    with pytest.raises(CheckpointError, match="not a readable PyTorch checkpoint"):
        LibreYOLO(path)
    torch.save([1, 2, 3], path)
    with pytest.raises(CheckpointError, match="not a LibreYOLO checkpoint"):
        LibreYOLO(path)


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_pickled_code_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    with open(path, "wb") as fh:
        pickle.dump({"model": {}, "x": _Evil()}, fh)
    with pytest.raises(CheckpointError):
        LibreYOLO(path)


def test_unknown_family(tiny, tmp_path):
    _, path = tiny
    raw = torch.load(path, weights_only=True)
    raw["model_family"] = "yolo42"
    bad = tmp_path / "x.pt"
    torch.save(raw, bad)
    with pytest.raises(CheckpointError, match="unknown model family 'yolo42'"):
        LibreYOLO(bad)


def test_state_dict_mismatch_names_the_keys(tiny, tmp_path):
    _, path = tiny
    raw = torch.load(path, weights_only=True)
    del raw["model"]["head.cv2.0.2.bias"]
    raw["model"]["head.extra.weight"] = torch.zeros(1)
    raw["model"]["backbone.conv0.conv.weight"] = torch.zeros(8, 3, 3, 3)
    bad = tmp_path / "x.pt"
    torch.save(raw, bad)
    with pytest.raises(CheckpointError) as info:
        LibreYOLO(bad)
    msg = str(info.value)
    assert "missing: head.cv2.0.2.bias" in msg and "unexpected: head.extra.weight" in msg
    assert "backbone.conv0.conv.weight" in msg


def test_save_is_atomic_and_refuses_missing_folders(tiny, tmp_path, monkeypatch):
    model, _ = tiny
    with pytest.raises(CheckpointError, match="does not exist"):
        model.save(tmp_path / "no" / "such" / "dir.pt")

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(OSError, match="disk full"):
        model.save(tmp_path / "x.pt")
    assert list(tmp_path.iterdir()) == []


def test_hub_name_offline_fails_fast_with_advice(tmp_path):
    code = ("from libreyolo import LibreYOLO\n"
            "try:\n    LibreYOLO('LibreYOLO9c.pt')\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path))
    start = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=120)
    assert time.time() - start < 60
    assert "CheckpointError" in out.stdout or "MissingDependencyError" in out.stdout, out.stdout + out.stderr
    assert "LibreYOLO9c" in out.stdout
