"""The hybrid encoder of RT-DETR and D-FINE: intra-scale attention, then cross-scale fusion.

Attention runs on the coarsest selected levels only (``use_encoder_idx``); a top-down FPN pass
and a bottom-up PAN pass then fuse all levels. The families differ only in the blocks they
plug in (projection, fusion and downsampling modules), which they build and hand over, and in
how two levels meet before a fusion block (``fuse``): concatenated (RT-DETR, D-FINE) or summed
(DEIMv2).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from libreyolo.models.detr_shared.anchors import ShapeCache
from libreyolo.models.detr_shared.layers import TransformerEncoder, sincos_position_embedding


class HybridEncoder(nn.Module):
    def __init__(self, *, input_proj: nn.ModuleList, encoder: nn.ModuleList, use_encoder_idx: Sequence[int],
                 hidden_dim: int, lateral_convs: nn.ModuleList, fpn_blocks: nn.ModuleList,
                 downsample_convs: nn.ModuleList, pan_blocks: nn.ModuleList, pe_temperature: float = 10000.0,
                 fuse: str = "cat") -> None:
        super().__init__()
        if fuse not in ("cat", "sum"):
            raise ValueError(f"fuse must be 'cat' or 'sum', got {fuse!r}")
        self.fuse = fuse
        if len(encoder) != len(use_encoder_idx) or not all(isinstance(e, TransformerEncoder) for e in encoder):
            raise ValueError("one TransformerEncoder per entry of use_encoder_idx is needed")
        self.input_proj = input_proj
        self.encoder = encoder
        self.lateral_convs = lateral_convs
        self.fpn_blocks = fpn_blocks
        self.downsample_convs = downsample_convs
        self.pan_blocks = pan_blocks
        self.use_encoder_idx = tuple(use_encoder_idx)
        self.hidden_dim = hidden_dim
        self.pe_temperature = pe_temperature
        self._pos_cache = ShapeCache()

    def position_embedding(self, width: int, height: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        key = (width, height, str(device), dtype)
        return self._pos_cache.get(key, lambda: sincos_position_embedding(
            width, height, self.hidden_dim, self.pe_temperature, device=device, dtype=dtype))

    def forward(self, feats: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        proj = [p(f) for p, f in zip(self.input_proj, feats, strict=True)]
        for enc, idx in zip(self.encoder, self.use_encoder_idx, strict=True):
            h, w = int(proj[idx].shape[2]), int(proj[idx].shape[3])
            src = proj[idx].flatten(2).permute(0, 2, 1)
            memory = enc(src, self.position_embedding(w, h, src.device, src.dtype))
            proj[idx] = memory.permute(0, 2, 1).reshape(-1, self.hidden_dim, h, w).contiguous()

        n = len(proj)
        inner = [proj[-1]]
        for idx in range(n - 1, 0, -1):
            high = self.lateral_convs[n - 1 - idx](inner[0])
            inner[0] = high
            up = F.interpolate(high, scale_factor=2.0, mode="nearest")
            inner.insert(0, self.fpn_blocks[n - 1 - idx](self._join(up, proj[idx - 1])))
        outs = [inner[0]]
        for idx in range(n - 1):
            down = self.downsample_convs[idx](outs[-1])
            outs.append(self.pan_blocks[idx](self._join(down, inner[idx + 1])))
        return outs

    def _join(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b if self.fuse == "sum" else torch.cat([a, b], dim=1)
