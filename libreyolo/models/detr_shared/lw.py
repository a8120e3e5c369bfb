"""The detector of the LW-DETR line (LW-DETR, and RF-DETR which forked it): a ViT backbone's
projected pyramid, two-stage query selection, a shallow deformable decoder, shared heads.

A family supplies the ViT (``backbone.0.encoder``, returning a list of (B, C, H, W) maps) and a
:class:`LWConfig`; everything else is here, once. Module names are the reference checkpoints'
(schema 1.0: ``backbone.0.{encoder,projector}``, ``transformer.*``, ``class_embed``,
``bbox_embed``, ``refpoint_embed``, ``query_feat``).

Inference (eval mode) runs the reference's eval path:

1. Memory: the projected levels flattened, (B, S, C). Proposals: one box per cell, (cx, cy) its
   centre, (w, h) ``0.05 * 2**level``, in [0, 1]; cells too close to the border are invalid
   (proposal 0, memory zeroed).
2. Query selection (first of ``group_detr`` encoder heads): ``enc_output`` + ``enc_output_norm``,
   class logits and a box delta per cell, boxes reparametrised around the proposal
   (``cxcy = d_xy * wh + xy``, ``wh = exp(d_wh) * wh``); the top ``num_queries`` cells by best
   class logit give the reference boxes.
3. Decoder: the learned queries (``query_feat``) start from the learned ``refpoint_embed``
   reparametrised around the selected boxes; every layer attends to itself and, through
   deformable attention, to the memory around the same references ("lite" refinement: the
   references are not refined between layers). Every layer's output is normalised by
   ``decoder.norm``.
4. Heads on every layer: ``class_embed`` logits, ``bbox_embed`` deltas reparametrised around the
   references.

Training (:meth:`LWDETR.forward_train`) runs Group-DETR: ``group_detr`` (13) query groups, each
with its own encoder head (``enc_output[g]``, ``enc_output_norm[g]``, ``enc_out_*_embed[g]``), its
own top-k selection and its own rows of ``query_feat`` / ``refpoint_embed``; the decoder's
self-attention stays inside a group, cross-attention and the heads are shared. The selected
boxes enter the decoder's references detached (the encoder boxes are supervised on their own).
Inference uses group 0 only, so the eval path above is unchanged.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from libreyolo.models.detr_shared.anchors import AnchorCache
from libreyolo.models.detr_shared.deformable import MSDeformableAttention
from libreyolo.models.detr_shared.denoising import pack_train_outputs
from libreyolo.models.detr_shared.layers import MLP, MultiheadAttention

Shapes = list[tuple[int, int]]
PROPOSAL_EPS = 0.01


@dataclass
class EncoderOutputs:
    """Step 1-2 of one forward: ``memory`` (B, S, C), level ``shapes``, per cell the selection's
    ``features`` (B, S, C), class ``logits`` (B, S, classes) and ``boxes`` (B, S, 4)."""

    memory: torch.Tensor
    shapes: Shapes
    features: torch.Tensor
    logits: torch.Tensor
    boxes: torch.Tensor


@dataclass(frozen=True)
class LWConfig:
    """The decoder side of one size (the backbone is the family's)."""

    hidden: int = 256
    sa_heads: int = 8
    ca_heads: int = 16
    points: int = 2
    levels: int = 1
    dec_layers: int = 3
    num_queries: int = 300
    group_detr: int = 13
    ffn: int = 2048


def sine_embedding(boxes: torch.Tensor, dim: float) -> torch.Tensor:
    """(B, Q, 4) boxes (cx, cy, w, h) -> (B, Q, 4 * dim) sine-cosine embedding, ordered y, x, w, h."""
    steps = boxes.new_ones((int(dim),)).cumsum(0) - 1
    steps = 10000 ** (2 * torch.div(steps, 2, rounding_mode="floor") / dim)
    scale = 2 * math.pi
    parts = []
    for i in (1, 0, 2, 3):
        p = boxes[:, :, i] * scale
        p = p[:, :, None] / steps
        parts.append(torch.stack((p[:, :, 0::2].sin(), p[:, :, 1::2].cos()), dim=3).flatten(2))
    return torch.cat(parts, dim=2)


def make_proposals(shapes: Shapes, device: torch.device | None = None,
                   dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Proposals (1, S, 4) (cx, cy, w, h) in [0, 1] (0 where invalid) and their valid mask (1, S, 1)."""
    levels = []
    for lvl, (h, w) in enumerate(shapes):
        gy, gx = torch.meshgrid(torch.arange(h, dtype=torch.float32, device=device),
                                torch.arange(w, dtype=torch.float32, device=device), indexing="ij")
        xy = torch.stack([(gx + 0.5) / w, (gy + 0.5) / h], dim=-1)
        wh = torch.ones_like(xy) * 0.05 * (2.0 ** lvl)
        levels.append(torch.cat([xy, wh], dim=-1).reshape(1, h * w, 4))
    proposals = torch.cat(levels, dim=1)
    valid = ((proposals > PROPOSAL_EPS) & (proposals < 1 - PROPOSAL_EPS)).all(-1, keepdim=True)
    return torch.where(valid, proposals, 0.0).to(dtype), valid


def reparam_boxes(delta: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Box deltas around references (both (..., 4)): ``cxcy = d_xy * ref_wh + ref_xy``, ``wh = exp(d_wh) * ref_wh``."""
    cxcy = delta[..., :2] * ref[..., 2:] + ref[..., :2]
    wh = delta[..., 2:].exp() * ref[..., 2:]
    return torch.cat([cxcy, wh], dim=-1)


class LWDecoderLayer(nn.Module):
    """Post-norm: self-attention (position on queries and keys), deformable cross-attention, ReLU FFN."""

    def __init__(self, cfg: LWConfig) -> None:
        super().__init__()
        d = cfg.hidden
        self.self_attn = MultiheadAttention(d, cfg.sa_heads)
        self.norm1 = nn.LayerNorm(d)
        self.cross_attn = MSDeformableAttention(d, cfg.ca_heads, cfg.levels, cfg.points)
        self.linear1 = nn.Linear(d, cfg.ffn)
        self.linear2 = nn.Linear(cfg.ffn, d)
        self.norm2 = nn.LayerNorm(d)
        self.norm3 = nn.LayerNorm(d)

    def forward(self, tgt: torch.Tensor, memory: torch.Tensor, query_pos: torch.Tensor, reference: torch.Tensor,
                shapes: Shapes, groups: int = 1) -> torch.Tensor:
        q = tgt + query_pos
        if groups == 1:
            tgt = self.norm1(tgt + self.self_attn(q, q, tgt))
        else:  # Group-DETR: each group's queries attend to their own group only
            b, n, c = tgt.shape
            q_g, v_g = q.reshape(b * groups, n // groups, c), tgt.reshape(b * groups, n // groups, c)
            tgt = self.norm1(tgt + self.self_attn(q_g, q_g, v_g).reshape(b, n, c))
        tgt = self.norm2(tgt + self.cross_attn(tgt + query_pos, reference, memory, shapes))
        return self.norm3(tgt + self.linear2(F.relu(self.linear1(tgt))))


class LWDecoder(nn.Module):
    def __init__(self, cfg: LWConfig) -> None:
        super().__init__()
        self.d_model = cfg.hidden
        self.layers = nn.ModuleList(LWDecoderLayer(cfg) for _ in range(cfg.dec_layers))
        self.norm = nn.LayerNorm(cfg.hidden)
        self.ref_point_head = MLP(2 * cfg.hidden, cfg.hidden, cfg.hidden, 2)

    def forward(self, tgt: torch.Tensor, memory: torch.Tensor, refs: torch.Tensor, shapes: Shapes,
                groups: int = 1) -> torch.Tensor:
        """Every layer's normalised output, (L, B, Q, C); ``refs`` (B, Q, 4) boxes in [0, 1];
        ``groups``: the queries are that many equal Group-DETR groups (training)."""
        query_pos = self.ref_point_head(sine_embedding(refs, self.d_model / 2))
        reference = refs[:, :, None]
        out = []
        for layer in self.layers:
            tgt = layer(tgt, memory, query_pos, reference, shapes, groups)
            out.append(self.norm(tgt))
        return torch.stack(out)


class LWTransformer(nn.Module):
    """Two-stage query selection and the decoder; ``enc_out_*`` heads are set by :class:`LWDETR`."""

    def __init__(self, cfg: LWConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.decoder = LWDecoder(cfg)
        self.enc_output = nn.ModuleList(nn.Linear(cfg.hidden, cfg.hidden) for _ in range(cfg.group_detr))
        self.enc_output_norm = nn.ModuleList(nn.LayerNorm(cfg.hidden) for _ in range(cfg.group_detr))
        self.enc_out_bbox_embed = nn.ModuleList()
        self.enc_out_class_embed = nn.ModuleList()
        self._proposals = AnchorCache()

    def encode(self, feats: list[torch.Tensor]) -> EncoderOutputs:
        """The memory and every cell's selection score, logits and box (step 1 and 2 before the top-k)."""
        return self.encode_groups(feats, 1)[0]

    def encode_groups(self, feats: list[torch.Tensor], groups: int) -> list[EncoderOutputs]:
        """:meth:`encode` for the first ``groups`` encoder heads (one memory, one head each)."""
        memory = torch.cat([f.flatten(2).transpose(1, 2) for f in feats], 1)
        # the level shapes carry their device copy, made once per shape: a kernel provider of
        # ms_deform_attn reads it instead of copying a host tensor, which a CUDA graph capture refuses
        shapes = self._proposals.level_shapes([(int(f.shape[2]), int(f.shape[3])) for f in feats], memory.device)
        proposals, valid = self._proposals.get((tuple(shapes), str(memory.device), memory.dtype),
                                               lambda: make_proposals(shapes, memory.device, memory.dtype))
        masked = torch.where(valid, memory, 0.0)
        out = []
        for g in range(groups):
            features = self.enc_output_norm[g](self.enc_output[g](masked))
            logits = self.enc_out_class_embed[g](features)
            boxes = reparam_boxes(self.enc_out_bbox_embed[g](features), proposals)
            out.append(EncoderOutputs(memory, shapes, features, logits, boxes))
        return out

    def select(self, enc: EncoderOutputs) -> torch.Tensor:
        """(B, K) indices of the cells that become queries, best first (K = num_queries, or every
        cell of a tiny input)."""
        k = min(self.cfg.num_queries, enc.memory.shape[1])
        return torch.topk(enc.logits.max(-1).values, k, dim=1).indices

    @staticmethod
    def gather(enc: EncoderOutputs, picked: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``picked`` (B, K) cells' encoder logits (B, K, classes) and boxes (B, K, 4)."""
        boxes = enc.boxes.gather(1, picked.unsqueeze(-1).expand(-1, -1, 4))
        logits = enc.logits.gather(1, picked.unsqueeze(-1).expand(-1, -1, enc.logits.shape[-1]))
        return logits, boxes

    def decode(self, enc: EncoderOutputs, picked: torch.Tensor, refpoint_embed: torch.Tensor,
               query_feat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(decoder outputs (L, B, Q, C), references (B, Q, 4), the picked cells' encoder logits
        (B, K, classes) and boxes (B, K, 4))."""
        k = picked.shape[1]
        logits_ts, boxes_ts = self.gather(enc, picked)
        b = enc.memory.shape[0]
        tgt = query_feat.unsqueeze(0).expand(b, -1, -1)
        refs = refpoint_embed.unsqueeze(0).expand(b, -1, -1)
        refs = torch.cat([reparam_boxes(refs[:, :k], boxes_ts), refs[:, k:]], dim=1)
        hs = self.decoder(tgt, enc.memory, refs, enc.shapes)
        return hs, refs, logits_ts, boxes_ts


class LWBackbone(nn.Module):
    """``encoder`` (the family's ViT: image -> list of maps) then ``projector``."""

    def __init__(self, encoder: nn.Module, projector: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.projector = projector

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self.projector(self.encoder(x))


class LWDETR(nn.Module):
    """The network: ``backbone.0`` (ViT + projector), ``transformer``, ``class_embed`` (``classes``
    logits), ``bbox_embed``, the learned queries. Returns ``pred_logits`` (B, Q, classes) and
    ``pred_boxes`` (B, Q, 4) (cx, cy, w, h) in [0, 1]; with ``aux`` also ``aux_outputs`` (the same
    for every earlier decoder layer) and ``enc_outputs`` (the selected encoder candidates' logits
    and boxes), as RF-DETR's reference returns them in eval mode."""

    def __init__(self, backbone: LWBackbone, cfg: LWConfig, classes: int, *, first_stride: int,
                 aux: bool = False) -> None:
        super().__init__()
        self.cfg, self.aux = cfg, aux
        self.first_stride = first_stride  # input pixels per cell of the first projected level
        self.backbone = nn.ModuleList([backbone])
        self.transformer = LWTransformer(cfg)
        self.class_embed = nn.Linear(cfg.hidden, classes)
        self.bbox_embed = MLP(cfg.hidden, cfg.hidden, 4, 3)
        self.refpoint_embed = nn.Embedding(cfg.num_queries * cfg.group_detr, 4)
        self.query_feat = nn.Embedding(cfg.num_queries * cfg.group_detr, cfg.hidden)
        with torch.no_grad():  # untrained start: prior 0.01 scores, boxes at their references
            self.refpoint_embed.weight.zero_()
            self.class_embed.bias.fill_(-math.log((1 - 0.01) / 0.01))
            self.bbox_embed.layers[-1].weight.zero_()
            self.bbox_embed.layers[-1].bias.zero_()
        self.transformer.enc_out_bbox_embed.extend(copy.deepcopy(self.bbox_embed) for _ in range(cfg.group_detr))
        self.transformer.enc_out_class_embed.extend(copy.deepcopy(self.class_embed) for _ in range(cfg.group_detr))

    def forward(self, x: torch.Tensor) -> dict:
        enc = self.transformer.encode(self.backbone[0](x))
        return self.decode(enc, self.transformer.select(enc))

    def decode(self, enc: EncoderOutputs, picked: torch.Tensor) -> dict:
        """The outputs for the encoder cells ``picked`` (B, K) (:meth:`LWTransformer.select`'s)."""
        q = self.cfg.num_queries
        hs, refs, logits_ts, boxes_ts = self.transformer.decode(enc, picked, self.refpoint_embed.weight[:q],
                                                                self.query_feat.weight[:q])
        if not self.aux:
            return {"pred_logits": self.class_embed(hs[-1]), "pred_boxes": reparam_boxes(self.bbox_embed(hs[-1]), refs)}
        logits, boxes = self.class_embed(hs), reparam_boxes(self.bbox_embed(hs), refs)
        return {
            "pred_logits": logits[-1], "pred_boxes": boxes[-1],
            "aux_outputs": [{"pred_logits": a, "pred_boxes": b} for a, b in zip(logits[:-1], boxes[:-1], strict=True)],
            "enc_outputs": {"pred_logits": logits_ts, "pred_boxes": boxes_ts},
        }

    def forward_train(self, feats: list[torch.Tensor]) -> dict:
        """Group-DETR training outputs from the projected levels (``backbone.0``'s output): the dict
        :class:`libreyolo.train.loss.detr.DetrLoss` reads (every decoder layer and the encoder
        selection, each over ``group_detr`` groups of queries, ``query_groups`` saying how many;
        no denoising). Each group selects its own top-k cells with its own encoder head and
        starts from its own rows of ``query_feat`` and ``refpoint_embed``."""
        cfg, b = self.cfg, int(feats[0].shape[0])
        groups, q = cfg.group_detr, cfg.num_queries
        rows = self.refpoint_embed.weight.unsqueeze(0).expand(b, -1, -1)
        refs, enc_logits, enc_boxes = [], [], []
        encs = self.transformer.encode_groups(feats, groups)
        for g, enc in enumerate(encs):
            logits_ts, boxes_ts = self.transformer.gather(enc, self.transformer.select(enc))
            k, own = boxes_ts.shape[1], rows[:, g * q:(g + 1) * q]
            refs.append(torch.cat([reparam_boxes(own[:, :k], boxes_ts.detach()), own[:, k:]], dim=1))
            enc_logits.append(logits_ts)
            enc_boxes.append(boxes_ts)
        refs_all = torch.cat(refs, dim=1)
        tgt = self.query_feat.weight.unsqueeze(0).expand(b, -1, -1)
        hs = self.transformer.decoder(tgt, encs[0].memory, refs_all, encs[0].shapes, groups)
        logits, boxes = self.class_embed(hs), reparam_boxes(self.bbox_embed(hs), refs_all)
        last = feats[0]
        image_size = (int(last.shape[2]) * self.first_stride, int(last.shape[3]) * self.first_stride)
        out = pack_train_outputs(list(logits), list(boxes), torch.cat(enc_logits, 1), torch.cat(enc_boxes, 1), None,
                                 image_size)
        out["query_groups"] = groups
        return out
