"""DEIMv2 (atto, femto, pico, n, s, m, l, x): DEIM's decoder on two backbone lines.

- atto, femto, pico: a three-stage HGNetv2 (one stride-16 level) and the lite encoder, two
  decoder levels (strides 16, 32); n: HGNetv2-B0 (strides 16, 32) and the hybrid encoder.
  Inputs are images in [0, 1].
- s, m: a plain ViT (tiny, tiny+) with RoPE; l, x: a DINOv3 ViT-S/16 (+); each with the spatial
  tuning adapter, three levels (strides 8, 16, 32) and the hybrid encoder. The reference feeds
  these ImageNet-normalised images; here the normalisation is the network's first operation
  (:meth:`DEIMv2.normalize`, the reference's float32 constants and operations), so that every
  size, and every artifact, takes images in [0, 1] like the other DETR families.
  :meth:`DEIMv2.forward_normalized` is the reference module's function.

Module names and shapes follow the reference checkpoints (schema 1.0); sizes differ only in
the table ``SIZES``. Outputs: ``pred_logits`` (B, Q, nc) and ``pred_boxes`` (B, Q, 4) as
(cx, cy, w, h) normalised to the input.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from libreyolo.models.deimv2.backbone import ViTAdapter
from libreyolo.models.deimv2.decoder import DEIMv2Transformer
from libreyolo.models.deimv2.encoder import LiteEncoder, build_hybrid_encoder
from libreyolo.models.dfine.backbone import HGNetv2

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class DEIMv2Size:
    imgsz: int
    backbone: str                 # HGNetv2 arch, or a ViT name of backbone.VITS
    hidden: int                   # encoder and decoder width
    expansion: float
    depth_mult: float
    dec_layers: int
    dec_ffn: int
    points: tuple[int, ...]
    num_queries: int = 300
    return_idx: tuple[int, ...] = ()   # HGNetv2 stages taken
    take: tuple[int, ...] = ()         # ViT blocks taken
    sta_channels: int = 16             # ViT sizes: the spatial prior's base width
    enc_ffn: int = 0                   # hybrid encoder FFN width (0: the lite encoder)
    gateway: bool = True
    share_bbox_head: bool = False
    # the reference's table gives n..x an int 4, which makes ``decoder.reg_scale`` an int64 parameter in
    # their checkpoints; atto, femto and pico take the decoder's float default
    reg_scale: int | float = 4

    @property
    def vit(self) -> bool:
        return not self.return_idx

    @property
    def strides(self) -> tuple[int, ...]:
        return (8, 16, 32) if self.vit else (16, 32)


# from the reference's size table (libreyolo 1.6.0, models/deimv2/nn.py SIZE_CONFIGS)
SIZES: dict[str, DEIMv2Size] = {
    "atto": DEIMv2Size(320, "Atto", 64, 0.34, 0.5, 3, 160, (4, 2), 100, return_idx=(2,), gateway=False,
                       share_bbox_head=True, reg_scale=4.0),
    "femto": DEIMv2Size(416, "Femto", 96, 0.34, 0.5, 3, 256, (4, 2), 150, return_idx=(2,), gateway=False,
                        share_bbox_head=True, reg_scale=4.0),
    "pico": DEIMv2Size(640, "Pico", 112, 0.34, 0.5, 3, 320, (4, 2), 200, return_idx=(2,), gateway=False,
                       share_bbox_head=True, reg_scale=4.0),
    "n": DEIMv2Size(640, "B0", 128, 0.34, 0.5, 3, 512, (6, 6), return_idx=(2, 3), enc_ffn=512),
    "s": DEIMv2Size(640, "vit_tiny", 192, 0.34, 0.67, 4, 512, (3, 6, 3), take=(3, 7, 11), enc_ffn=512),
    "m": DEIMv2Size(640, "vit_tinyplus", 256, 0.67, 1.0, 4, 512, (3, 6, 3), take=(3, 7, 11), enc_ffn=512),
    "l": DEIMv2Size(640, "dinov3_vits16", 224, 1.0, 1.0, 4, 1792, (3, 6, 3), take=(5, 8, 11), sta_channels=32,
                    enc_ffn=896),
    "x": DEIMv2Size(640, "dinov3_vits16plus", 256, 1.25, 1.37, 6, 2048, (3, 6, 3), take=(5, 8, 11),
                    sta_channels=64, enc_ffn=1024),
}


class DEIMv2(nn.Module):
    def __init__(self, size: str, nc: int = 80) -> None:
        super().__init__()
        if size not in SIZES:
            raise ValueError(f"unknown deimv2 size {size!r}; known sizes: {', '.join(SIZES)}")
        cfg = SIZES[size]
        self.size, self.nc, self.imagenet_norm = size, nc, cfg.vit
        if cfg.vit:
            # the ViT's own width for s and m; l and x project the DINOv3 features to ``hidden``
            dino = cfg.backbone.startswith("dinov3")
            self.backbone = ViTAdapter(cfg.backbone, cfg.take, cfg.sta_channels, cfg.hidden if dino else None)
        else:
            self.backbone = HGNetv2(cfg.backbone, cfg.return_idx, lab=True, frozen_norm=False)
        chans = self.backbone.out_channels
        if cfg.enc_ffn:
            # D-FINE's ELAN (with tail convs) for n, DEIM's ELAN5 for the ViT sizes
            self.encoder = build_hybrid_encoder(chans, cfg.hidden, cfg.enc_ffn, cfg.expansion, cfg.depth_mult,
                                                tail_conv=not cfg.vit)
        else:
            self.encoder = LiteEncoder(chans[0], cfg.hidden, cfg.expansion, cfg.depth_mult)
        self.decoder = DEIMv2Transformer(nc, cfg.hidden, [cfg.hidden] * len(cfg.strides),
                                         num_layers=cfg.dec_layers, ffn=cfg.dec_ffn, points=cfg.points,
                                         num_queries=cfg.num_queries, strides=cfg.strides, eval_size=cfg.imgsz,
                                         gateway=cfg.gateway, share_bbox_head=cfg.share_bbox_head,
                                         reg_scale=cfg.reg_scale)
        # not in the state dict: fixed constants of the preprocessing the ViT sizes were trained with
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """Images in [0, 1] -> the backbone's input: ImageNet-normalised for the ViT sizes."""
        if not self.imagenet_norm:
            return x
        return (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)

    def forward_normalized(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """The reference network's forward: ``x`` as its backbone takes it."""
        return self.decoder(self.encoder(self.backbone(x)))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.forward_normalized(self.normalize(x))
