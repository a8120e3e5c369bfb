"""SwinIR (Liang et al., ICCVW 2021): 4x image super-resolution with residual Swin Transformer
blocks, key-for-key compatible with the checkpoints written by the reference LibreYOLO library 1.6.0.

The network, in order:

- the input (B, 3, H, W), RGB in [0, 1], is padded at the bottom and right to a multiple of the
  window (reflect, or replicate where the pad would be as large as the side), and the fixed RGB
  mean (0.4488, 0.4371, 0.4040) is subtracted (``img_range`` is 1, so no rescaling);
- a 3x3 convolution makes ``embed_dim`` features (``conv_first``);
- the body: the feature map as one token per pixel, LayerNorm (``patch_embed.norm``), then residual
  Swin Transformer blocks (RSTB, ``layers.i``): each a group of Swin blocks (window attention with
  a learned relative position bias; every second block rolls its windows by half a window and masks
  tokens the roll brought together) followed by a convolution on the map, plus the group's input;
  a closing LayerNorm (``norm``) and a convolution (``conv_after_body``), plus the body's input;
- the upsampler: size ``s`` (the lightweight model) one 3x3 convolution to 3 * 4 * 4 channels and a
  pixel shuffle; sizes ``m`` and ``l`` (the real-world models) a convolution to 64 features, two
  nearest-neighbour 2x upsamplings each followed by a convolution, and two more convolutions;
- the mean is added back and the output cropped to (B, 3, 4H, 4W). Values are not clamped.

The shift masks depend on the (padded) input size. The reference stores the mask for its build size
(64 x 64, ``blocks.<odd>.attn_mask``) in the state dict and uses it at that size; at any other size it
computes the mask. We do the same (the stored buffer is what a checkpoint holds), caching computed
masks per size, device and dtype. ``relative_position_index`` is a state-dict buffer here (unlike
our Swin classifiers), because the reference checkpoints carry it.

``fused_attn`` on every :class:`SwinIRAttention` (default False: the primitive
matmul-softmax-matmul the reference computes; :func:`libreyolo.kernels.attention.set_fused_attention`
flips it model-wide).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from libreyolo.layers.mlp import Mlp
from libreyolo.models.swin.network import WindowAttention, shifted_window_mask, window_merge, window_partition
from libreyolo.ops.pad import reflect_pad_to, round_up

__all__ = ["SIZES", "SwinIR", "SwinIRConfig"]

WINDOW = 8
BUILD_SIZE = 64      # the reference builds every size for 64 x 64 inputs (the stored shift masks)
MLP_RATIO = 2.0
SCALE = 4
HIDDEN = 64          # features of the nearest+conv upsampler
RGB_MEAN = (0.4488, 0.4371, 0.4040)


@dataclass(frozen=True)
class SwinIRConfig:
    embed_dim: int
    depths: tuple[int, ...]
    num_heads: tuple[int, ...]
    upsampler: str        # "pixelshuffledirect" or "nearest+conv"
    resi_connection: str  # "1conv" or "3conv"


SIZES: dict[str, SwinIRConfig] = {
    "s": SwinIRConfig(60, (6,) * 4, (6,) * 4, "pixelshuffledirect", "1conv"),
    "m": SwinIRConfig(180, (6,) * 6, (6,) * 6, "nearest+conv", "1conv"),
    "l": SwinIRConfig(240, (6,) * 9, (8,) * 9, "nearest+conv", "3conv"),
}


def residual_conv(dim: int, kind: str) -> nn.Module:
    """The convolution closing a residual group: one 3x3, or a 3x3 -> 1x1 -> 3x3 bottleneck at dim / 4."""
    if kind == "1conv":
        return nn.Conv2d(dim, dim, 3, 1, 1)
    if kind == "3conv":
        q = dim // 4
        return nn.Sequential(nn.Conv2d(dim, q, 3, 1, 1), nn.LeakyReLU(0.2, inplace=True), nn.Conv2d(q, q, 1, 1, 0),
                             nn.LeakyReLU(0.2, inplace=True), nn.Conv2d(q, dim, 3, 1, 1))
    raise ValueError(f"unknown residual connection {kind!r}; one of '1conv', '3conv'")


def pad_to_window(x: torch.Tensor, window: int = WINDOW) -> torch.Tensor:
    """(B, C, H, W) padded at the bottom and right to multiples of ``window`` (:func:`reflect_pad_to`)."""
    return reflect_pad_to(x, round_up(int(x.shape[-2]), window), round_up(int(x.shape[-1]), window))


def _tracing(like: torch.Tensor) -> bool:
    """Whether sizes are being traced or exported (jit tracer, dynamo, fake tensors): no cached masks then."""
    return torch.jit.is_tracing() or torch.compiler.is_compiling() or type(like) is not torch.Tensor


class SwinIRAttention(WindowAttention):
    """Swin's window attention (:class:`libreyolo.models.swin.network.WindowAttention`), with the
    relative position index kept in the state dict, as SwinIR checkpoints hold it."""

    def __init__(self, dim: int, num_heads: int, window: int) -> None:
        super().__init__(dim, num_heads, window)
        self._non_persistent_buffers_set.discard("relative_position_index")


class SwinIRBlock(nn.Module):
    """Pre-norm (shifted) window attention and MLP on (B, H*W, C) tokens, each with a residual."""

    def __init__(self, dim: int, num_heads: int, shift: int) -> None:
        super().__init__()
        self.shift = shift
        self.norm1 = nn.LayerNorm(dim)
        self.attn = SwinIRAttention(dim, num_heads, WINDOW)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * MLP_RATIO))
        if shift:  # the reference's state dict holds the mask of its build size
            self.register_buffer("attn_mask", shifted_window_mask(BUILD_SIZE, BUILD_SIZE, WINDOW, shift))
        else:
            self.attn_mask = None
        self._masks: dict[tuple, torch.Tensor] = {}

    def _mask(self, h: int, w: int, like: torch.Tensor) -> torch.Tensor | None:
        if not self.shift:
            return None
        if _tracing(like):  # traced sizes (ONNX with dynamic height/width): the mask is part of the graph
            return shifted_window_mask(h, w, WINDOW, self.shift, like.device).to(like.dtype)
        if (h, w) == (BUILD_SIZE, BUILD_SIZE):
            return self.attn_mask
        key = (h, w, like.device, like.dtype)
        mask = self._masks.get(key)
        if mask is None:  # built once per size on the device, so a CUDA graph replay copies nothing
            mask = self._masks[key] = shifted_window_mask(h, w, WINDOW, self.shift, like.device).to(like.dtype)
        return mask

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        h, w = hw
        b, _, c = x.shape
        y = self.norm1(x).reshape(b, h, w, c)
        if self.shift:
            y = torch.roll(y, shifts=(-self.shift, -self.shift), dims=(1, 2))
        y = window_merge(self.attn(window_partition(y, WINDOW), self._mask(h, w, x)), WINDOW, h, w)
        if self.shift:
            y = torch.roll(y, shifts=(self.shift, self.shift), dims=(1, 2))
        x = x + y.reshape(b, h * w, c)
        return x + self.mlp(self.norm2(x))


class SwinIRGroup(nn.Module):
    """The blocks of one residual group (``residual_group.blocks``)."""

    def __init__(self, dim: int, depth: int, num_heads: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(SwinIRBlock(dim, num_heads, 0 if i % 2 == 0 else WINDOW // 2) for i in range(depth))

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, hw)
        return x


class RSTB(nn.Module):
    """Residual Swin Transformer block: a group of Swin blocks, a convolution on the map, the input added."""

    def __init__(self, dim: int, depth: int, num_heads: int, resi_connection: str) -> None:
        super().__init__()
        self.residual_group = SwinIRGroup(dim, depth, num_heads)
        self.conv = residual_conv(dim, resi_connection)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        y = self.residual_group(x, hw)
        y = self.conv(y.transpose(1, 2).reshape(x.shape[0], x.shape[2], *hw))
        return y.flatten(2).transpose(1, 2) + x


class TokenNorm(nn.Module):
    """The LayerNorm of the token embedding (``patch_embed.norm``; the patch size is 1, so no projection)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.flatten(2).transpose(1, 2))


class SwinIR(nn.Module):
    """SwinIR 4x super-resolution of size ``s``, ``m`` or ``l``: (B, 3, H, W) in [0, 1] -> (B, 3, 4H, 4W)."""

    def __init__(self, size: str = "s") -> None:
        super().__init__()
        if size not in SIZES:
            raise ValueError(f"unknown SwinIR size {size!r}; one of {', '.join(SIZES)}")
        cfg = self.config = SIZES[size]
        dim = cfg.embed_dim
        self.scale = SCALE
        self.window = WINDOW
        self.register_buffer("mean", torch.tensor(RGB_MEAN).view(1, 3, 1, 1), persistent=False)
        self.conv_first = nn.Conv2d(3, dim, 3, 1, 1)
        self.patch_embed = TokenNorm(dim)
        self.layers = nn.ModuleList(RSTB(dim, d, h, cfg.resi_connection)
                                    for d, h in zip(cfg.depths, cfg.num_heads, strict=True))
        self.norm = nn.LayerNorm(dim)
        self.conv_after_body = residual_conv(dim, cfg.resi_connection)
        if cfg.upsampler == "pixelshuffledirect":
            self.upsample = nn.Sequential(nn.Conv2d(dim, 3 * SCALE * SCALE, 3, 1, 1), nn.PixelShuffle(SCALE))
        else:
            self.conv_before_upsample = nn.Sequential(nn.Conv2d(dim, HIDDEN, 3, 1, 1), nn.LeakyReLU(inplace=True))
            self.conv_up1 = nn.Conv2d(HIDDEN, HIDDEN, 3, 1, 1)
            self.conv_up2 = nn.Conv2d(HIDDEN, HIDDEN, 3, 1, 1)
            self.conv_hr = nn.Conv2d(HIDDEN, HIDDEN, 3, 1, 1)
            self.conv_last = nn.Conv2d(HIDDEN, 3, 3, 1, 1)
            self.lrelu = nn.LeakyReLU(0.2, inplace=True)
        self.apply(_init_weights)

    def body(self, x: torch.Tensor) -> torch.Tensor:
        hw = (x.shape[2], x.shape[3])  # ints in eager; traced sizes under the ONNX tracer (dynamic H/W)
        t = self.patch_embed(x)
        for layer in self.layers:
            t = layer(t, hw)
        t = self.norm(t)
        return t.transpose(1, 2).reshape(x.shape[0], x.shape[1], *hw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        mean = self.mean.to(x.dtype)
        x = pad_to_window(x, self.window) - mean
        x = self.conv_first(x)
        x = self.conv_after_body(self.body(x)) + x
        if self.config.upsampler == "pixelshuffledirect":
            x = self.upsample(x)
        else:
            x = self.conv_before_upsample(x)
            x = self.lrelu(self.conv_up1(F.interpolate(x, scale_factor=2, mode="nearest")))
            x = self.lrelu(self.conv_up2(F.interpolate(x, scale_factor=2, mode="nearest")))
            x = self.conv_last(self.lrelu(self.conv_hr(x)))
        x = x + mean
        if x.shape[-2] != h * self.scale or x.shape[-1] != w * self.scale:  # padded to the window: crop
            x = x[:, :, :h * self.scale, :w * self.scale]
        return x  # (a no-op crop would be a copy in ExecuTorch, where XNNPACK's output is channels-last)


def _init_weights(m: nn.Module) -> None:
    # the published initialisation (training from scratch is out of scope; this keeps untrained builds sane)
    if isinstance(m, nn.Linear):
        nn.init.trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LayerNorm):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)
    elif isinstance(m, SwinIRAttention):
        nn.init.trunc_normal_(m.relative_position_bias_table, std=0.02)
