"""CoreML conversion (.mlpackage): portable ML Program ops; honest about validation on Linux."""
from __future__ import annotations

import sys

import pytest

pytest.importorskip("coremltools", reason="coremltools is not installed (pip install 'libreyolo[coreml]')")

from libreyolo import LibreYOLO  # noqa: E402
from libreyolo.errors import ArgumentError  # noqa: E402
from libreyolo.export import ExportError  # noqa: E402
from libreyolo.export.base import get_exporter  # noqa: E402
from libreyolo.runtimes.base import RuntimeUnavailableError  # noqa: E402
from tests.test_export_common import exported, model  # noqa: E402

PORTABLE_MIL_OPS = {
    "add", "avg_pool", "cast", "concat", "const", "conv", "max_pool", "mul", "reduce_sum", "reshape", "sigmoid",
    "silu", "softmax", "split", "sub", "upsample_nearest_neighbor", "transpose", "slice_by_index", "real_div",
    "range_1d", "expand_dims", "squeeze", "tile", "gather", "linear", "matmul",
}


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return exported(tmp_path_factory, "coreml")


def test_coreml_package_is_an_ml_program_of_portable_ops(package):
    assert package.path.is_dir() and (package.path / "Manifest.json").is_file()
    ops = get_exporter("coreml").graph_ops(package.path)
    assert "conv" in ops and ops <= PORTABLE_MIL_OPS, ops - PORTABLE_MIL_OPS


@pytest.mark.skipif(sys.platform == "darwin", reason="on macOS the package is really validated")
def test_coreml_report_says_not_validated_off_macos(package):
    assert package.validation.status == "not validated"
    assert package.validation.headline() == "not validated: CoreML runs only on macOS"
    with pytest.raises(RuntimeUnavailableError, match="CoreML runs only on macOS"):
        LibreYOLO(package.path)


def test_coreml_metadata_is_in_the_package(package):
    from libreyolo.runtimes.coreml import read_metadata

    meta = read_metadata(package.path)
    assert meta["family"] == "yolo9" and meta["normalization"]["scale"] == pytest.approx(1 / 255)
    assert meta["normalization"]["color"] == "RGB" and meta["letterbox"]["placement"] == "topleft"
    assert meta["validation"]["status"] == ("passed" if sys.platform == "darwin" else "not validated")


@pytest.mark.skipif(sys.platform == "darwin", reason="on macOS the package is really validated")
def test_require_validation_fails_where_coreml_cannot_run(tmp_path):
    with pytest.raises(ExportError, match="cannot be validated here: CoreML runs only on macOS"):
        model().export(format="coreml", imgsz=64, output=tmp_path / "x.mlpackage", require_validation=True,
                       verbose=False)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("opts, message", [
    ({"dynamic": True}, "dynamic=True is not possible for format=coreml"),
    ({"batch": 2}, "batch must be 1"),
])
def test_impossible_coreml_options_are_refused(tmp_path, opts, message):
    with pytest.raises(ArgumentError, match=message):
        model().export(format="coreml", output=tmp_path / "x.mlpackage", **opts)
    assert not list(tmp_path.iterdir())
