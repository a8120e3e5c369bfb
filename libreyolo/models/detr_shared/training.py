"""The training seam of the DETR families: a capturable encoder part and an eager decoder part.

``train_encode`` (backbone + hybrid encoder) depends on the images only and has fixed shapes, so
a training CUDA graph can capture its forward and backward. ``train_decode`` (query selection,
denoising queries built from the batch's targets, all decoder layers) has a query count that
depends on the targets and runs eagerly. Both families' networks have ``backbone``, ``encoder``
and ``decoder`` (with ``forward_train``) submodules.
"""
from __future__ import annotations

import torch
from torch import nn

from libreyolo.models.detr_shared.denoising import split_targets

LAST_STRIDE = 32  # both families' coarsest level: input size = its size * 32


class _Seam(torch.autograd.Function):
    """Identity in front of the decoder whose backward hands the encoder the decoder's gradient of a
    level as one tensor laid out like the level itself, which is what a trainer gets when it runs the
    encoder apart (a CUDA graph) and feeds back a detached leaf's ``.grad``. With it, a direct
    backward and such a split one compute the encoder's gradients with the same bits (the decoder's
    gradient otherwise arrives in a permuted layout, and the encoder's convolutions reduce it in
    another order)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.layout = x.stride()
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        if grad.stride() == ctx.layout:
            return grad
        return torch.empty_strided(grad.shape, ctx.layout, dtype=grad.dtype, device=grad.device).copy_(grad)


def train_encode(net: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Images (B, 3, S, S) -> the hybrid encoder's levels, each (B, C, S / stride, S / stride)."""
    return tuple(net.encoder(net.backbone(images)))


def train_decode(net: nn.Module, features: tuple[torch.Tensor, ...], targets: torch.Tensor) -> dict:
    """Encoder levels and targets (M, 6) ``(image, class, x1, y1, x2, y2)`` in input pixels -> the
    decoder's training outputs (the dict :class:`libreyolo.train.loss.detr.DetrLoss` reads). The
    input size is read off the coarsest level (stride 32)."""
    features = tuple(_Seam.apply(f) for f in features)
    last = features[-1]
    image_size = (int(last.shape[2]) * LAST_STRIDE, int(last.shape[3]) * LAST_STRIDE)
    gt = split_targets(targets.to(last.device), int(last.shape[0]), image_size)
    return net.decoder.forward_train(list(features), gt, image_size)


def lw_train_encode(net: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The LW-DETR line: images -> the ViT's projected levels (``backbone.0``), fixed shapes."""
    return tuple(net.backbone[0](images))


def lw_train_decode(net: nn.Module, features: tuple[torch.Tensor, ...], targets: torch.Tensor) -> dict:
    """The LW-DETR line's Group-DETR decoder on the projected levels (``LWDETR.forward_train``); the
    targets are only the loss's (no denoising queries)."""
    return net.forward_train([_Seam.apply(f) for f in features])
