"""Hostile and damaged models, checkpoints and artifacts: a clear error, never a crash or a wrong answer.

Checkpoint metadata is bounded before anything is built; non-finite weights are refused; artifacts
carry hashes of their bytes and metadata and are checked against their own graph; devices and
booleans are parsed strictly; the Hub fails fast offline; SIGTERM leaves no temporary files.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.checkpoint import atomic_write
from libreyolo.cli import main
from libreyolo.errors import ArgumentError, CheckpointError
from libreyolo.utils.checks import MAX_IMGSZ, parse_bool, resolve_device

IMG = 64  # predictions in these tests only need to run, not to be good
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def three_class(tmp_path_factory):
    """A valid nc=3 checkpoint and its raw dict."""
    path = tmp_path_factory.mktemp("ckpt") / "three.pt"
    LibreYOLO("LibreYOLO9t.yaml", nc=3, names=["a", "b", "c"]).save(path)
    return path, torch.load(path, weights_only=True)


def _write(tmp_path: Path, raw: dict, name: str = "edited.pt", **edits) -> Path:
    out = dict(raw)
    out.update(edits)
    path = tmp_path / name
    torch.save(out, path)
    return path


# --- checkpoint metadata -------------------------------------------------------------------------

@pytest.mark.parametrize("edits, field, shown", [
    ({"nc": 0}, "'nc'", "got 0"),
    ({"nc": -1}, "'nc'", "got -1"),
    ({"nc": "eighty"}, "'nc'", "'eighty'"),
    ({"nc": 10**9}, "'nc'", "1000000000"),
    ({"nc": 2.5}, "'nc'", "2.5"),
    ({"nc": True}, "'nc'", "True"),
    ({"imgsz": "abc"}, "'imgsz'", "'abc'"),
    ({"imgsz": 10**6}, "'imgsz'", "1000000"),
    ({"imgsz": 100}, "'imgsz'", "got 100"),
    ({"imgsz": 0}, "'imgsz'", "got 0"),
    ({"names": {0: "a"}}, "'names' has 1 entries", "'nc' is 3"),
    ({"names": [1, 2, 3]}, "class names must be strings", "int 1"),
    ({"names": {0: "a", 1: "b", 7: "c"}}, "'names' keys", "7"),
    ({"names": "abc"}, "'names' must be a dict", "str"),
    ({"task": "segment"}, "'task'", "'segment'"),
    ({"model_family": 9}, "'model_family'", "9"),
    ({"size": ["t"]}, "size", "['t']"),
    ({"schema_version": "2.0"}, "'schema_version'", "'2.0'"),
])
def test_every_metadata_field_is_checked_before_building(three_class, tmp_path, edits, field, shown):
    _, raw = three_class
    path = _write(tmp_path, raw, **edits)
    with pytest.raises(CheckpointError) as info:
        LibreYOLO(path)
    assert field in str(info.value) and shown in str(info.value), str(info.value)


def test_a_billion_classes_is_refused_at_once_without_allocating(three_class, tmp_path):
    _, raw = three_class
    path = _write(tmp_path, {k: v for k, v in raw.items() if k != "names"}, nc=10**9)
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match="from 1 to 100000"):
        LibreYOLO(path)
    assert time.perf_counter() - start < 5


def test_nc_must_match_the_heads_shape(three_class, tmp_path):
    _, raw = three_class
    path = _write(tmp_path, raw, nc=5, names=[f"n{i}" for i in range(5)])
    with pytest.raises(CheckpointError, match=r"'nc' is 5 but the weights' class head has 3 outputs"):
        LibreYOLO(path)


def test_a_bare_state_dict_takes_nc_from_the_head(three_class, tmp_path):
    _, raw = three_class
    path = tmp_path / "LibreYOLO9t.pt"
    torch.save(raw["model"], path)
    model = LibreYOLO(path)
    assert model.nc == 3 and model.names == {0: "class0", 1: "class1", 2: "class2"}


def test_a_valid_checkpoint_still_loads_with_its_classes(three_class):
    path, _ = three_class
    model = LibreYOLO(path)
    assert (model.nc, model.names, model.imgsz) == (3, {0: "a", 1: "b", 2: "c"}, 640)


def test_a_state_dict_with_non_tensors_is_refused(three_class, tmp_path):
    _, raw = three_class
    path = _write(tmp_path, raw, model={**raw["model"], "head.extra": [1, 2]})
    with pytest.raises(CheckpointError, match=r"map names to tensors.*head.extra"):
        LibreYOLO(path)


@pytest.mark.parametrize("kwargs, message", [
    ({"nc": 0}, "'nc'"), ({"nc": "eighty"}, "'eighty'"), ({"nc": 10**9}, "1000000000"),
    ({"nc": 2, "names": ["a", "b", "c"]}, "'names' has 3 entries"), ({"names": [1, 2]}, "strings"),
])
def test_architecture_arguments_are_checked_too(kwargs, message):
    with pytest.raises(ArgumentError, match=message):
        LibreYOLO("LibreYOLO9t.yaml", **kwargs)


def test_a_yaml_files_fields_are_checked(tmp_path):
    spec = tmp_path / "m.yaml"
    spec.write_text("family: yolo9\nsize: t\nnc: 2\nimgsz: abc\n")
    with pytest.raises(CheckpointError, match="'imgsz'.*'abc'"):
        LibreYOLO(spec)
    spec.write_text("family: yolo9\nsize: t\n[unclosed\n")
    with pytest.raises(CheckpointError, match="not a readable YAML"):
        LibreYOLO(spec)


@pytest.mark.parametrize("target", ["folder", "fifo"])
def test_a_folder_or_pipe_is_not_read_as_a_model(tmp_path, target):
    path = tmp_path / ("m.pt" if target == "folder" else "m.onnx")
    if target == "folder":
        path.mkdir()
    else:
        os.mkfifo(path)  # reading it would block forever
    with pytest.raises(CheckpointError, match="folder|not a regular file"):
        LibreYOLO(path)


# --- non-finite weights --------------------------------------------------------------------------

def _nonfinite(three_class, tmp_path) -> Path:
    _, raw = three_class
    state = dict(raw["model"])
    state["head.cv3.0.2.bias"] = torch.full_like(state["head.cv3.0.2.bias"], float("nan"))
    weight = state["backbone.conv0.conv.weight"].clone()
    weight[0, 0, 0, 0] = float("inf")
    state["backbone.conv0.conv.weight"] = weight
    return _write(tmp_path, raw, model=state)


def test_nan_or_inf_weights_are_refused_naming_the_keys(three_class, tmp_path):
    with pytest.raises(CheckpointError) as info:
        LibreYOLO(_nonfinite(three_class, tmp_path))
    msg = str(info.value)
    assert "2 weight tensor(s) hold NaN or Inf" in msg
    assert "head.cv3.0.2.bias" in msg and "backbone.conv0.conv.weight" in msg and "verify=False" in msg


def test_verify_false_loads_nonfinite_weights_and_export_says_why_it_refuses(three_class, tmp_path):
    model = LibreYOLO(_nonfinite(three_class, tmp_path), verify=False)
    assert not torch.isfinite(model.net.state_dict()["head.cv3.0.2.bias"]).any()
    out = tmp_path / "out"
    out.mkdir()
    from libreyolo.export import ExportError

    with pytest.raises(ExportError) as info:
        model.export(format="onnx", imgsz=IMG, output=out / "m.onnx", verbose=False)
    msg = str(info.value)
    assert "NaN or Inf in 2 tensor(s)" in msg and "head.cv3.0.2.bias" in msg and "conf must" not in msg
    assert list(out.iterdir()) == []


# --- devices -------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", ["meta", pytest.param("gpu", id="unknown-name"), "xla", "cuda:x", "", 3.5,
                                    ["cpu"]])
def test_invalid_devices_are_refused_listing_valid_ones(device):
    with pytest.raises(ArgumentError, match="cpu, cuda, cuda:N"):
        resolve_device(device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", 0, "0"])
def test_cuda_is_refused_where_there_is_none(device):
    with pytest.raises(ArgumentError, match="CUDA is not available"):
        resolve_device(device)


def test_valid_devices_resolve():
    assert resolve_device(None) is None
    assert resolve_device("CPU") == torch.device("cpu") == resolve_device(torch.device("cpu"))


def test_meta_device_neither_changes_nor_destroys_the_model(three_class):
    path, _ = three_class
    model = LibreYOLO(path)
    before = {k: v.clone() for k, v in model.net.state_dict().items()}
    for call in (lambda: model.predict(SAMPLE_IMAGE, imgsz=IMG, device="meta"),
                 lambda: model.to("meta"),
                 lambda: model.export(format="onnx", imgsz=IMG, device="meta", verbose=False),
                 lambda: LibreYOLO(path, device="meta")):
        with pytest.raises(ArgumentError, match="meta"):
            call()
    after = model.net.state_dict()
    assert model.device == torch.device("cpu")
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert model.predict(SAMPLE_IMAGE, imgsz=IMG) is not None


# --- booleans and sizes --------------------------------------------------------------------------

@pytest.mark.parametrize("text, value", [("true", True), ("False", False), ("1", True), (" 0 ", False),
                                         (True, True), (False, False)])
def test_booleans_parse_strictly(text, value):
    assert parse_bool("half", text) is value


@pytest.mark.parametrize("text", ["yes", "no", "maybe", "", None, 2, "tru"])
def test_anything_else_is_not_a_boolean(text):
    with pytest.raises(ArgumentError, match="half must be true or false"):
        parse_bool("half", text)


def test_predict_half_false_string_means_false(three_class):
    model = LibreYOLO(three_class[0])
    assert model.predict(SAMPLE_IMAGE, imgsz=IMG, half="false") is not None  # True would need CUDA here
    with pytest.raises(ArgumentError, match="half"):
        model.predict(SAMPLE_IMAGE, imgsz=IMG, half="maybe")


def test_predict_imgsz_is_bounded(three_class):
    model = LibreYOLO(three_class[0])
    with pytest.raises(ArgumentError, match=f"to {MAX_IMGSZ}"):
        model.predict(SAMPLE_IMAGE, imgsz=100_000)


# --- the command line: one line, never a traceback -------------------------------------------------

@pytest.mark.parametrize("argv, needle", [
    (["predict", "device=gpu"], "cpu, cuda, cuda:N"),
    (["predict", "device=meta"], "'meta' cannot run a model"),
    (["predict", "imgsz=100000"], "imgsz must be an integer from 1 to 8192"),
    (["predict", "half=false2"], "half must be true or false"),
    (["predict", "verify=perhaps"], "verify must be true or false"),
    (["export", "batch=100000"], "batch must be an integer from 1 to 1024"),
    (["export", "device=gpu"], "cpu, cuda, cuda:N"),
])
def test_cli_mistakes_are_one_line(three_class, capsys, argv, needle):
    code = main([*argv, f"model={three_class[0]}", "save=false"] if argv[0] == "predict"
                else [*argv, f"model={three_class[0]}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and needle in err and "Traceback" not in err and len(err.splitlines()) == 1, err


def test_cli_export_onto_a_folder_named_like_the_artifact_fails_before_exporting(three_class, tmp_path, capsys,
                                                                                 monkeypatch):
    from libreyolo.export import onnx as onnx_exporter

    def never(*args, **kwargs):
        raise AssertionError("the export ran although the output is a folder")

    monkeypatch.setattr(onnx_exporter.OnnxExporter, "build", never)
    (tmp_path / "x.onnx").mkdir()
    code = main(["export", f"model={three_class[0]}", f"output={tmp_path / 'x.onnx'}", f"imgsz={IMG}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "already exists and is a folder" in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.onnx"] and not any((tmp_path / "x.onnx").iterdir())


# --- artifacts: hashes and metadata against the graph ----------------------------------------------

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def static_onnx(tmp_path_factory):
    from tests.test_export_common import exported

    return exported(tmp_path_factory, "onnx").path


@pytest.fixture(scope="module")
def nms_onnx(tmp_path_factory):
    from tests.test_export_common import exported

    return exported(tmp_path_factory, "onnx", nms=True, dynamic=True, batch=2).path


def _edited(src: Path, dst: Path, **values) -> Path:
    """A copy of ``src`` with metadata entries replaced (values JSON-encoded unless strings), or removed (None)."""
    model = onnx.load(str(src))
    props = {p.key: p.value for p in model.metadata_props}
    for key, value in values.items():
        if value is None:
            props.pop(key, None)
        else:
            props[key] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    del model.metadata_props[:]
    for key, value in props.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(model, str(dst))
    return dst


def test_an_exported_onnx_carries_hashes_that_metadata_writes_do_not_change(static_onnx, tmp_path):
    from libreyolo.export.metadata import onnx_content_sha256

    props = {p.key: p.value for p in onnx.load(str(static_onnx)).metadata_props}
    assert len(props["content_sha256"]) == 64 and len(props["metadata_sha256"]) == 64
    assert onnx_content_sha256(static_onnx.read_bytes()) == props["content_sha256"]
    edited = _edited(static_onnx, tmp_path / "m.onnx", names={"0": "x"})
    assert onnx_content_sha256(edited.read_bytes()) == props["content_sha256"]
    assert LibreYOLO(static_onnx).metadata["content_sha256"] == props["content_sha256"]


def test_flipped_weight_bytes_are_refused_unless_verify_is_false(static_onnx, tmp_path):
    data = bytearray(static_onnx.read_bytes())
    init = max(onnx.load(str(static_onnx)).graph.initializer, key=lambda t: len(t.raw_data))
    at = bytes(data).find(init.raw_data[:256])
    assert at > 0
    data[at + 100] ^= 0x40
    bad = tmp_path / "flipped.onnx"
    bad.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="model bytes do not match the hash recorded at export") as info:
        LibreYOLO(bad)
    assert "verify=False" in str(info.value)
    assert LibreYOLO(bad, verify=False).predict(SAMPLE_IMAGE) is not None


def test_an_artifact_without_hashes_cannot_be_verified(static_onnx, tmp_path):
    bare = _edited(static_onnx, tmp_path / "old.onnx", content_sha256=None, metadata_sha256=None)
    with pytest.raises(CheckpointError, match="carries no integrity hashes"):
        LibreYOLO(bare)
    assert LibreYOLO(bare, verify=False).nc == 80


@pytest.mark.parametrize("values, message", [
    ({"nc": 3, "names": {"0": "a", "1": "b", "2": "c"}}, "'nc' is 3 but the graph's output 'predictions' has 84"),
    ({"nc": 3}, "'names' has 80 entries but 'nc' is 3"),
    ({"batch": 4}, "'batch' is 4 but the graph's input 'images' has shape (1, 3, 256, 256)"),
    ({"imgsz": 320}, "'imgsz' is 320 but the graph's input"),
    ({"dynamic_axes": {"images": {"0": "batch"}}}, "axis 0 of 'images' is dynamic, but the graph fixes it"),
    ({"output_names": ["boxes"]}, "'output_names' is ['boxes']"),
    ({"nc": '"eighty"'}, "'nc' (number of classes) must be an integer from 1 to 100000, got 'eighty'"),
    ({"nc": "eighty"}, "metadata key 'nc' is not valid JSON"),
    ({"family": "nope"}, "unknown model family 'nope'"),
])
def test_metadata_that_contradicts_the_graph_is_named(static_onnx, tmp_path, values, message):
    bad = _edited(static_onnx, tmp_path / "m.onnx", **values)
    with pytest.raises(CheckpointError, match="edited after export"):  # the hash check comes first
        LibreYOLO(bad)
    with pytest.raises(CheckpointError) as info:  # shape checks do not depend on the hashes
        LibreYOLO(bad, verify=False)
    assert message in str(info.value), str(info.value)


def _restamped(src: Path, dst: Path, **values) -> Path:
    """Like :func:`_edited`, then with ``metadata_sha256`` recomputed: an edit the hashes cannot catch."""
    from libreyolo.export.metadata import metadata_sha256

    _edited(src, dst, **values)
    model = onnx.load(str(dst))
    props = {p.key: p.value for p in model.metadata_props}
    for entry in model.metadata_props:
        if entry.key == "metadata_sha256":
            entry.value = metadata_sha256(props)
    onnx.save(model, str(dst))
    return dst


def test_issue22_edited_dynamic_axes_are_caught_by_the_hash_before_any_structural_check(static_onnx, tmp_path):
    bad = _edited(static_onnx, tmp_path / "axes.onnx", dynamic_axes={"images": 5})
    with pytest.raises(CheckpointError, match="edited after export"):
        LibreYOLO(bad)
    with pytest.raises(CheckpointError, match="'dynamic_axes' of 'images' must map axis numbers"):
        LibreYOLO(bad, verify=False)


def test_issue22_deeply_nested_onnx_metadata_is_refused_without_recursion(static_onnx, tmp_path):
    bad = _edited(static_onnx, tmp_path / "deep.onnx", names="[" * 200_000)
    for verify in (True, False):
        with pytest.raises(CheckpointError, match="edited after export" if verify else "nested more than"):
            LibreYOLO(bad, verify=verify)


def test_issue22_an_input_dtype_the_graph_contradicts_is_refused_at_load(static_onnx, tmp_path):
    bad = _restamped(static_onnx, tmp_path / "fp16.onnx", input_dtype="float16")
    with pytest.raises(CheckpointError, match="'input_dtype' is 'float16' but the graph's input 'images' is float32"):
        LibreYOLO(bad)


def test_edited_embedded_nms_settings_are_caught(nms_onnx, tmp_path):
    nms = json.loads({p.key: p.value for p in onnx.load(str(nms_onnx)).metadata_props}["nms"])
    rows = _edited(nms_onnx, tmp_path / "rows.onnx", nms={**nms, "max_det": nms["max_det"] // 2})
    with pytest.raises(CheckpointError, match="'nms' max_det is 150 but the graph's 'detections' output holds 300"):
        LibreYOLO(rows, verify=False)
    iou = _edited(nms_onnx, tmp_path / "iou.onnx", nms={**nms, "iou": 0.7})  # baked into the graph: only the hash
    with pytest.raises(CheckpointError, match="metadata was edited after export"):
        LibreYOLO(iou)
    assert LibreYOLO(iou, verify=False).metadata["nms"]["iou"] == 0.7


def test_renamed_classes_are_an_edit_too(static_onnx, tmp_path):
    names = {str(i): f"thing{i}" for i in range(80)}
    renamed = _edited(static_onnx, tmp_path / "m.onnx", names=names)
    with pytest.raises(CheckpointError, match="metadata was edited after export"):
        LibreYOLO(renamed)
    assert LibreYOLO(renamed, verify=False).names[5] == "thing5"


def test_sidecar_artifacts_use_the_same_check(static_onnx, tmp_path):
    from libreyolo.export.metadata import read_sidecar, sidecar_path, write_sidecar

    program = tmp_path / "m.pte"
    program.write_bytes(b"a program" * 100)
    meta = LibreYOLO(static_onnx).metadata | {"format": "executorch"}
    write_sidecar(program, meta)
    assert read_sidecar(program)["nc"] == 80
    side = json.loads(sidecar_path(program).read_text())
    side["metadata"]["batch"] = 8
    sidecar_path(program).write_text(json.dumps(side))
    with pytest.raises(CheckpointError, match="metadata was edited after export"):
        read_sidecar(program)
    assert read_sidecar(program, verify=False)["batch"] == 8
    write_sidecar(program, meta)
    program.write_bytes(b"another program")
    with pytest.raises(CheckpointError, match="sha256 differs"):
        read_sidecar(program)


def test_content_hash_ignores_only_the_metadata_records():
    from libreyolo.export.metadata import onnx_content_sha256

    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "g",
                                   [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    model = onnx.helper.make_model(graph)
    base = onnx_content_sha256(model.SerializeToString())
    entry = model.metadata_props.add()
    entry.key, entry.value = "k", "v"
    assert onnx_content_sha256(model.SerializeToString()) == base
    model.doc_string = "changed"
    assert onnx_content_sha256(model.SerializeToString()) != base
    with pytest.raises(ValueError):
        onnx_content_sha256(b"\x0a\xff\xff\xff\xff\x0f")  # a length beyond the end


# --- the Hub, offline ----------------------------------------------------------------------------

def _hub_call(tmp_path: Path, env: dict[str, str], name: str = "LibreYOLO9m.pt") -> subprocess.CompletedProcess:
    code = textwrap.dedent(f"""
        import time
        import huggingface_hub, libreyolo.api
        from libreyolo import LibreYOLO
        start = time.perf_counter()
        try:
            print("loaded", LibreYOLO({name!r}).nc)
        except Exception as exc:
            print(type(exc).__name__, exc)
        print("seconds", time.perf_counter() - start)
    """)
    full = dict(os.environ, HF_HOME=str(tmp_path / "hf"), **env)
    full.pop("HF_HUB_ETAG_TIMEOUT", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, cwd=tmp_path,
                          timeout=300)


def test_unreachable_hub_fails_fast_quietly_and_once(tmp_path):
    pytest.importorskip("huggingface_hub")
    out = _hub_call(tmp_path, {"HF_ENDPOINT": "http://127.0.0.1:9"})  # nothing listens on port 9
    seconds = float(out.stdout.split("seconds")[-1])
    assert seconds < 6, out.stdout  # the back-off of huggingface_hub alone takes ~23 s
    assert "CheckpointError LibreYOLO9m.pt is not a local file, and the Hugging Face Hub cannot be reached" \
        in out.stdout
    assert "Retry" not in out.stderr and "Retry" not in out.stdout, out.stderr


def test_offline_mode_reads_only_the_cache(tmp_path):
    pytest.importorskip("huggingface_hub")
    out = _hub_call(tmp_path, {"HF_HUB_OFFLINE": "1"})
    assert "HF_HUB_OFFLINE is set and it is not in the Hugging Face cache" in out.stdout, out.stdout + out.stderr
    snapshot = tmp_path / "hf" / "hub" / "models--LibreYOLO--LibreYOLO9m" / "snapshots" / "0"
    snapshot.mkdir(parents=True)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0")
    LibreYOLO("LibreYOLO9t.yaml", nc=2).save(snapshot / "LibreYOLO9m.pt")  # any valid checkpoint will do
    for env in ({"HF_HUB_OFFLINE": "1"}, {"HF_ENDPOINT": "http://127.0.0.1:9"}):
        out = _hub_call(tmp_path, env)
        assert "loaded 2" in out.stdout, out.stdout + out.stderr


# --- temporary files on termination --------------------------------------------------------------

_SLOW_WRITE = """
import pathlib, sys, time
{setup}
from libreyolo.checkpoint import atomic_write

def slow(tmp):
    tmp.write_bytes(b"partial" * 1000)
    print("writing", flush=True)
    time.sleep(60)

atomic_write(pathlib.Path(sys.argv[1]) / "out.bin", slow)
"""


def _terminate_mid_write(tmp_path: Path, setup: str = "") -> int:
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_WRITE.format(setup=setup), str(tmp_path)],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout.readline().strip() == "writing"
    assert [p.name for p in tmp_path.iterdir()][0].startswith(".out.bin.")  # the temporary exists
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=60)


def test_sigterm_during_a_write_removes_the_temporary_and_still_terminates(tmp_path):
    assert _terminate_mid_write(tmp_path) == -signal.SIGTERM
    assert list(tmp_path.iterdir()) == []


def test_sigterm_calls_the_applications_own_handler(tmp_path):
    setup = "import signal\nsignal.signal(signal.SIGTERM, lambda s, f: sys.exit(7))"
    assert _terminate_mid_write(tmp_path, setup) == 7
    assert list(tmp_path.iterdir()) == []


def test_sigterm_during_export_removes_the_work_folder(three_class, tmp_path):
    code = textwrap.dedent(f"""
        import sys, time
        from libreyolo import LibreYOLO
        from libreyolo.export import onnx as exporter

        def slow_build(self, module, example, path, opts, work):
            path.write_bytes(b"half an artifact")
            print("building", flush=True)
            time.sleep(60)

        exporter.OnnxExporter.build = slow_build
        LibreYOLO({str(three_class[0])!r}).export(format="onnx", imgsz={IMG}, output=sys.argv[1], verbose=False)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "m.onnx")], stdout=subprocess.PIPE,
                            text=True, cwd=ROOT)
    assert proc.stdout.readline().strip() == "building"
    assert len(list(tmp_path.iterdir())) == 1
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM
    assert list(tmp_path.iterdir()) == []


def test_handlers_are_restored_and_interrupts_leave_nothing(tmp_path):
    def mine(signum, frame):
        raise AssertionError("not expected")

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        atomic_write(tmp_path / "ok.txt", lambda tmp: tmp.write_text("done"))
        assert signal.getsignal(signal.SIGTERM) is mine

        def interrupted(tmp):
            tmp.write_text("half")
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            atomic_write(tmp_path / "x.txt", interrupted)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert [p.name for p in tmp_path.iterdir()] == ["ok.txt"]
