"""The restore task without reference weights: options, classes, training refusal, PSNR/SSIM and val.

Models are untrained ``LibreSwinIRs.yaml`` builds (seeded, the same everywhere) or that model with
its network swapped for a bicubic upsampler (a fast, reasonable super-resolver to measure a
mutation against). Inputs stay tiny: SwinIR is heavy on a CPU.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from libreyolo import LibreYOLO
from libreyolo.errors import ArgumentError
from libreyolo.tasks import get_task
from libreyolo.train.restore_metrics import MAX_PSNR, RestoreMetrics, psnr, rgb_to_y, ssim


@pytest.fixture(scope="module")
def sr_model():
    return LibreYOLO("LibreSwinIRs.yaml")


@pytest.fixture(scope="module")
def hr_folder(tmp_path_factory):
    return get_task("restore").synthetic_dataset(tmp_path_factory.mktemp("hr"), n=3)


class Bicubic(nn.Module):
    """x4 bicubic upsampling, optionally shifted by ``shift`` output pixels (the mutation)."""

    def __init__(self, shift: int = 0) -> None:
        super().__init__()
        self.shift = shift
        self.anchor = nn.Parameter(torch.zeros(()))  # a parameter, so the model has a device

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.interpolate(x, scale_factor=4, mode="bicubic", align_corners=False) + self.anchor
        return torch.roll(y, shifts=(self.shift, self.shift), dims=(2, 3)) if self.shift else y


# --- classes and training ----------------------------------------------------------------------
def test_a_fresh_restore_model_has_the_image_name_not_coco(sr_model):
    assert (sr_model.nc, sr_model.names) == (1, {0: "image"})


def test_nc_does_not_apply_to_a_restore_architecture():
    with pytest.raises(ArgumentError, match="nc/names do not apply to restore"):
        LibreYOLO("LibreSwinIRs.yaml", nc=3)


def test_a_restore_checkpoint_without_classes_reads_as_image(sr_model, tmp_path):
    path = sr_model.save(tmp_path / "LibreSwinIRs.pt")
    raw = torch.load(path, weights_only=True)
    del raw["nc"], raw["names"]
    torch.save(raw, path)
    assert (LibreYOLO(path).nc, LibreYOLO(path).names) == (1, {0: "image"})


def test_train_says_in_one_line_that_restoration_is_not_trained(sr_model, hr_folder):
    with pytest.raises(ArgumentError, match="training is not offered for image restoration") as err:
        sr_model.train(data=str(hr_folder), epochs=1)
    assert "\n" not in str(err.value)


def test_cli_train_prints_one_line_and_fails(hr_folder, capsys):
    from libreyolo.cli import main

    assert main(["train", "model=LibreSwinIRs.yaml", f"data={hr_folder}", "epochs=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "training is not offered for image restoration" in err[0]


# --- options -------------------------------------------------------------------------------------
def test_tile_options_have_their_defaults(sr_model):
    assert dict(sr_model.predict_options()) == {"tile": None, "tile_pad": 32}
    assert sr_model.predict_options(tile=0).tile is None
    assert sr_model.predict_options(tile="64", tile_pad="8") == {"tile": 64, "tile_pad": 8}


@pytest.mark.parametrize("value", [12, -8, 1.5, True, "x"])
def test_a_tile_that_is_not_a_positive_multiple_of_the_window_is_refused(sr_model, value):
    with pytest.raises(ArgumentError, match="tile must be"):
        sr_model.predict(torch.rand(3, 16, 16), tile=value)


def test_a_negative_tile_pad_is_refused(sr_model):
    with pytest.raises(ArgumentError, match="tile_pad must be an integer from 0"):
        sr_model.predict(torch.rand(3, 16, 16), tile=16, tile_pad=-1)


def test_options_of_other_tasks_are_refused_by_name(sr_model):
    with pytest.raises(ArgumentError, match="other than tile, tile_pad; got 'classes', 'conf'"):
        sr_model.predict(torch.rand(3, 16, 16), conf=0.3, classes=[0])


def test_detection_ignores_the_tile_options_like_any_other_tasks_option():
    opts = LibreYOLO("LibreYOLO9t.yaml").predict_options(tile=64)
    assert "tile" not in opts and opts.conf == 0.25


# --- metrics -------------------------------------------------------------------------------------
def test_y_of_known_colours_is_bt601_studio_range():
    rgb = torch.tensor([[255.0, 0.0, 0.0], [0.0, 255.0, 0.0], [0.0, 0.0, 255.0], [255.0, 255.0, 255.0],
                        [0.0, 0.0, 0.0]]).T.reshape(3, 1, 5)
    want = torch.tensor([16 + 65.481, 16 + 128.553, 16 + 24.966, 235.0, 16.0], dtype=torch.float64)
    assert torch.allclose(rgb_to_y(rgb).flatten(), want, atol=1e-9)


def test_psnr_of_identical_images_is_capped():
    a = torch.randint(0, 256, (3, 20, 20), dtype=torch.uint8)
    assert psnr(a, a) == MAX_PSNR == 100.0


def test_psnr_of_a_known_error_matches_the_formula():
    a = torch.full((3, 16, 16), 100.0)
    b = a.clone()
    b[:, ::2] += 10.0  # half the values off by 10: MSE 50
    assert psnr(a, b) == pytest.approx(10 * math.log10(255**2 / 50.0), abs=1e-9)


def test_ssim_of_identical_images_is_one_and_drops_with_noise():
    g = torch.Generator().manual_seed(0)
    a = F.interpolate(torch.rand(1, 3, 8, 8, generator=g), size=(32, 32), mode="bilinear")[0] * 255
    assert ssim(a, a) == pytest.approx(1.0, abs=1e-12)
    light = ssim(a, a + torch.randn(a.shape, generator=g) * 5)
    heavy = ssim(a, a + torch.randn(a.shape, generator=g) * 40)
    assert 1.0 > light > heavy


def test_ssim_equals_the_formula_on_a_constant_pair():
    """Constant images: no variance, so SSIM is the luminance term (2 mu_x mu_y + C1) / (mu_x^2 + mu_y^2 + C1)."""
    a, b = torch.full((1, 16, 16), 100.0), torch.full((1, 16, 16), 120.0)
    c1 = (0.01 * 255) ** 2
    assert ssim(a, b) == pytest.approx((2 * 100 * 120 + c1) / (100**2 + 120**2 + c1), abs=1e-12)


def test_ssim_equals_the_opencv_formulation_super_resolution_papers_use():
    """BasicSR's SSIM (SwinIR's evaluation): cv2.filter2D with the 11 x 11 sigma 1.5 Gaussian, valid part."""
    cv2 = pytest.importorskip("cv2")
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (40, 50)).astype(np.float64)
    b = np.clip(a + rng.normal(0, 20, a.shape), 0, 255)
    k = cv2.getGaussianKernel(11, 1.5)
    win = k @ k.T

    def blur(z):
        return cv2.filter2D(z, -1, win)[5:-5, 5:-5]

    ma, mb = blur(a), blur(b)
    va, vb, cov = blur(a * a) - ma**2, blur(b * b) - mb**2, blur(a * b) - ma * mb
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    want = (((2 * ma * mb + c1) * (2 * cov + c2)) / ((ma**2 + mb**2 + c1) * (va + vb + c2))).mean()
    assert ssim(torch.from_numpy(a)[None], torch.from_numpy(b)[None]) == pytest.approx(float(want), abs=1e-12)


def test_metrics_crop_the_border_before_measuring():
    a = torch.full((24, 24, 3), 90, dtype=torch.uint8)
    b = a.clone()
    b[:4] = 0  # damage only the 4-pixel border
    m = RestoreMetrics(border=4)
    m.update([b], [a])
    assert m.compute()["PSNR_Y"] == MAX_PSNR and m.compute()["SSIM_RGB"] == pytest.approx(1.0)


# --- val -----------------------------------------------------------------------------------------
def test_val_on_hr_images_returns_finite_psnr_and_ssim(sr_model, hr_folder):
    out = sr_model.val(data=str(hr_folder), batch=2, workers=0)
    assert set(out) == {"PSNR_Y", "SSIM_Y", "PSNR_RGB", "SSIM_RGB"}
    assert all(math.isfinite(v) for v in out.values()), out
    assert get_task("restore").metric == "PSNR_Y"


def test_val_scores_what_predict_restores(sr_model, hr_folder):
    """One image, batch 1: val's PSNR is that of predict() on the bicubic-downsampled image."""
    import numpy as np
    from PIL import Image

    from libreyolo.train.restore_data import degrade

    path = sorted(hr_folder.glob("*.png"))[0]
    hr, lr = degrade(np.asarray(Image.open(path).convert("RGB")), 4)
    restored = sr_model.predict(lr, color_format="rgb").restored.data
    m = RestoreMetrics(border=4)
    m.update([restored], [torch.from_numpy(hr)])
    one = path.parent / "one"
    one.mkdir(exist_ok=True)
    (one / path.name).write_bytes(path.read_bytes())
    assert sr_model.val(data=str(one), batch=1, workers=0) == pytest.approx(m.compute(), abs=1e-12)


def test_a_shifted_output_scores_lower_psnr(hr_folder):
    good, shifted = LibreYOLO("LibreSwinIRs.yaml"), LibreYOLO("LibreSwinIRs.yaml")
    good.net, shifted.net = Bicubic(), Bicubic(shift=2)
    a = good.val(data=str(hr_folder), batch=3, workers=0)
    b = shifted.val(data=str(hr_folder), batch=3, workers=0)
    assert a["PSNR_Y"] > 20.0 and a["PSNR_Y"] > b["PSNR_Y"] + 2.0, (a, b)
    assert a["SSIM_Y"] > b["SSIM_Y"]


def test_val_refuses_a_file_instead_of_a_folder(sr_model, hr_folder):
    from libreyolo.errors import DatasetError

    with pytest.raises(DatasetError, match="folder of high-resolution images"):
        sr_model.val(data=str(next(hr_folder.glob("*.png"))), workers=0)


def test_cli_val_prints_the_metrics(sr_model, hr_folder, tmp_path, capsys):
    import json

    from libreyolo.cli import main

    path = sr_model.save(tmp_path / "LibreSwinIRs.pt")
    assert main(["val", f"model={path}", f"data={hr_folder}", "batch=3", "workers=0"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"PSNR_Y", "SSIM_Y", "PSNR_RGB", "SSIM_RGB"}


def test_the_kernels_design_example_line_switches_swinir_attention(sr_model, tmp_path):
    """``model = LibreYOLO("LibreSwinIRs.pt"); print(set_fused_attention(model))``: on the LibreYOLO
    object (and on model.net), the number of attention modules; enabled=False restores manual."""
    from libreyolo import set_fused_attention

    path = sr_model.save(tmp_path / "LibreSwinIRs.pt")
    model = LibreYOLO(path)
    blocks = [m for m in model.net.modules() if type(m).__name__ == "SwinIRAttention"]
    assert blocks and all(m.fused_attn is False for m in blocks)  # manual by default (rule 2: not byte-exact)
    assert set_fused_attention(model) == len(blocks)
    assert all(m.fused_attn is True for m in blocks)
    assert set_fused_attention(model.net, enabled=False) == len(blocks)
    assert all(m.fused_attn is False for m in blocks)
