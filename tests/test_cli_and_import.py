"""The libreyolo command and the package import."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from libreyolo.cli import main


def test_import_is_light_and_imports_no_optional_package():
    code = ("import sys, libreyolo; bad = [m for m in ('torch', 'onnx', 'onnxruntime', 'triton', 'kernels', "
            "'huggingface_hub', 'coremltools', 'executorch', 'tensorrt') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_cli_help_and_argument_errors_answer_before_importing_torch():
    """``--help`` and a mistyped argument come before torch loads (issue 45: they took 9-19 s on a busy
    machine because the option tables imported torch). Checked by the modules loaded, not by a clock:
    every command's help and an unknown argument of every command, in one fresh interpreter."""
    code = ("import sys, contextlib, io\nfrom libreyolo.cli import COMMANDS, main\n"
            "codes = []\nwith contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            "    codes.append(main(['--help']))\n"
            "    for c in COMMANDS:\n        codes.append(main([c, '--help']))\n"
            "        codes.append(main([c, 'bogus=1']))\n"
            "print(codes.count(0), codes.count(2), [m for m in ('torch', 'fastapi', 'onnx') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    n = 10  # commands (track, track-synth: issue 48)
    from libreyolo.cli import COMMANDS

    assert len(COMMANDS) == n
    assert out.stdout.strip().split(maxsplit=2) == [str(n + 1), str(n), "[]"], out.stdout + out.stderr


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from .conftest import seeded_model

    path = tmp_path_factory.mktemp("cli") / "LibreYOLO9t.pt"
    seeded_model("t").save(path)
    return path


@pytest.mark.parametrize("style", ["kv", "dashed"])
def test_predict_accepts_both_argument_styles(checkpoint, tmp_path, capsys, style):
    if style == "kv":
        argv = ["predict", f"model={checkpoint}", "imgsz=320", f"save_dir={tmp_path}", "json=true"]
    else:
        argv = ["predict", "--model", str(checkpoint), "--imgsz", "320", "--save-dir", str(tmp_path), "--json"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "detections" in out
    assert (tmp_path / "sample.jpg").is_file()
    assert isinstance(json.loads((tmp_path / "sample.json").read_text()), list)


@pytest.mark.parametrize("argv, needle", [
    (["predict", "model=x.pt", "bogus=1"], "unknown argument 'bogus'"),
    (["predict", "model=/no/such/file.pt"], "not found"),
    (["predict", "--conf"], "needs a value"),
    (["predict", "model=m.pt", "conf=abc"], "conf"),
    (["frobnicate"], "unknown command"),
])
def test_user_mistakes_print_one_line_and_exit_nonzero(argv, needle, capsys):
    assert main(argv) != 0
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_wrong_value_from_the_library_is_one_line_too(checkpoint, capsys):
    assert main(["predict", f"model={checkpoint}", "conf=3", "save=false"]) == 2
    err = capsys.readouterr().err.strip()
    assert "conf must be a number from 0 to 1" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("argv", [["--help"], ["predict", "--help"], ["export", "--help"]])
def test_help_everywhere(argv, capsys):
    assert main(argv) == 0
    assert "usage: libreyolo" in capsys.readouterr().out


def test_console_script_runs_as_a_module():
    out = subprocess.run([sys.executable, "-m", "libreyolo.cli", "predict", "nope=1"], capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr


def test_benchmark_on_cpu_times_eager_and_says_why_no_graphs(capsys):
    assert main(["benchmark", "model=LibreYOLO9t.yaml", "imgsz=320", "n=2", "device=cpu", "formats=eager"]) == 0
    out = capsys.readouterr().out
    assert "CUDA graphs need a CUDA device" in out and "eager" in out and "ms/img" in out
