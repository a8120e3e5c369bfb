"""D-FINE's decoder: query selection, deformable layers with a gate, fine-grained distribution refinement.

FDR: each layer predicts, per box edge, a distribution over ``reg_max + 1`` bins of a
non-uniform weighting function; its expectation is the edge's distance from the first layer's
box, and every layer refines the previous layer's distributions (their logits are summed). A
localisation-quality head (LQE) adds a score from the distributions' top probabilities.

``forward`` is inference (the final layer only). ``forward_train`` is the training path: selected
plus contrastive denoising queries (:mod:`libreyolo.models.detr_shared.denoising`), every layer's
outputs, the pre-box head's and the encoder selection's. Cross-attention
samples through the ``ms_deform_attn`` slot with one point count per level
(``points_per_level``); counts that differ between levels stay on the portable path.
"""
from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from libreyolo.models.detr_shared.anchors import AnchorCache
from libreyolo.models.detr_shared.deformable import PointsDeformableAttention as MSDeformableAttention
from libreyolo.models.detr_shared.denoising import GroundTruth, pack_train_outputs, prepend_denoising
from libreyolo.models.detr_shared.layers import (
    MLP,
    MultiheadAttention,
    functional_activation,
    init_heads,
    inverse_sigmoid,
)

Shapes = list[tuple[int, int]]


def weighting_function(reg_max: int, up: torch.Tensor, reg_scale: torch.Tensor) -> torch.Tensor:
    """The ``reg_max + 1`` bin values of FDR: symmetric, growing geometrically away from 0.

    Built from the two learned scalars with device ops only (no host tensor), in the reference's
    operation order.
    """
    upper1 = abs(up[0]) * abs(reg_scale)
    upper2 = abs(up[0]) * abs(reg_scale) * 2
    step = (upper1 + 1) ** (2 / (reg_max - 2))
    left = [-(step ** i) + 1 for i in range(reg_max // 2 - 1, 0, -1)]
    right = [step ** i - 1 for i in range(1, reg_max // 2)]
    return torch.cat([-upper2, *left, torch.zeros_like(up[0][None]), *right, upper2], 0)


def distance2bbox(points: torch.Tensor, distance: torch.Tensor, reg_scale: torch.Tensor) -> torch.Tensor:
    """Edge distances (in units of box size / reg_scale) around (cx, cy, w, h) points -> (cx, cy, w, h).

    ``reg_scale`` is taken in the points' dtype: DEIMv2's n..x checkpoints hold it as an int64
    parameter, which ``.half()`` leaves alone and ``0.5 * reg_scale`` turns into a float32 tensor
    that would promote the boxes (and the next layer's sampling grid) to float32 under half weights.
    In float32 the cast changes no value (4 -> 4.0 exactly, the same promotion the int64 got)."""
    reg_scale = abs(reg_scale).to(points.dtype)
    x1 = points[..., 0] - (0.5 * reg_scale + distance[..., 0]) * (points[..., 2] / reg_scale)
    y1 = points[..., 1] - (0.5 * reg_scale + distance[..., 1]) * (points[..., 3] / reg_scale)
    x2 = points[..., 0] + (0.5 * reg_scale + distance[..., 2]) * (points[..., 2] / reg_scale)
    y2 = points[..., 1] + (0.5 * reg_scale + distance[..., 3]) * (points[..., 3] / reg_scale)
    return torch.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], -1)


class Integral(nn.Module):
    """Expectation of each edge's bin distribution under the weighting function."""

    def __init__(self, reg_max: int = 32) -> None:
        super().__init__()
        self.reg_max = reg_max

    def forward(self, x: torch.Tensor, project: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = F.softmax(x.reshape(-1, self.reg_max + 1), dim=1)
        x = F.linear(x, project.to(x.dtype)).reshape(-1, 4)
        return x.reshape(list(shape[:-1]) + [-1])


class LQE(nn.Module):
    """Localisation quality: a score offset from the top-``k`` probabilities of each edge distribution."""

    def __init__(self, k: int, hidden: int, num_layers: int, reg_max: int, act: str = "relu") -> None:
        super().__init__()
        self.k, self.reg_max = k, reg_max
        self.reg_conf = MLP(4 * (k + 1), hidden, 1, num_layers, act)

    def forward(self, scores: torch.Tensor, corners: torch.Tensor) -> torch.Tensor:
        b, q, _ = corners.shape
        prob = F.softmax(corners.reshape(b, q, 4, self.reg_max + 1), dim=-1)
        top = prob.topk(self.k, dim=-1).values
        stat = torch.cat([top, top.mean(dim=-1, keepdim=True)], dim=-1)
        return scores + self.reg_conf(stat.reshape(b, q, -1))


class Gate(nn.Module):
    """Per-channel sigmoid gates mixing two inputs, then ``norm`` (a LayerNorm unless given)."""

    def __init__(self, dim: int, norm: nn.Module | None = None) -> None:
        super().__init__()
        self.gate = nn.Linear(2 * dim, 2 * dim)
        self.norm = nn.LayerNorm(dim) if norm is None else norm

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        g1, g2 = torch.sigmoid(self.gate(torch.cat([x1, x2], dim=-1))).chunk(2, dim=-1)
        return self.norm(g1 * x1 + g2 * x2)


class TransformerDecoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int, ffn: int, points: tuple[int, ...], act: str = "relu") -> None:
        super().__init__()
        self.act = functional_activation(act)
        self.self_attn = MultiheadAttention(dim, heads)
        self.norm1 = nn.LayerNorm(dim)
        self.cross_attn = MSDeformableAttention(dim, heads, points)
        self.gateway = Gate(dim)
        self.linear1 = nn.Linear(dim, ffn)
        self.linear2 = nn.Linear(ffn, dim)
        self.norm3 = nn.LayerNorm(dim)

    def forward(self, target: torch.Tensor, reference: torch.Tensor, value: torch.Tensor, shapes: Shapes,
                query_pos: torch.Tensor, attend: torch.Tensor | None = None) -> torch.Tensor:
        """``attend`` (Q, Q) bool self-attention mask, True = may attend (training with denoising)."""
        q = target + query_pos
        target = self.norm1(target + self.self_attn(q, q, target, attend))
        target = self.gateway(target, self.cross_attn(target + query_pos, reference, value, shapes))
        target = target + self.linear2(self.act(self.linear1(target)))
        return self.norm3(target.clamp(min=-65504, max=65504))


class TransformerDecoder(nn.Module):
    def __init__(self, layer_fn, num_layers: int, heads: int, reg_max: int, up: nn.Parameter,
                 reg_scale: nn.Parameter, eval_idx: int = -1, act: str = "relu") -> None:
        super().__init__()
        self.heads, self.reg_max = heads, reg_max
        self.up, self.reg_scale = up, reg_scale  # the same parameters as the parent's (two state-dict keys)
        self.eval_idx = eval_idx if eval_idx >= 0 else num_layers + eval_idx
        self.layers = nn.ModuleList(layer_fn() for _ in range(num_layers))
        self.lqe_layers = nn.ModuleList(LQE(4, 64, 2, reg_max, act) for _ in range(num_layers))

    def forward(self, target: torch.Tensor, ref_unact: torch.Tensor, memory: torch.Tensor, shapes: Shapes,
                bbox_head: nn.ModuleList, score_head: nn.ModuleList, query_pos_head: nn.Module,
                pre_bbox_head: nn.Module, integral: Integral) -> tuple[torch.Tensor, torch.Tensor]:
        value = memory.reshape(memory.shape[0], memory.shape[1], self.heads, -1)
        project = weighting_function(self.reg_max, self.up, self.reg_scale)
        ref = torch.sigmoid(ref_unact)
        target_prev = corners_prev = None
        for i, layer in enumerate(self.layers):
            query_pos = query_pos_head(ref).clamp(min=-10, max=10)
            target = layer(target, ref.unsqueeze(2), value, shapes, query_pos)
            if i == 0:
                initial = torch.sigmoid(pre_bbox_head(target) + inverse_sigmoid(ref))
                corners = bbox_head[i](target)
            else:  # each layer refines the previous one's distributions, seeing both layers' features
                corners = bbox_head[i](target + target_prev) + corners_prev
            boxes = distance2bbox(initial, integral(corners, project), self.reg_scale)
            if i == self.eval_idx:
                return self.lqe_layers[i](score_head[i](target), corners), boxes
            target_prev, corners_prev, ref = target, corners, boxes
        raise AssertionError("eval_idx is past the last decoder layer")

    def forward_train(self, target: torch.Tensor, ref_unact: torch.Tensor, memory: torch.Tensor, shapes: Shapes,
                      bbox_head: nn.ModuleList, score_head: nn.ModuleList, query_pos_head: nn.Module,
                      pre_bbox_head: nn.Module, integral: Integral,
                      attend: torch.Tensor | None) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor],
                                                            torch.Tensor, torch.Tensor]:
        """All layers. Returns per head logits (B, Q, nc) and boxes (B, Q, 4): first the pre-box
        head (first layer's scores, initial boxes), then every layer (LQE-adjusted scores); per layer
        the edge distributions' logits (B, Q, 4 * (reg_max + 1)); the initial boxes (B, Q, 4) the
        distances are measured from; and the bin values (reg_max + 1,). Each layer's reference and
        the features it adds to the next are detached; the distributions accumulate undetached, as
        in inference."""
        value = memory.reshape(memory.shape[0], memory.shape[1], self.heads, -1)
        project = weighting_function(self.reg_max, self.up, self.reg_scale)
        ref = torch.sigmoid(ref_unact)
        logits, boxes, all_corners = [], [], []
        target_prev = corners_prev = initial = None
        for i, layer in enumerate(self.layers):
            query_pos = query_pos_head(ref).clamp(min=-10, max=10)
            target = layer(target, ref.unsqueeze(2), value, shapes, query_pos, attend)
            if i == 0:
                initial = torch.sigmoid(pre_bbox_head(target) + inverse_sigmoid(ref))
                logits.append(score_head[0](target))
                boxes.append(initial)
                corners = bbox_head[0](target)
            else:
                corners = bbox_head[i](target + target_prev) + corners_prev
            layer_boxes = distance2bbox(initial, integral(corners, project), self.reg_scale)
            logits.append(self.lqe_layers[i](score_head[i](target), corners))
            boxes.append(layer_boxes)
            all_corners.append(corners)
            target_prev, corners_prev, ref = target.detach(), corners, layer_boxes.detach()
        return logits, boxes, all_corners, initial, project


class DFINETransformer(nn.Module):
    def __init__(self, nc: int, hidden: int, feat_channels: list[int], *, heads: int = 8, num_layers: int = 6,
                 ffn: int = 1024, points: tuple[int, ...] = (4, 4, 4), num_queries: int = 300, reg_max: int = 32,
                 reg_scale: float = 4.0, strides: tuple[int, ...] = (8, 16, 32), eval_size: int = 640,
                 act: str = "relu") -> None:
        """``act``: the activation of the feed-forward layers, the localisation-quality layers and
        every MLP head (D-FINE: ReLU; DEIM and RT-DETRv4 use the same network with SiLU)."""
        super().__init__()
        self.hidden, self.num_queries, self.reg_max, self.nc = hidden, num_queries, reg_max, nc
        # denoising (training only): queries per batch, label flip ratio, box noise scale
        self.num_denoising, self.label_noise, self.box_noise = 100, 0.5, 1.0
        self.up = nn.Parameter(torch.tensor([0.5]), requires_grad=False)
        self.reg_scale = nn.Parameter(torch.tensor([reg_scale]), requires_grad=False)
        self.input_proj = nn.ModuleList(
            nn.Identity() if c == hidden else nn.Sequential(OrderedDict([
                ("conv", nn.Conv2d(c, hidden, 1, bias=False)), ("norm", nn.BatchNorm2d(hidden))]))
            for c in feat_channels)
        self.decoder = TransformerDecoder(lambda: TransformerDecoderLayer(hidden, heads, ffn, points, act),
                                          num_layers, heads, reg_max, self.up, self.reg_scale, act=act)
        self.denoising_class_embed = nn.Embedding(nc + 1, hidden, padding_idx=nc)
        self.query_pos_head = MLP(4, 2 * hidden, hidden, 2, act)
        self.enc_output = nn.Sequential(OrderedDict([("proj", nn.Linear(hidden, hidden)),
                                                     ("norm", nn.LayerNorm(hidden))]))
        self.enc_score_head = nn.Linear(hidden, nc)
        self.enc_bbox_head = MLP(hidden, hidden, 4, 3, act)
        self.dec_score_head = nn.ModuleList(nn.Linear(hidden, nc) for _ in range(num_layers))
        self.pre_bbox_head = MLP(hidden, hidden, 4, 3, act)
        self.dec_bbox_head = nn.ModuleList(MLP(hidden, hidden, 4 * (reg_max + 1), 3, act) for _ in range(num_layers))
        self.integral = Integral(reg_max)
        # the reference stores the anchors of its evaluation size (checkpoints carry them); other
        # sizes get theirs from the per-shape cache
        from libreyolo.models.detr_shared.anchors import make_anchors

        anchors, valid = make_anchors([(eval_size // s, eval_size // s) for s in strides])
        self.register_buffer("anchors", anchors)
        self.register_buffer("valid_mask", valid)
        self._anchors = AnchorCache()
        init_heads(self)

    def _anchors_for(self, shapes: Shapes, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.anchors.shape[1] == memory.shape[1] and self.anchors.device == memory.device:
            return self.anchors, self.valid_mask
        return self._anchors.anchors(shapes, memory.device)

    def _memory(self, feats: list[torch.Tensor]) -> tuple[torch.Tensor, Shapes, torch.Tensor, torch.Tensor]:
        """Projected levels flattened to memory (B, S, C), level shapes, anchors (1, S, 4), valid (1, S, 1)."""
        proj = [p(f) for p, f in zip(self.input_proj, feats, strict=True)]
        shapes = [(int(f.shape[2]), int(f.shape[3])) for f in proj]
        memory = torch.cat([f.flatten(2).permute(0, 2, 1) for f in proj], dim=1)
        anchors, valid = self._anchors_for(shapes, memory)
        return memory, self._anchors.level_shapes(shapes, memory.device), anchors, valid

    def forward(self, feats: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        memory, shapes, anchors, valid = self._memory(feats)
        output_memory = self.enc_output(valid.to(memory.dtype) * memory)
        enc_logits = self.enc_score_head(output_memory)
        # fewer positions than queries (tiny inputs): take them all rather than fail
        topk = torch.topk(enc_logits.max(-1).values, min(self.num_queries, memory.shape[1]), dim=-1).indices
        target = output_memory.gather(1, topk.unsqueeze(-1).expand(-1, -1, self.hidden))
        anchors = anchors.to(memory.dtype).expand(memory.shape[0], -1, -1)
        ref_unact = self.enc_bbox_head(target) + anchors.gather(1, topk.unsqueeze(-1).expand(-1, -1, 4))
        logits, boxes = self.decoder(target, ref_unact, memory, shapes, self.dec_bbox_head, self.dec_score_head,
                                     self.query_pos_head, self.pre_bbox_head, self.integral)
        return {"pred_logits": logits, "pred_boxes": boxes}

    def forward_train(self, feats: list[torch.Tensor], gt: GroundTruth, image_size: tuple[int, int]) -> dict:
        """Training outputs for the encoder levels ``feats`` and per-image ground truth ``gt``
        (labels, (cx, cy, w, h) boxes in [0, 1]);
        see :func:`~libreyolo.models.detr_shared.denoising.pack_train_outputs`.
        The first supervised head is the pre-box head, then the decoder layers."""
        memory, shapes, anchors, valid = self._memory(feats)
        output_memory = self.enc_output(valid.to(memory.dtype) * memory)
        enc_logits = self.enc_score_head(output_memory)
        q = min(self.num_queries, memory.shape[1])
        topk = torch.topk(enc_logits.max(-1).values, q, dim=-1).indices
        selected = output_memory.gather(1, topk.unsqueeze(-1).expand(-1, -1, self.hidden))
        anchors = anchors.to(memory.dtype).expand(memory.shape[0], -1, -1)
        ref_unact = self.enc_bbox_head(selected) + anchors.gather(1, topk.unsqueeze(-1).expand(-1, -1, 4))
        enc_topk_logits = enc_logits.gather(1, topk.unsqueeze(-1).expand(-1, -1, enc_logits.shape[-1]))
        enc_topk_boxes = torch.sigmoid(ref_unact)
        # the decoder starts from the selection, but its gradient does not flow back into it
        target, ref_unact = selected.detach(), ref_unact.detach()
        target, ref_unact, dn, attend = prepend_denoising(self, target, ref_unact, gt, q)
        logits, boxes, corners, initial, project = self.decoder.forward_train(
            target, ref_unact, memory, shapes, self.dec_bbox_head, self.dec_score_head, self.query_pos_head,
            self.pre_bbox_head, self.integral, attend)
        out = pack_train_outputs(logits, boxes, enc_topk_logits, enc_topk_boxes, dn, image_size)
        # for the fine-grained localisation loss: the last len(corners) heads are the decoder layers
        n = 0 if dn is None else dn.num
        all_corners = torch.stack(corners)
        out.update(pred_corners=all_corners[:, :, n:], dn_corners=all_corners[:, :, :n], ref_initial=initial[:, n:],
                   dn_ref_initial=initial[:, :n], corner_bins=project, reg_scale=self.reg_scale)
        return out
