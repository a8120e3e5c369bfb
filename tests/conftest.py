"""Shared fixtures. The compat folder comes from LIBREYOLO_COMPAT_DIR (set by .ci/run)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the lent H200; see README 'GPU tests')")
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


def seeded_model(size: str = "t", seed: int = 0, nc: int = 80):
    """An untrained model with deterministic, well-spread weights (for tests without fixtures)."""
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
    return model
