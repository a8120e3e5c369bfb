"""Small modules of the DETR line: conv units, attention, MLP heads, position embeddings.

Numerics follow the reference networks operation for operation (the order of additions and
scalings included), so float32 outputs agree to rounding noise, not just to a tolerance.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from libreyolo.kernels.attention import attention

_ACTS = {None: nn.Identity, "relu": nn.ReLU, "silu": nn.SiLU, "gelu": nn.GELU}


def activation(name: str | None) -> nn.Module:
    try:
        act = _ACTS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; expected one of {sorted(k for k in _ACTS if k)}") from None
    return act(inplace=True) if name in ("relu", "silu") else act()


# the activations of the DETR heads and decoder feed-forward layers, applied out of place
_FUNCTIONAL_ACTS = {"relu": F.relu, "silu": F.silu, "gelu": F.gelu}


def functional_activation(name: str):
    try:
        return _FUNCTIONAL_ACTS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; expected one of {sorted(_FUNCTIONAL_ACTS)}") from None


class FrozenBatchNorm2d(nn.Module):
    """BatchNorm with fixed statistics and affine terms, all stored as buffers (no num_batches_tracked)."""

    def __init__(self, channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", torch.ones(channels))
        self.register_buffer("bias", torch.zeros(channels))
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.weight.reshape(1, -1, 1, 1) * (self.running_var.reshape(1, -1, 1, 1) + self.eps).rsqrt()
        shift = self.bias.reshape(1, -1, 1, 1) - self.running_mean.reshape(1, -1, 1, 1) * scale
        return x * scale + shift


def batch_norm(channels: int, frozen: bool = False) -> nn.Module:
    return FrozenBatchNorm2d(channels) if frozen else nn.BatchNorm2d(channels)


class ConvNormLayer(nn.Module):
    """``conv`` -> ``norm`` -> ``act`` with 'same' padding for odd kernels."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1, *, groups: int = 1,
                 padding: int | None = None, bias: bool = False, act: str | None = None,
                 frozen_norm: bool = False) -> None:
        super().__init__()
        pad = (kernel - 1) // 2 if padding is None else padding
        self.conv = nn.Conv2d(c_in, c_out, kernel, stride, pad, groups=groups, bias=bias)
        self.norm = batch_norm(c_out, frozen_norm)
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.norm(self.conv(x)))


class RepVggBlock(nn.Module):
    """3x3 and 1x1 conv branches summed, then the activation (unfused, as checkpoints store it)."""

    def __init__(self, c_in: int, c_out: int, act: str = "silu") -> None:
        super().__init__()
        self.conv1 = ConvNormLayer(c_in, c_out, 3, 1, padding=1)
        self.conv2 = ConvNormLayer(c_in, c_out, 1, 1, padding=0)
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv1(x) + self.conv2(x))


class MLP(nn.Module):
    """``num_layers`` linear layers with an activation (ReLU unless ``act`` says otherwise:
    ``"silu"``, ``"gelu"``) between them, not after the last."""

    def __init__(self, c_in: int, hidden: int, c_out: int, num_layers: int, act: str = "relu") -> None:
        super().__init__()
        self.act = functional_activation(act)  # refuses an unknown name
        dims = [c_in] + [hidden] * (num_layers - 1)
        outs = [hidden] * (num_layers - 1) + [c_out]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, outs, strict=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == last else self.act(layer(x))
        return x


class MultiheadAttention(nn.Module):
    """Batch-first multi-head attention with ``nn.MultiheadAttention``'s parameter layout.

    The product goes through :func:`libreyolo.kernels.attention.attention`, so exports always
    carry primitive matmul/softmax ops. ``fused_attn`` (default False: the fused kernel is not
    byte-exact against this path) lets :func:`~libreyolo.kernels.set_fused_attention` opt in.
    The query is scaled before the product, as the reference does, to keep its rounding.
    """

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"attention width {dim} is not divisible by {heads} heads")
        self.dim, self.heads = dim, heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * dim))
        self.out_proj = nn.Linear(dim, dim)
        self.fused_attn = False
        nn.init.xavier_uniform_(self.in_proj_weight)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        b, lq, _ = query.shape
        lk = key.shape[1]
        w_q, w_k, w_v = self.in_proj_weight.chunk(3)
        b_q, b_k, b_v = self.in_proj_bias.chunk(3)
        head = self.dim // self.heads
        q = F.linear(query, w_q, b_q).view(b, lq, self.heads, head).transpose(1, 2)
        k = F.linear(key, w_k, b_k).view(b, lk, self.heads, head).transpose(1, 2)
        v = F.linear(value, w_v, b_v).view(b, lk, self.heads, head).transpose(1, 2)
        q = q * math.sqrt(1.0 / head)
        out = attention(q, k, v, mask=mask, scale=1.0, fused=self.fused_attn)
        return self.out_proj(out.transpose(1, 2).reshape(b, lq, self.dim))


class TransformerEncoderLayer(nn.Module):
    """Post-norm encoder layer: self-attention with the position added to queries and keys, then FFN."""

    def __init__(self, dim: int, heads: int, ffn: int, act: str = "gelu") -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(dim, heads)
        self.linear1 = nn.Linear(dim, ffn)
        self.linear2 = nn.Linear(ffn, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.activation = activation(act)

    def forward(self, src: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        q = src + pos
        src = self.norm1(src + self.self_attn(q, q, src))
        return self.norm2(src + self.linear2(self.activation(self.linear1(src))))


class TransformerEncoder(nn.Module):
    def __init__(self, layer_fn, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layer_fn() for _ in range(num_layers))

    def forward(self, src: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            src = layer(src, pos)
        return src


def sincos_position_embedding(width: int, height: int, dim: int, temperature: float = 10000.0, *,
                              device: torch.device | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(1, W*H, dim) fixed 2-D sine-cosine embedding, laid out as the reference lays it out.

    The first grid axis runs over ``width`` (meshgrid 'ij' of width then height); on square maps
    this is the usual row-major order, and it is what trained checkpoints expect.
    """
    if dim % 4:
        raise ValueError(f"the 2-D sine-cosine embedding needs a width divisible by 4, got {dim}")
    grid_w = torch.arange(width, dtype=torch.float32, device=device)
    grid_h = torch.arange(height, dtype=torch.float32, device=device)
    grid_w, grid_h = torch.meshgrid(grid_w, grid_h, indexing="ij")
    quarter = dim // 4
    omega = torch.arange(quarter, dtype=torch.float32, device=device) / quarter
    omega = 1.0 / (temperature ** omega)
    out_w = grid_w.flatten()[:, None] * omega[None]
    out_h = grid_h.flatten()[:, None] * omega[None]
    emb = torch.cat([out_w.sin(), out_w.cos(), out_h.sin(), out_h.cos()], dim=1)[None]
    return emb.to(dtype)


def inverse_sigmoid(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    x = x.clamp(min=0.0, max=1.0)
    return torch.log(x.clamp(min=eps) / (1 - x).clamp(min=eps))


def init_heads(decoder: nn.Module, prior: float = 0.01) -> None:
    """Detector initialisation of an untrained decoder: class logits start at the ``prior``
    probability and box heads' last layers at zero (boxes start at their references), so an
    untrained model scores ~1e-2 everywhere instead of 0.5. Checkpoints overwrite all of it."""
    bias = -math.log((1 - prior) / prior)
    with torch.no_grad():
        for name in ("enc_score_head", "dec_score_head"):
            heads = getattr(decoder, name, None)
            for head in ([heads] if isinstance(heads, nn.Linear) else list(heads or [])):
                head.bias.fill_(bias)
        for name in ("enc_bbox_head", "dec_bbox_head", "pre_bbox_head"):
            heads = getattr(decoder, name, None)
            for head in ([heads] if isinstance(heads, MLP) else list(heads or [])):
                head.layers[-1].weight.zero_()
                head.layers[-1].bias.zero_()
