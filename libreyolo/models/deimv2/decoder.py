"""DEIMv2's decoder: D-FINE's fine-grained distribution refinement with DEIM's lighter layers.

Against :mod:`libreyolo.models.dfine.decoder` (whose deformable attention, integral, LQE, gate,
weighting function and box decoding are reused as they are):

- the encoder memory goes to the query selection as it is (no ``enc_output`` projection);
- the query position embedding is computed once, from the selected boxes, and kept for every
  layer (D-FINE recomputes it per layer); its MLP has 3 layers of ``hidden`` width;
- a layer normalises with RMSNorm, its FFN is a SwiGLU (``swish_ffn``), and the gate (when the
  size has one; atto, femto and pico add and normalise instead) normalises with RMSNorm;
- the MLP heads and the LQE use SiLU; atto, femto and pico share one box head across layers;
- invalid anchors are a finite 1e4 (the reference's value), not +inf.

``forward`` is inference: only the last layer is scored, as the reference does in eval.
``forward_train`` is the training path (D-FINE's: selected plus contrastive denoising queries,
every layer scored, the pre-box head and the encoder selection; see
:mod:`libreyolo.models.detr_shared.denoising`); as in the reference, the first layer's boxes that later
layers' distances are measured from are detached.
"""
from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from libreyolo.models.detr_shared.anchors import AnchorCache, make_anchors
from libreyolo.models.detr_shared.denoising import GroundTruth, pack_train_outputs, prepend_denoising
from libreyolo.models.detr_shared.layers import MLP, MultiheadAttention, init_heads, inverse_sigmoid
from libreyolo.models.dfine.decoder import (
    LQE,
    Gate,
    Integral,
    MSDeformableAttention,
    distance2bbox,
    weighting_function,
)

Shapes = list[tuple[int, int]]
INVALID_ANCHOR = 1e4


class RMSNorm(nn.Module):
    """``x / rms(x) * scale`` over the last dimension, computed in float32."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.scale


class SwiGLUFFN(nn.Module):
    """One projection to both halves (``w12``), ``silu(a) * b``, then ``w3``."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w12 = nn.Linear(dim, 2 * hidden)
        self.w3 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.w12(x).chunk(2, dim=-1)
        return self.w3(F.silu(a) * b)


class DecoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int, ffn: int, points: tuple[int, ...], gateway: bool) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(dim, heads)
        self.norm1 = RMSNorm(dim)
        self.cross_attn = MSDeformableAttention(dim, heads, points)
        self.use_gateway = gateway
        if gateway:
            self.gateway = Gate(dim, RMSNorm(dim))
        else:
            self.norm2 = RMSNorm(dim)
        self.swish_ffn = SwiGLUFFN(dim, ffn // 2)
        self.norm3 = RMSNorm(dim)

    def forward(self, target: torch.Tensor, reference: torch.Tensor, value: torch.Tensor, shapes: Shapes,
                query_pos: torch.Tensor, attend: torch.Tensor | None = None) -> torch.Tensor:
        q = target + query_pos
        target = self.norm1(target + self.self_attn(q, q, target, attend))
        cross = self.cross_attn(target + query_pos, reference, value, shapes)
        target = self.gateway(target, cross) if self.use_gateway else self.norm2(target + cross)
        target = target + self.swish_ffn(target)
        return self.norm3(target.clamp(min=-65504, max=65504))


class TransformerDecoder(nn.Module):
    def __init__(self, layer_fn, num_layers: int, heads: int, reg_max: int, up: nn.Parameter,
                 reg_scale: nn.Parameter) -> None:
        super().__init__()
        self.heads, self.reg_max = heads, reg_max
        self.up, self.reg_scale = up, reg_scale  # the parent's parameters (two state-dict keys each)
        self.layers = nn.ModuleList(layer_fn() for _ in range(num_layers))
        self.lqe_layers = nn.ModuleList(LQE(4, 64, 2, reg_max, "silu") for _ in range(num_layers))

    def forward(self, target: torch.Tensor, ref_unact: torch.Tensor, memory: torch.Tensor, shapes: Shapes,
                heads: DEIMv2Transformer, attend: torch.Tensor | None = None, every_layer: bool = False
                ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """Per scored head the logits (B, Q, nc) and boxes (B, Q, 4) (inference: the last layer only;
        ``every_layer``: the pre-box head, then every layer), per scored layer the edge distributions'
        logits, the initial boxes (B, Q, 4) and the bin values (reg_max + 1,)."""
        value = memory.reshape(memory.shape[0], memory.shape[1], self.heads, -1)
        project = weighting_function(self.reg_max, self.up, self.reg_scale)
        ref = torch.sigmoid(ref_unact)
        query_pos = heads.query_pos_head(ref).clamp(min=-10, max=10)
        last = len(self.layers) - 1
        logits, boxes, all_corners = [], [], []
        target_prev = corners_prev = initial = None
        for i, layer in enumerate(self.layers):
            target = layer(target, ref.unsqueeze(2), value, shapes, query_pos, attend)
            if i == 0:
                pre = torch.sigmoid(heads.pre_bbox_head(target) + inverse_sigmoid(ref))
                initial = pre.detach()
                corners = heads.dec_bbox_head[0](target)
                if every_layer:
                    logits.append(heads.dec_score_head[0](target))
                    boxes.append(pre)
            else:
                corners = heads.dec_bbox_head[i](target + target_prev) + corners_prev
            layer_boxes = distance2bbox(initial, heads.integral(corners, project), self.reg_scale)
            if every_layer or i == last:
                logits.append(self.lqe_layers[i](heads.dec_score_head[i](target), corners))
                boxes.append(layer_boxes)
                all_corners.append(corners)
            target_prev, corners_prev, ref = target.detach(), corners, layer_boxes.detach()
        if initial is None:
            raise ValueError("the decoder has no layers")
        return logits, boxes, all_corners, initial, project


class DEIMv2Transformer(nn.Module):
    def __init__(self, nc: int, hidden: int, feat_channels: list[int], *, heads: int = 8, num_layers: int = 4,
                 ffn: int = 512, points: tuple[int, ...] = (3, 6, 3), num_queries: int = 300, reg_max: int = 32,
                 reg_scale: int | float = 4.0, strides: tuple[int, ...] = (8, 16, 32), eval_size: int = 640,
                 gateway: bool = True, share_bbox_head: bool = False) -> None:
        super().__init__()
        self.hidden, self.num_queries, self.reg_max, self.nc = hidden, num_queries, reg_max, nc
        self.num_denoising, self.label_noise, self.box_noise = 100, 0.5, 1.0
        self.up = nn.Parameter(torch.tensor([0.5]), requires_grad=False)
        # torch.tensor([4]) is int64: the dtype the reference's checkpoints hold for an int reg_scale
        self.reg_scale = nn.Parameter(torch.tensor([reg_scale]), requires_grad=False)
        self.input_proj = nn.ModuleList(
            nn.Identity() if c == hidden else nn.Sequential(OrderedDict([
                ("conv", nn.Conv2d(c, hidden, 1, bias=False)), ("norm", nn.BatchNorm2d(hidden))]))
            for c in feat_channels)
        self.decoder = TransformerDecoder(lambda: DecoderLayer(hidden, heads, ffn, points, gateway), num_layers,
                                          heads, reg_max, self.up, self.reg_scale)
        self.denoising_class_embed = nn.Embedding(nc + 1, hidden, padding_idx=nc)
        self.enc_score_head = nn.Linear(hidden, nc)
        self.enc_bbox_head = MLP(hidden, hidden, 4, 3, "silu")
        self.query_pos_head = MLP(4, hidden, hidden, 3, "silu")
        self.pre_bbox_head = MLP(hidden, hidden, 4, 3, "silu")
        self.integral = Integral(reg_max)
        self.dec_score_head = nn.ModuleList(nn.Linear(hidden, nc) for _ in range(num_layers))
        shared = MLP(hidden, hidden, 4 * (reg_max + 1), 3, "silu") if share_bbox_head else None
        self.dec_bbox_head = nn.ModuleList(shared if shared is not None else
                                           MLP(hidden, hidden, 4 * (reg_max + 1), 3, "silu")
                                           for _ in range(num_layers))
        anchors, valid = make_anchors([(eval_size // s, eval_size // s) for s in strides], invalid=INVALID_ANCHOR)
        self.register_buffer("anchors", anchors)
        self.register_buffer("valid_mask", valid)
        self._anchors = AnchorCache()
        init_heads(self)

    def _memory(self, feats: list[torch.Tensor]) -> tuple[torch.Tensor, Shapes, torch.Tensor, torch.Tensor]:
        """Projected levels flattened to memory (B, S, C), level shapes, anchors (1, S, 4), valid (1, S, 1)."""
        proj = [p(f) for p, f in zip(self.input_proj, feats, strict=True)]
        shapes = [(int(f.shape[2]), int(f.shape[3])) for f in proj]
        memory = torch.cat([f.flatten(2).permute(0, 2, 1) for f in proj], dim=1)
        if self.anchors.shape[1] == memory.shape[1] and self.anchors.device == memory.device:
            anchors, valid = self.anchors, self.valid_mask
        else:
            anchors, valid = self._anchors.anchors(shapes, memory.device, invalid=INVALID_ANCHOR)
        return memory, self._anchors.level_shapes(shapes, memory.device), anchors, valid

    def _select(self, memory: torch.Tensor, anchors: torch.Tensor, valid: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Query selection: (content (B, Q, C), reference boxes in logit space (B, Q, 4), the encoder
        logits (B, S, nc), the selected indices (B, Q))."""
        masked = valid.to(memory.dtype) * memory  # the selection sees border positions zeroed, the layers do not
        enc_logits = self.enc_score_head(masked)
        # fewer positions than queries (tiny inputs): take them all rather than fail
        topk = torch.topk(enc_logits.max(-1).values, min(self.num_queries, memory.shape[1]), dim=-1).indices
        target = masked.gather(1, topk.unsqueeze(-1).expand(-1, -1, self.hidden))
        anchors = anchors.to(memory.dtype).expand(memory.shape[0], -1, -1)
        ref_unact = self.enc_bbox_head(target) + anchors.gather(1, topk.unsqueeze(-1).expand(-1, -1, 4))
        return target, ref_unact, enc_logits, topk

    def forward(self, feats: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        memory, shapes, anchors, valid = self._memory(feats)
        target, ref_unact, _, _ = self._select(memory, anchors, valid)
        logits, boxes, _, _, _ = self.decoder(target, ref_unact, memory, shapes, self)
        return {"pred_logits": logits[-1], "pred_boxes": boxes[-1]}

    def forward_train(self, feats: list[torch.Tensor], gt: GroundTruth, image_size: tuple[int, int]) -> dict:
        """Training outputs for the encoder levels ``feats`` and per-image ground truth ``gt``
        (labels, (cx, cy, w, h) boxes in [0, 1]), laid out as D-FINE's
        (:func:`~libreyolo.models.detr_shared.denoising.pack_train_outputs` plus the edge distributions)."""
        memory, shapes, anchors, valid = self._memory(feats)
        selected, ref_unact, enc_logits, topk = self._select(memory, anchors, valid)
        enc_topk_logits = enc_logits.gather(1, topk.unsqueeze(-1).expand(-1, -1, enc_logits.shape[-1]))
        enc_topk_boxes = torch.sigmoid(ref_unact)
        # the decoder starts from the selection, but its gradient does not flow back into it
        target, ref_unact = selected.detach(), ref_unact.detach()
        target, ref_unact, dn, attend = prepend_denoising(self, target, ref_unact, gt, topk.shape[1])
        logits, boxes, corners, initial, project = self.decoder(target, ref_unact, memory, shapes, self, attend,
                                                                every_layer=True)
        out = pack_train_outputs(logits, boxes, enc_topk_logits, enc_topk_boxes, dn, image_size)
        n = 0 if dn is None else dn.num
        all_corners = torch.stack(corners)
        out.update(pred_corners=all_corners[:, :, n:], dn_corners=all_corners[:, :, :n], ref_initial=initial[:, n:],
                   dn_ref_initial=initial[:, :n], corner_bins=project, reg_scale=self.reg_scale)
        return out
