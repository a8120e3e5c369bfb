"""RT-DETR's transformer decoder: query selection from the encoder memory, then deformable layers.

``forward`` is inference (the final layer's outputs only). ``forward_train`` is the training
path: the selected queries plus contrastive denoising queries built from the ground truth
(``denoising_class_embed``; see :mod:`libreyolo.models.detr_shared.denoising`), every layer's outputs
and the encoder's query-selection outputs. Every layer's cross-attention samples the memory through
the ``ms_deform_attn`` kernel slot (registry providers when eligible, portable ``grid_sample``
otherwise, and always portable while exporting).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from libreyolo.models.detr_shared.anchors import AnchorCache, make_anchors
from libreyolo.models.detr_shared.deformable import MSDeformableAttention
from libreyolo.models.detr_shared.denoising import GroundTruth, pack_train_outputs, prepend_denoising
from libreyolo.models.detr_shared.layers import MLP, MultiheadAttention, init_heads, inverse_sigmoid

Shapes = list[tuple[int, int]]


class EncoderOutput(NamedTuple):
    memory: torch.Tensor         # (B, S, C) the flattened encoder levels the decoder samples
    shapes: Shapes               # (height, width) of each level
    output_memory: torch.Tensor  # (B, S, C) every candidate's projected memory
    logits: torch.Tensor         # (B, S, nc) every candidate's class logits
    boxes_unact: torch.Tensor    # (B, S, 4) every candidate's box before the sigmoid


def select_queries(enc_logits: torch.Tensor, enc_boxes_unact: torch.Tensor, output_memory: torch.Tensor,
                   num_queries: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RT-DETR's query selection: the ``num_queries`` candidates of best class logit (fewer positions than
    queries, as for tiny inputs: all of them), as (indices (B, Q), their memory rows (B, Q, C), their
    unactivated boxes (B, Q, 4)). The one implementation: the eager model, training and the runtimes
    that run the selection on the host (NCNN, :mod:`libreyolo.models.rtdetr.split`) call it."""
    k = min(int(num_queries), enc_logits.shape[1])
    topk = torch.topk(enc_logits.max(-1).values, k, dim=1).indices
    ref_unact = enc_boxes_unact.gather(1, topk.unsqueeze(-1).expand(-1, -1, enc_boxes_unact.shape[-1]))
    target = output_memory.gather(1, topk.unsqueeze(-1).expand(-1, -1, output_memory.shape[-1]))
    return topk, target, ref_unact


class TransformerDecoderLayer(nn.Module):
    """``cross_attn``: the deformable attention's factory (default: :class:`MSDeformableAttention` with
    ``points`` per level; RT-DETRv2 passes its per-level layout)."""

    def __init__(self, dim: int, heads: int, ffn: int, levels: int, points: int,
                 cross_attn: Callable[[], nn.Module] | None = None) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(dim, heads)
        self.norm1 = nn.LayerNorm(dim)
        self.cross_attn = cross_attn() if cross_attn is not None else MSDeformableAttention(dim, heads, levels, points)
        self.norm2 = nn.LayerNorm(dim)
        self.linear1 = nn.Linear(dim, ffn)
        self.linear2 = nn.Linear(ffn, dim)
        self.norm3 = nn.LayerNorm(dim)

    def forward(self, target: torch.Tensor, reference: torch.Tensor, memory: torch.Tensor, shapes: Shapes,
                query_pos: torch.Tensor, attend: torch.Tensor | None = None) -> torch.Tensor:
        """``attend`` (Q, Q) bool self-attention mask, True = may attend (training with denoising)."""
        q = target + query_pos
        target = self.norm1(target + self.self_attn(q, q, target, attend))
        target = self.norm2(target + self.cross_attn(target + query_pos, reference, memory, shapes))
        return self.norm3(target + self.linear2(F.relu(self.linear1(target))))


class TransformerDecoder(nn.Module):
    def __init__(self, layer_fn, num_layers: int, eval_idx: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layer_fn() for _ in range(num_layers))
        self.eval_idx = eval_idx if eval_idx >= 0 else num_layers + eval_idx

    def forward(self, target: torch.Tensor, ref_unact: torch.Tensor, memory: torch.Tensor, shapes: Shapes,
                bbox_head: nn.ModuleList, score_head: nn.ModuleList,
                query_pos_head: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        ref = torch.sigmoid(ref_unact)
        for i, layer in enumerate(self.layers):
            target = layer(target, ref.unsqueeze(2), memory, shapes, query_pos_head(ref))
            boxes = torch.sigmoid(bbox_head[i](target) + inverse_sigmoid(ref))
            if i == self.eval_idx:
                return score_head[i](target), boxes
            ref = boxes
        raise AssertionError("eval_idx is past the last decoder layer")

    def forward_train(self, target: torch.Tensor, ref_unact: torch.Tensor, memory: torch.Tensor, shapes: Shapes,
                      bbox_head: nn.ModuleList, score_head: nn.ModuleList, query_pos_head: nn.Module,
                      attend: torch.Tensor | None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """All layers; per layer logits (B, Q, nc) and boxes (B, Q, 4). Each layer's reference is
        the previous layer's boxes detached; its supervised boxes refine the undetached ones."""
        ref = torch.sigmoid(ref_unact)
        logits, boxes = [], []
        prev = ref
        for i, layer in enumerate(self.layers):
            target = layer(target, ref.unsqueeze(2), memory, shapes, query_pos_head(ref), attend)
            delta = bbox_head[i](target)
            refined = torch.sigmoid(delta + inverse_sigmoid(ref))
            boxes.append(refined if i == 0 else torch.sigmoid(delta + inverse_sigmoid(prev)))
            logits.append(score_head[i](target))
            prev, ref = refined, refined.detach()
        return logits, boxes


class RTDETRTransformer(nn.Module):
    """RT-DETR's decoder. What RT-DETRv2 changes is passed in: ``cross_attn`` (a factory of each
    layer's deformable attention), ``named_enc_output`` (its encoder-output projection's submodules
    are ``proj``/``norm``, not ``0``/``1``) and ``eval_size`` (the anchors and valid mask of that input
    size stored as buffers, as its checkpoints carry them; other sizes use the per-shape cache)."""

    def __init__(self, nc: int, hidden: int, feat_channels: list[int], *, heads: int = 8, num_layers: int = 6,
                 ffn: int = 1024, points: int = 4, num_queries: int = 300, eval_idx: int = -1,
                 cross_attn: Callable[[], nn.Module] | None = None, named_enc_output: bool = False,
                 eval_size: int | None = None, strides: tuple[int, ...] = (8, 16, 32)) -> None:
        super().__init__()
        self.hidden, self.num_queries, self.nc = hidden, num_queries, nc
        # denoising (training only): queries per batch, label flip ratio, box noise scale
        self.num_denoising, self.label_noise, self.box_noise = 100, 0.5, 1.0
        levels = len(feat_channels)
        self.input_proj = nn.ModuleList(nn.Sequential(OrderedDict([
            ("conv", nn.Conv2d(c, hidden, 1, bias=False)), ("norm", nn.BatchNorm2d(hidden))])) for c in feat_channels)
        self.decoder = TransformerDecoder(lambda: TransformerDecoderLayer(hidden, heads, ffn, levels, points,
                                                                          cross_attn), num_layers, eval_idx)
        self.denoising_class_embed = nn.Embedding(nc + 1, hidden, padding_idx=nc)
        self.query_pos_head = MLP(4, 2 * hidden, hidden, 2)
        if named_enc_output:
            self.enc_output = nn.Sequential(OrderedDict([("proj", nn.Linear(hidden, hidden)),
                                                         ("norm", nn.LayerNorm(hidden))]))
        else:
            self.enc_output = nn.Sequential(nn.Linear(hidden, hidden), nn.LayerNorm(hidden))
        self.enc_score_head = nn.Linear(hidden, nc)
        self.enc_bbox_head = MLP(hidden, hidden, 4, 3)
        self.dec_score_head = nn.ModuleList(nn.Linear(hidden, nc) for _ in range(num_layers))
        self.dec_bbox_head = nn.ModuleList(MLP(hidden, hidden, 4, 3) for _ in range(num_layers))
        anchors = valid = None
        if eval_size is not None:
            anchors, valid = make_anchors([(eval_size // s, eval_size // s) for s in strides])
        self.register_buffer("anchors", anchors)  # None (v1): no buffer, not in the state dict
        self.register_buffer("valid_mask", valid)
        self._anchors = AnchorCache()
        init_heads(self)

    def _anchors_for(self, shapes: Shapes, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored anchors where they fit these level shapes, else the per-shape cache's."""
        if self.anchors is not None and self.anchors.shape[1] == memory.shape[1] \
                and self.anchors.device == memory.device:
            return self.anchors, self.valid_mask
        return self._anchors.anchors(shapes, memory.device)

    def encode(self, feats: list[torch.Tensor]) -> EncoderOutput:
        """The encoder side of the query selection: projected levels flattened to memory (B, S, C), the
        level shapes, and every candidate's projected memory, class logits and unactivated boxes."""
        proj = [p(f) for p, f in zip(self.input_proj, feats, strict=True)]
        shapes = [(int(f.shape[2]), int(f.shape[3])) for f in proj]
        memory = torch.cat([f.flatten(2).permute(0, 2, 1) for f in proj], dim=1)
        anchors, valid = self._anchors_for(shapes, memory)
        output_memory = self.enc_output(valid.to(memory.dtype) * memory)
        return EncoderOutput(memory, shapes, output_memory, self.enc_score_head(output_memory),
                             self.enc_bbox_head(output_memory) + anchors.to(memory.dtype))

    def decode(self, target: torch.Tensor, ref_unact: torch.Tensor, memory: torch.Tensor,
               shapes: Shapes) -> dict[str, torch.Tensor]:
        """The decoder from the selected queries (inference: the eval layer's outputs)."""
        logits, boxes = self.decoder(target, ref_unact, memory, self._anchors.level_shapes(shapes, memory.device),
                                     self.dec_bbox_head, self.dec_score_head, self.query_pos_head)
        return {"pred_logits": logits, "pred_boxes": boxes}

    def forward(self, feats: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        enc = self.encode(feats)
        _, target, ref_unact = select_queries(enc.logits, enc.boxes_unact, enc.output_memory, self.num_queries)
        return self.decode(target, ref_unact, enc.memory, enc.shapes)

    def forward_train(self, feats: list[torch.Tensor], gt: GroundTruth, image_size: tuple[int, int]) -> dict:
        """Training outputs for the encoder levels ``feats`` and per-image ground truth ``gt``
        (labels, (cx, cy, w, h) boxes in [0, 1]);
        see :func:`~libreyolo.models.detr_shared.denoising.pack_train_outputs`."""
        enc = self.encode(feats)
        memory, enc_logits = enc.memory, enc.logits
        shapes = self._anchors.level_shapes(enc.shapes, memory.device)
        topk, target, ref_unact = select_queries(enc_logits, enc.boxes_unact, enc.output_memory, self.num_queries)
        enc_topk_logits = enc_logits.gather(1, topk.unsqueeze(-1).expand(-1, -1, enc_logits.shape[-1]))
        enc_topk_boxes = torch.sigmoid(ref_unact)
        # the decoder starts from the selection, but its gradient does not flow back into it
        target, ref_unact = target.detach(), ref_unact.detach()
        target, ref_unact, dn, attend = prepend_denoising(self, target, ref_unact, gt, topk.shape[1])
        logits, boxes = self.decoder.forward_train(target, ref_unact, memory, shapes, self.dec_bbox_head,
                                                   self.dec_score_head, self.query_pos_head, attend)
        return pack_train_outputs(logits, boxes, enc_topk_logits, enc_topk_boxes, dn, image_size)
