"""Fuzzing every entry point (issue 22): one clean line, never a traceback.

For every CLI command and the main Python entry points, option values are drawn from each
declared schema's edges and beyond (NaN, inf, negative, huge, wrong types, empty, unicode,
repeated keys, unknown keys); checkpoints, artifact metadata (ONNX entries, ``.pte`` sidecars)
and images are corrupted byte by byte. The property: exit code 0, 1 or 2 with at most one line
on stderr and no traceback (Python: a result or a :class:`LibreYOLOError`), within a time
limit per example and the memory budget, and no temporary file left behind.

CI runs a fixed seed (``derandomize``) and a small example budget; the ``slow`` variants run
ten times as many and only when asked (``LIBREYOLO_FUZZ_LONG=1 pytest -m slow tests/test_fuzz.py``),
since CI's ``make test`` runs slow tests too.
"""
from __future__ import annotations

import io
import json
import math
import os
import resource
from contextlib import redirect_stderr, redirect_stdout
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

hypothesis = pytest.importorskip("hypothesis", reason="the fuzz suite needs hypothesis (the dev extra)")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from libreyolo import LibreYOLO  # noqa: E402
from libreyolo.cli import COMMANDS, main  # noqa: E402
from libreyolo.errors import LibreYOLOError  # noqa: E402

IMG = 64
CI_EXAMPLES = 25
MEMORY_BUDGET = 3 << 30  # bytes of peak RSS growth a fuzz test may cause (docs/predict.md, Limits)
EDGES = ["nan", "NaN", "-nan", "inf", "-inf", "1e309", "-1e309", "-1", "0", "-0", "1", "2", "0.5", "1.5", "", " ",
         "true", "false", "auto", "yes", "None", "null", "0x10", "1_000", "1e3", "9" * 40, "-" + "9" * 40,
         "١٢", "日本語", "é", "\u202e", "\x00", "a" * 5000, "=", "==", "--", "0,1,2", "-1,2", "[1]", "{}", "cuda:99",
         "meta", "/dev/zero", "/proc/self/mem", "~", ".", ".."]
_WORK = 1 << 60  # placeholder for "a huge number"
long_run = pytest.mark.skipif(not os.environ.get("LIBREYOLO_FUZZ_LONG"),
                              reason="the long fuzz run: set LIBREYOLO_FUZZ_LONG=1")


def _fuzz_settings(examples: int, seconds: float) -> settings:
    return settings(max_examples=examples, derandomize=True, deadline=timedelta(seconds=seconds),
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large], database=None)


def _numbers(opt: Any) -> list[str]:
    out = []
    for bound in (getattr(opt, "min", None), getattr(opt, "max", None)):
        if bound is not None:
            for v in (bound - 1, bound - 1e-9, bound, bound + 1e-9, bound + 1, bound * 10 + 1, bound * 1e6):
                out.append(repr(int(v)) if opt.type is int and float(v).is_integer() else repr(float(v)))
    return out


def valid_value(opt: Any) -> st.SearchStrategy[str]:
    """Values the declaration allows (small ones: a valid but huge size is only slow)."""
    parts = [st.just(str(opt.default))] if opt.default is not None else []
    lo, hi = getattr(opt, "min", None), getattr(opt, "max", None)
    if opt.type is int and lo is not None and hi is not None:
        parts.append(st.integers(int(lo), int(min(hi, lo + 64))).map(str))
    elif opt.type is float and lo is not None and hi is not None:
        parts.append(st.floats(lo, hi).map(repr))
    if getattr(opt, "choices", ()):
        parts.append(st.sampled_from(opt.choices))
    if opt.flag_value is not None:  # a flag: true/false
        parts.append(st.sampled_from(["true", "false", "0", "1"]))
    return st.one_of(*parts) if parts else st.sampled_from(EDGES)


def cli_value(opt: Any) -> st.SearchStrategy[str]:
    """Strings at and beyond the option's declared edges (``libreyolo.options.Opt``), and plain junk.
    Written against the declaration's fields with defaults, so the suite also runs on older code."""
    parts = [st.sampled_from(EDGES), st.text(max_size=12)]
    if opt.type in (int, float):
        parts += [st.sampled_from(_numbers(opt) or ["0"]), st.integers().map(str),
                  st.floats(allow_nan=True, allow_infinity=True).map(repr)]
    choices = getattr(opt, "choices", ())
    if choices:
        parts.append(st.sampled_from([*choices, *(c.upper() for c in choices), " " + choices[0]]))
    return st.one_of(*parts)


@st.composite
def cli_tokens(draw, opts: dict[str, Any], skip: tuple[str, ...] = ()) -> list[str]:
    keys = [k for k in opts if k not in skip]
    tokens: list[str] = []
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["valid"] * 6 + ["kv", "kv", "dash", "flag", "unknown", "junk"]))
        key = draw(st.sampled_from(keys))
        value = draw(valid_value(opts[key]) if kind == "valid" else cli_value(opts[key]))
        if kind in ("kv", "valid"):
            tokens.append(f"{key}={value}")
        elif kind == "dash":
            tokens += [f"--{key.replace('_', '-')}", value]
        elif kind == "flag":
            tokens.append(f"--{key}")
        elif kind == "unknown":
            tokens.append(f"{draw(st.text(min_size=1, max_size=8))}={value}")
        else:
            tokens.append(draw(st.text(max_size=8)))
    return tokens


def _run_cli(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)  # an exception here (a traceback on the command line) fails the test
    return code, err.getvalue()


def _assert_clean(code: int, err: str, argv: list[str]) -> None:
    lines = [line for line in err.splitlines() if line.strip() and "warning" not in line.lower()]
    assert code in (0, 1, 2), (code, argv, err)
    assert "Traceback" not in err, (argv, err)
    if code:
        assert len(lines) <= 1, (argv, err)


class _Peak:
    """Peak RSS growth over a test, against the memory budget."""

    def __enter__(self) -> _Peak:
        self.start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return self

    def __exit__(self, *exc: object) -> None:
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self.start
        assert grown < MEMORY_BUDGET, f"peak RSS grew by {grown / 2**30:.1f} GiB"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fuzz") / "LibreYOLO9t.pt"
    torch.manual_seed(0)
    LibreYOLO("LibreYOLO9t.yaml", nc=3, names=["a", "b", "c"]).save(path)
    return path


@pytest.fixture(scope="module")
def picture(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fuzz-img") / "a.png"
    Image.fromarray((np.random.RandomState(0).rand(40, 48, 3) * 255).astype(np.uint8)).save(path)
    return path


# --- the command line ------------------------------------------------------------------------------
def _cli_parsing_only(examples: int):
    @_fuzz_settings(examples, 20)
    @given(data=st.data())
    def check(data):
        command = data.draw(st.sampled_from(sorted(COMMANDS)))
        opts = COMMANDS[command][1]
        argv = [command, "model=/nonexistent/LibreYOLO9t.pt", *data.draw(cli_tokens(opts, skip=("model",)))]
        code, err = _run_cli(argv)
        _assert_clean(code, err, argv)
        assert code != 0 or any(t in ("-h", "--help") for t in argv), (argv, err)  # no model: nothing ran

    return check


def test_every_command_parses_hostile_options_into_one_clean_line():
    with _Peak():
        _cli_parsing_only(CI_EXAMPLES * 4)()


@pytest.mark.slow
@long_run
def test_every_command_parses_hostile_options_into_one_clean_line_long():
    _cli_parsing_only(CI_EXAMPLES * 40)()


def _cli_train_val(examples: int, tiny: Path, tmp: Path):
    """train and val with a real model and a missing dataset: every option reaches the Python-side
    checks (TrainArgs, val's table, the extras) before the dataset error ends the run."""

    @_fuzz_settings(examples, 30)
    @given(command=st.sampled_from(["train", "val"]), data=st.data())
    def check(command, data):
        tokens = data.draw(cli_tokens(COMMANDS[command][1], skip=("model", "data", "project", "resume")))
        argv = [command, f"model={tiny}", f"data={tmp / 'missing.yaml'}", f"project={tmp}", *tokens]
        if command == "val":
            argv.remove(f"project={tmp}")
        code, err = _run_cli(argv)
        _assert_clean(code, err, argv)
        assert code != 0 or any(t in ("-h", "--help") for t in argv), (argv, err)

    return check


def test_train_and_val_refuse_hostile_options_cleanly_past_parsing(tiny, tmp_path):
    with _Peak():
        _cli_train_val(CI_EXAMPLES, tiny, tmp_path)()


@pytest.mark.slow
@long_run
def test_train_and_val_refuse_hostile_options_cleanly_past_parsing_long(tiny, tmp_path):
    _cli_train_val(CI_EXAMPLES * 10, tiny, tmp_path)()


def _cli_predict(examples: int, tiny: Path, picture: Path, out: Path):
    # imgsz stays small (a large valid one is just slow) and compile off (a valid compile=true is a real
    # Inductor compilation, minutes on a small CPU: its values are fuzzed by the parsing test above and
    # its behaviour tested in test_compile.py); everything else is fuzzed
    @_fuzz_settings(examples, 30)
    @given(tokens=cli_tokens(COMMANDS["predict"][1], skip=("imgsz", "model", "source", "save_dir", "compile")))
    def check(tokens):
        argv = ["predict", f"model={tiny}", f"source={picture}", f"imgsz={IMG}", f"save_dir={out}", *tokens]
        code, err = _run_cli(argv)
        _assert_clean(code, err, argv)
        assert not [p for p in out.rglob("*") if p.name.startswith(".")], "a temporary file was left behind"

    return check


def test_predict_runs_or_refuses_hostile_options_cleanly(tiny, picture, tmp_path):
    with _Peak():
        _cli_predict(CI_EXAMPLES, tiny, picture, tmp_path)()


@pytest.mark.slow
@long_run
def test_predict_runs_or_refuses_hostile_options_cleanly_long(tiny, picture, tmp_path):
    _cli_predict(CI_EXAMPLES * 10, tiny, picture, tmp_path)()


# --- the Python API ------------------------------------------------------------------------------
PY_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.sampled_from([_WORK, -_WORK, 2**31]),
                      st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                      st.sampled_from(EDGES), st.lists(st.integers(-5, 5), max_size=3), st.just({}),
                      st.just(object()), st.just(b"bytes"), st.just(np.float32(math.nan)), st.just(np.int64(7)))


def _py_predict(examples: int, model, picture: Path):
    import inspect

    keys = [k for k in inspect.signature(model.predict).parameters if k not in ("source", "imgsz", "stream")]

    @_fuzz_settings(examples, 30)
    @given(kwargs=st.dictionaries(st.sampled_from(keys), PY_VALUES, max_size=4))
    def check(kwargs):
        try:
            model.predict(str(picture), imgsz=IMG, **kwargs)
        except LibreYOLOError:
            pass

    return check


def test_predict_python_api_gives_a_result_or_a_libreyolo_error(tiny, picture):
    with _Peak():
        _py_predict(CI_EXAMPLES, LibreYOLO(tiny), picture)()


@pytest.mark.slow
@long_run
def test_predict_python_api_gives_a_result_or_a_libreyolo_error_long(tiny, picture):
    _py_predict(CI_EXAMPLES * 10, LibreYOLO(tiny), picture)()


def _py_options(examples: int):
    from libreyolo.export.cli import normalise
    from libreyolo.export.options import EXPORT_OPTIONS
    from libreyolo.options import check_all
    from libreyolo.train.options import VAL_OPTIONS
    from libreyolo.train.trainer import TrainArgs

    train_keys = sorted(f for f in TrainArgs.__dataclass_fields__ if f != "extra")

    @_fuzz_settings(examples, 10)
    @given(which=st.sampled_from(["train", "val", "export"]), data=st.data())
    def check(which, data):
        keys = {"train": train_keys, "val": sorted(VAL_OPTIONS), "export": sorted(EXPORT_OPTIONS)}[which]
        kwargs = data.draw(st.dictionaries(st.sampled_from([*keys, "bogus"]), PY_VALUES, max_size=5))
        try:
            if which == "train":
                TrainArgs.from_kwargs({"data": "d.yaml", **kwargs})
            elif which == "val":
                check_all(VAL_OPTIONS, kwargs)
            else:
                normalise({"model": "m.pt", **kwargs})
        except LibreYOLOError:
            pass

    return check


def test_train_val_and_export_options_give_values_or_a_libreyolo_error():
    _py_options(CI_EXAMPLES * 4)()


@pytest.mark.slow
@long_run
def test_train_val_and_export_options_give_values_or_a_libreyolo_error_long():
    _py_options(CI_EXAMPLES * 40)()


# --- files ---------------------------------------------------------------------------------------
@st.composite
def corrupted(draw, data: bytes, hot: int = 1 << 16) -> bytes:
    """``data`` with a few byte flips, a cut, an insertion or a zeroed run; half of the edits land in
    the first or last ``hot`` bytes (headers, pickles, zip directories), where structure lives."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        edge = draw(st.booleans())
        n = len(buf)
        if n == 0:
            break
        pos = (draw(st.integers(0, min(hot, n) - 1)) if draw(st.booleans()) else n - 1 - draw(
            st.integers(0, min(hot, n) - 1))) if edge else draw(st.integers(0, n - 1))
        op = draw(st.sampled_from(["flip", "flip", "cut", "insert", "zero"]))
        if op == "flip":
            buf[pos] ^= draw(st.integers(1, 255))
        elif op == "cut":
            del buf[pos:]
        elif op == "insert":
            buf[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        else:
            buf[pos:pos + draw(st.integers(1, 64))] = bytes(min(64, n - pos))
    return bytes(buf)


def _checkpoints(examples: int, tiny: Path, tmp: Path):
    raw = tiny.read_bytes()

    @_fuzz_settings(examples, 30)
    @given(blob=corrupted(raw))
    def check(blob):
        path = tmp / "LibreYOLO9t.pt"
        path.write_bytes(blob)
        try:
            LibreYOLO(path)
        except LibreYOLOError:
            pass

    return check


def test_corrupted_checkpoints_load_or_give_a_checkpoint_error(tiny, tmp_path):
    with _Peak():
        _checkpoints(CI_EXAMPLES, tiny, tmp_path)()


@pytest.mark.slow
@long_run
def test_corrupted_checkpoints_load_or_give_a_checkpoint_error_long(tiny, tmp_path):
    _checkpoints(CI_EXAMPLES * 10, tiny, tmp_path)()


def _metadata_props() -> dict[str, str]:
    from libreyolo.export.metadata import METADATA_VERSION, encode

    meta = {"libreyolo_metadata": METADATA_VERSION, "format": "onnx", "family": "yolo9", "size": "t",
            "task": "detect", "nc": 3, "names": {"0": "a", "1": "b", "2": "c"}, "imgsz": 64, "batch": 1, "stride": 32,
            "input_name": "images", "output_names": ["predictions"], "input_dtype": "float32", "letterbox": {},
            "precision": "fp32", "dynamic_axes": {}, "nms": None}
    return encode(meta)


JSON_VALUES = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=6)),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                        max_size=3), max_leaves=8)


def _metadata(examples: int, tmp: Path):
    from libreyolo.export.metadata import decode, read_sidecar, sidecar_path
    from libreyolo.runtimes.base import check_graph, check_metadata

    base = _metadata_props()
    artifact = tmp / "m.pte"
    artifact.write_bytes(b"program bytes")

    @_fuzz_settings(examples, 10)
    @given(key=st.sampled_from(sorted(base)), data=st.data())
    def check(key, data):
        props = dict(base)
        how = data.draw(st.sampled_from(["json", "text", "deep", "drop", "bytes"]))
        if how == "json":
            props[key] = json.dumps(data.draw(JSON_VALUES))
        elif how == "text":
            props[key] = data.draw(st.sampled_from(EDGES) | st.text(max_size=20))
        elif how == "deep":
            props[key] = data.draw(st.sampled_from(["[", "{\"a\":"])) * data.draw(st.integers(30, 300_000))
        elif how == "drop":
            props.pop(key)
        try:
            meta = decode(props, "m.onnx")
            family, *_ = check_metadata(meta, "m.onnx")
            check_graph(meta, family, {"images": (1, 3, 64, 64)}, {"predictions": (1, 7, 84)}, "m.onnx")
        except LibreYOLOError:
            pass
        sidecar = data.draw(corrupted(json.dumps({"artifact": "m.pte", "sha256": "0" * 64, "metadata": props})
                                      .encode(), hot=256))
        sidecar_path(artifact).write_bytes(sidecar)
        for verify in (True, False):
            try:
                read_sidecar(artifact, verify=verify)
            except LibreYOLOError:
                pass

    return check


def test_corrupted_artifact_metadata_and_sidecars_give_a_checkpoint_error():
    import tempfile

    with tempfile.TemporaryDirectory() as tmp, _Peak():
        _metadata(CI_EXAMPLES * 2, Path(tmp))()


@pytest.mark.slow
@long_run
def test_corrupted_artifact_metadata_and_sidecars_give_a_checkpoint_error_long(tmp_path):
    _metadata(CI_EXAMPLES * 20, tmp_path)()


def _images(examples: int, picture: Path, tmp: Path):
    from libreyolo.data.sources import read_image_file

    buf = io.BytesIO()
    Image.open(picture).save(buf, format="JPEG")
    bases = {"png": picture.read_bytes(), "jpg": buf.getvalue()}

    @_fuzz_settings(examples, 10)
    @given(kind=st.sampled_from(sorted(bases)), data=st.data())
    def check(kind, data):
        path = tmp / f"x.{kind}"
        path.write_bytes(data.draw(corrupted(bases[kind], hot=64)))
        try:
            arr = read_image_file(path)
            assert arr.ndim == 3 and arr.shape[2] == 3 and arr.dtype == np.uint8
        except LibreYOLOError:
            pass

    return check


def test_corrupted_images_decode_or_give_an_image_error(picture, tmp_path):
    with _Peak():
        _images(CI_EXAMPLES * 2, picture, tmp_path)()


@pytest.mark.slow
@long_run
def test_corrupted_images_decode_or_give_an_image_error_long(picture, tmp_path):
    _images(CI_EXAMPLES * 20, picture, tmp_path)()
