"""Tiled restoration (``predict(tile=, tile_pad=)``) against the whole-image restoration.

Seam treatment (RestoreFamily.run_network): each tile's core comes from a forward of the tile plus
``tile_pad`` pixels of context on each side (clipped at the image border), pasted at 4x; no blending.

Two levels:

- the stitching, exactly: with a local toy network (a box sum of radius ``r`` then nearest x4
  upsampling, float64, additions in a fixed order) tiling is bit-identical to one forward as
  soon as ``tile_pad >= r``, and differs at the seams when ``tile_pad < r``;
- SwinIR (the swinir-s compat fixture): its shifted windows pass information across window
  borders block after block, so its reach is far wider than a window. Measured on the fixture
  (24 x 128 input, one seam, tile 64; the float32-vs-float64 noise is 3.3e-6 of an output scale
  of 4.5), the largest difference from the whole image falls with the context a pixel has
  beyond the seam: 2.8 at 0-8 px, 0.72 at 8-16, 0.043 at 16-24, 1.6e-3 at 24-32, 6.2e-5 at 32-40,
  and float32 noise (3.8e-6) from 40 px on. So the claim tested is: a pixel with at least 40
  input pixels of context on each side (its distance to a seam plus ``tile_pad``) equals the
  untiled output within the float64-derived bar (tests/numerics.py); with ``tile_pad=0`` the
  pixels next to a seam are far outside it (the test can fail).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from libreyolo import LibreYOLO
from libreyolo.models.registry import families
from libreyolo.tasks import get_task
from tests.numerics import float32_bar, float64_run

CONTEXT = 40  # input pixels of context from which SwinIR tiles match the whole image (measured, see above)


def _opts(**kw):
    return get_task("restore").predict_options(kw)


class LocalNet(nn.Module):
    """A network that sees exactly ``radius`` pixels around each pixel (zero outside the input)."""

    def __init__(self, radius: int) -> None:
        super().__init__()
        self.radius = radius
        self.anchor = nn.Parameter(torch.zeros((), dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r, (h, w) = self.radius, x.shape[-2:]
        p = F.pad(x, (r, r, r, r))
        y = sum(p[..., r + dy:r + dy + h, r + dx:r + dx + w] * (1 + 3 * abs(dy) + abs(dx))
                for dy in range(-r, r + 1) for dx in range(-r, r + 1))
        return F.interpolate(y, scale_factor=4, mode="nearest") + self.anchor


def _run(net: nn.Module, x: torch.Tensor, **opts) -> torch.Tensor:
    fam = families()["swinir"]
    with torch.no_grad():
        return fam.run_network(lambda b: fam.named_outputs(net(b)), x, _opts(**opts) if opts else None)["image"]


# --- the stitching ------------------------------------------------------------------------------
@pytest.mark.parametrize(("tile", "pad"), [(8, 3), (16, 3), (16, 5), (24, 8), (64, 0)])
def test_tiles_with_context_at_least_the_reach_equal_one_forward_exactly(tile, pad):
    net = LocalNet(radius=3)
    x = torch.rand(2, 3, 40, 56, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    whole = _run(net, x)
    assert torch.equal(_run(net, x, tile=tile, tile_pad=pad), whole)


def test_tiles_with_less_context_than_the_reach_differ_only_near_seams():
    net = LocalNet(radius=3)
    x = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    diff = (_run(net, x, tile=16, tile_pad=1) - _run(net, x)).abs().amax(dim=(0, 1))
    near = torch.zeros(128, dtype=torch.bool)
    near[4 * (16 - 2):4 * (16 + 2)] = True  # within 2 input pixels of the seam at 16
    seam_rows, seam_cols = near[:, None].expand(128, 128), near[None, :].expand(128, 128)
    assert float(diff[seam_rows | seam_cols].max()) > 0.1
    assert float(diff[~(seam_rows | seam_cols)].max()) == 0.0


def test_predict_tiles_through_the_same_pipeline():
    """predict(tile=...) of a model whose network sees 2 pixels: identical to predict() once tile_pad >= 2,
    for an image whose sides are not multiples of the tile (nor of the window)."""
    model = LibreYOLO("LibreSwinIRs.yaml")
    model.net = LocalNet(radius=2).float()
    x = torch.rand(3, 37, 50, generator=torch.Generator().manual_seed(2)) * 0.02  # the box sum stays in [0, 1]
    whole = model.predict(x).restored.data
    assert tuple(whole.shape) == (148, 200, 3)
    assert torch.equal(model.predict(x, tile=16, tile_pad=2).restored.data, whole)
    assert not torch.equal(model.predict(x, tile=16, tile_pad=0).restored.data, whole)


def test_graphed_tiles_are_the_eager_tiles():
    """cuda_graph=True with tiling: one capture per tile shape (interior and edge tiles), the
    stitched image equal to the eager one (emulated backend on a CPU: the code path, not CUDA)."""
    from libreyolo.graphs.backend import EmulatedGraphBackend

    model = LibreYOLO("LibreSwinIRs.yaml")
    model.net = LocalNet(radius=2).float()
    model.set_graph_backend(EmulatedGraphBackend())
    x = torch.rand(3, 37, 50, generator=torch.Generator().manual_seed(3)) * 0.02
    eager = model.predict(x, tile=16, tile_pad=2).restored.data
    graphed = model.predict(x, tile=16, tile_pad=2, cuda_graph=True).restored.data
    assert torch.equal(graphed, eager)
    assert model.graph_info()["captures"] >= 1


# --- SwinIR -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def swinir(compat_dir, compat_fill, tmp_path_factory):
    d = compat_dir / "fixtures" / "swinir-s"
    if not d.is_dir():
        pytest.skip(f"no swinir-s fixture under {compat_dir}")
    meta = json.loads((d / "meta.json").read_text())
    meta = {**meta, "names": {int(k): v for k, v in meta["names"].items()}}
    path = Path(tmp_path_factory.mktemp("swinir")) / "LibreSwinIRs.pt"
    torch.save({"model": compat_fill.fill(d), **meta}, path)
    return LibreYOLO(path)


@pytest.fixture(scope="module")
def whole(swinir):
    """A smooth 24 x 128 image (one seam at input column 64 with tile 64) and the untiled float32
    and float64 outputs."""
    g = torch.Generator().manual_seed(0)
    x = F.interpolate(torch.rand(1, 3, 4, 16, generator=g), size=(24, 128), mode="bicubic").clamp(0, 1)
    out32 = _run(swinir.net, x)
    fam = swinir.family
    out64 = float64_run(lambda net, b: fam.named_outputs(net(b))["image"], swinir.net, x)
    return x, out32, out64


def _seam_distance(width: int, seam: int) -> torch.Tensor:
    """Input-pixel distance of each output column's centre to the seam."""
    return ((torch.arange(width) + 0.5) / 4 - seam).abs()


def test_swinir_tiles_with_enough_context_equal_the_whole_image_within_float32_noise(swinir, whole):
    x, out32, out64 = whole
    tiled = _run(swinir.net, x, tile=64, tile_pad=CONTEXT)
    bar = float32_bar(tiled, out32, out64)
    assert bar.ok, bar


def test_swinir_tiles_without_context_differ_at_the_seam_and_agree_far_from_it(swinir, whole):
    x, out32, out64 = whole
    tiled = _run(swinir.net, x, tile=64, tile_pad=0)
    dist = _seam_distance(out32.shape[-1], 64)
    far, near = dist >= CONTEXT, dist < 8
    bar = float32_bar(tiled[..., far], out32[..., far], out64[..., far])
    assert bar.ok, f"far from the seam: {bar}"
    seam = float32_bar(tiled[..., near], out32[..., near], out64[..., near])
    assert seam.error > 100 * seam.allowed, f"next to the seam: {seam}"
