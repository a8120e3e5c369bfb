"""Shared fixtures. The compat folder comes from LIBREYOLO_COMPAT_DIR (set by .ci/run)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

# The modules whose exports take minutes on 2 CPU cores (the full run's --durations, 2026-12-07), longest first.
# pytest-xdist (--dist loadfile) hands files to its workers in collection order: these go first, so the two workers
# do not end with one of them alone on a long module. Order only; nothing is skipped.
HEAVY_FIRST = ("test_export_int8.py", "test_validation_power.py", "test_export_detr.py", "test_export_deimv2.py",
               "test_export_deim.py", "test_export_tflite.py", "test_export_onnx.py", "test_export_int8_formats.py",
               "test_export_rtdetrv2.py", "test_compile.py", "test_benchmark_formats.py", "test_export_lwdetr_line.py")


def pytest_configure(config):
    """Under pytest-xdist, each worker's torch gets its share of the cores (``cpu_count // workers``, at least 1):
    two workers of two intra-op threads each on a 2-core machine spin against each other (OpenMP), and the
    suite ran several times slower. A thread count already set (OMP_NUM_THREADS) is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        threads = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # for the subprocesses tests start


def _schedule_rank(item) -> int:
    name = item.path.name
    return HEAVY_FIRST.index(name) if name in HEAVY_FIRST else len(HEAVY_FIRST)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_schedule_rank)  # stable: every module keeps its own order and stays contiguous
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the lent H200; see docs/development.md)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def compat_dir() -> Path:
    value = os.environ.get("LIBREYOLO_COMPAT_DIR")
    if not value:
        pytest.skip("LIBREYOLO_COMPAT_DIR is not set: checkpoint-compatibility fixtures unavailable")
    path = Path(value)
    if not (path / "fill.py").is_file():
        pytest.skip(f"LIBREYOLO_COMPAT_DIR={value} does not hold the compat fixtures (no fill.py)")
    return path


@pytest.fixture(scope="session")
def compat_fill(compat_dir):
    """The fixture helpers module (fill, probes) from the compat folder."""
    sys.path.insert(0, str(compat_dir))
    try:
        import fill as module
    finally:
        sys.path.remove(str(compat_dir))
    return module


DEMO_IMGSZ = 160  # the demo detector's artifacts in the tests: small, a multiple of its stride


@pytest.fixture(scope="session")
def demo():
    """The bundled demo detector (YOLOv9-t trained on the shapes dataset)."""
    from libreyolo import LibreYOLO

    return LibreYOLO("LibreYOLO9t-shapes.pt")


@pytest.fixture(scope="session")
def demo_pte(demo, tmp_path_factory):
    """The demo detector as an ExecuTorch program at DEMO_IMGSZ, exported once per session: the lowering
    (~55 s on 2 cores, hardly shorter at a smaller imgsz) is shared by the ExecuTorch export tests and val()
    on artifacts. Returns the ExportReport."""
    pytest.importorskip("executorch.runtime", reason="executorch is not installed (libreyolo[executorch])")
    return demo.export(format="executorch", imgsz=DEMO_IMGSZ, output=tmp_path_factory.mktemp("demo-pte") / "demo.pte",
                       verbose=False)


@pytest.fixture(scope="session")
def demo_onnx(demo, tmp_path_factory):
    """The demo detector as ONNX at DEMO_IMGSZ (static), exported and validated once per session: val() on
    artifacts and the video tests (an artifact tracks through the same code) share it."""
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (libreyolo[onnx])")
    report = demo.export(format="onnx", imgsz=DEMO_IMGSZ, output=tmp_path_factory.mktemp("demo-onnx") / "demo.onnx",
                         verbose=False)
    assert report.validation.status == "passed", report.validation.text()
    return report.path


def spread_scores(model, seed: int = 0):
    """Give a seeded YOLOv9 well-separated class scores, so its detections survive float noise.

    Plain seeded weights put thousands of candidates within 1e-6 of each other; which of them
    survive NMS then depends on the machine's float rounding (thread count, SIMD width). Like the
    compat fixtures' overrides, this raises the network's gain, scales the class logits and gives
    each class its own bias: on the sample image 100-300 detections over ~20 classes, unchanged
    when every weight is perturbed by a relative 1e-6 (checked by
    ``test_predict.py::test_seeded_detections_survive_float_noise``).
    """
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for key, t in model.net.state_dict().items():
            if key.endswith(".bn.weight"):
                t.mul_(1.2)
            elif key.startswith("head.cv3.") and key.endswith(".2.weight"):
                t.mul_(40.0)
            elif key.startswith("head.cv3.") and key.endswith(".2.bias"):
                t.copy_(-16.0 + 12.0 * torch.rand(t.shape, generator=g))
    return model


def seeded_model(size: str = "t", seed: int = 0, nc: int = 80, spread: bool = True):
    """An untrained model with deterministic, well-spread weights (for tests without fixtures).

    With ``spread`` (default) class scores are separated (:func:`spread_scores`) so detections
    do not hinge on float rounding; ``spread=False`` keeps the near-tied raw seeded weights.
    """
    from libreyolo import LibreYOLO

    model = LibreYOLO(f"LibreYOLO9{size}.yaml", nc=nc)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.net.state_dict().items():
            if not t.is_floating_point():
                continue
            if name.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=g) * 0.5 + 0.75)
            elif t.ndim >= 2:
                t.copy_(torch.randn(t.shape, generator=g) / max(1, t[0].numel()) ** 0.5)
            elif name.endswith("weight"):
                t.copy_(1 + 0.1 * torch.randn(t.shape, generator=g))
            else:
                t.copy_(0.1 * torch.randn(t.shape, generator=g))
    return spread_scores(model, seed) if spread else model
