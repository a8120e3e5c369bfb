"""Training-time pieces of the DETR decoders: ground truth per image and contrastive denoising queries.

Denoising (DN-DETR, DINO): besides the queries picked from the encoder memory, the decoder is fed
noised copies of the ground-truth boxes, whose targets are known, so they need no matching. The
copies come in ``groups``; each group holds ``group_size`` *positive* queries (box corners moved
by less than half the box size, label flipped to a random class with probability
``label_noise / 2``) followed by ``group_size`` *negative* ones (corners moved by between a half and
a whole box size), where ``group_size`` is the most boxes any image of the batch has (images with
fewer are padded with the padding class). The self-attention mask keeps the matching queries
from seeing any denoising query (which would leak the answer), and each denoising group from
seeing the others; denoising queries may look at the matching ones.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from libreyolo.errors import ArgumentError
from libreyolo.models.detr_shared.layers import inverse_sigmoid

GroundTruth = list[tuple[torch.Tensor, torch.Tensor]]


def cxcywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    """(..., 4) (cx, cy, w, h) -> (..., 4) (x1, y1, x2, y2)."""
    cx, cy, w, h = boxes.unbind(-1)
    return torch.stack((cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h), -1)


def xyxy_to_cxcywh(boxes: torch.Tensor) -> torch.Tensor:
    """(..., 4) (x1, y1, x2, y2) -> (..., 4) (cx, cy, w, h)."""
    x1, y1, x2, y2 = boxes.unbind(-1)
    return torch.stack(((x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1), -1)


def split_targets(targets: torch.Tensor, batch: int, image_size: tuple[int, int]) -> GroundTruth:
    """Batch targets (M, 6) rows ``(image, class, x1, y1, x2, y2)`` in input pixels -> per image
    ``(labels (n,) int64, boxes (n, 4) (cx, cy, w, h) normalised by image_size (H, W))``."""
    if targets.ndim != 2 or targets.shape[1] != 6:
        raise ArgumentError(f"DETR training targets have shape {tuple(targets.shape)}, expected (M, 6) rows "
                            "[image index, class, x1, y1, x2, y2] in input pixels")
    h, w = image_size
    targets = targets.float()
    scale = targets.new_tensor([w, h, w, h])
    img = targets[:, 0].long()
    if targets.shape[0] and (int(img.min()) < 0 or int(img.max()) >= batch):
        raise ArgumentError(f"DETR training targets name image indices {int(img.min())}..{int(img.max())} in a batch "
                            f"of {batch}; column 0 must be the image's index in the batch")
    out = []
    for b in range(batch):
        rows = targets[img == b]
        out.append((rows[:, 1].long(), xyxy_to_cxcywh(rows[:, 2:6] / scale)))
    return out


@dataclass
class Denoising:
    """Denoising queries of one batch.

    ``labels`` (B, N) noised classes (``nc`` = padding), ``ref_unact`` (B, N, 4) noised boxes in
    logit space, ``attend`` (N + Q, N + Q) bool self-attention mask (True = may attend; rows are
    queries, the N denoising queries first, then the Q matching ones); N = 2 * group_size * groups.
    """

    labels: torch.Tensor
    ref_unact: torch.Tensor
    attend: torch.Tensor
    group_size: int
    groups: int

    @property
    def num(self) -> int:
        return self.labels.shape[1]


def denoising_attend_mask(group_size: int, groups: int, num_queries: int,
                          device: torch.device | None = None) -> torch.Tensor:
    """(T, T) bool, T = 2 * group_size * groups + num_queries; True where a row query may attend to
    a column query: matching rows see matching columns only, denoising rows see their own group and
    the matching queries."""
    n = 2 * group_size * groups
    group = torch.arange(n, device=device) // (2 * group_size)
    attend = torch.ones(n + num_queries, n + num_queries, dtype=torch.bool, device=device)
    attend[n:, :n] = False
    attend[:n, :n] = group[:, None] == group[None, :]
    return attend


def make_denoising(gt: GroundTruth, nc: int, num_queries: int, *, num_denoising: int = 100,
                   label_noise: float = 0.5, box_noise: float = 1.0) -> Denoising | None:
    """Contrastive denoising queries for the batch's ground truth ``gt`` (see the module docstring),
    or None when the batch has no boxes or ``num_denoising`` is 0. ``num_queries`` is the number of
    matching queries that follow them (for the mask). Uses the global torch RNG."""
    group_size = max((len(labels) for labels, _ in gt), default=0)
    if group_size == 0 or num_denoising <= 0:
        return None
    groups = max(1, num_denoising // group_size)
    device = gt[0][1].device
    batch = len(gt)
    labels = torch.full((batch, group_size), nc, dtype=torch.long, device=device)
    boxes = torch.zeros(batch, group_size, 4, device=device)
    real = torch.zeros(batch, group_size, dtype=torch.bool, device=device)
    for b, (lab, box) in enumerate(gt):
        labels[b, :len(lab)] = lab
        boxes[b, :len(lab)] = box
        real[b, :len(lab)] = True
    reps = 2 * groups
    labels, boxes, real = labels.repeat(1, reps), boxes.repeat(1, reps, 1), real.repeat(1, reps)
    n = labels.shape[1]
    negative = (torch.arange(n, device=device) % (2 * group_size)) >= group_size  # (N,)

    if label_noise > 0:
        flip = (torch.rand(batch, n, device=device) < label_noise * 0.5) & real
        labels = torch.where(flip, torch.randint_like(labels, 0, nc), labels)
    if box_noise > 0:
        half = boxes[..., 2:] * 0.5
        span = torch.cat([half, half], -1) * box_noise  # how far each corner may move
        sign = torch.randint(0, 2, boxes.shape, device=device, dtype=boxes.dtype) * 2 - 1
        size = torch.rand_like(boxes) + negative[None, :, None].to(boxes.dtype)  # [0, 1) positive, [1, 2) negative
        xyxy = (cxcywh_to_xyxy(boxes) + sign * size * span).clamp(0.0, 1.0)
        boxes = xyxy_to_cxcywh(xyxy)
    attend = denoising_attend_mask(group_size, groups, num_queries, device)
    return Denoising(labels, inverse_sigmoid(boxes), attend, group_size, groups)


def pack_train_outputs(logits: list[torch.Tensor], boxes: list[torch.Tensor], enc_logits: torch.Tensor,
                       enc_boxes: torch.Tensor, dn: Denoising | None, image_size: tuple[int, int]) -> dict:
    """The dict :class:`libreyolo.train.loss.detr.DetrLoss` reads, from per-head (B, N + Q, ...) outputs.

    ``pred_logits`` (L, B, Q, nc) / ``pred_boxes`` (L, B, Q, 4): every supervised decoder head on the
    matching queries (last = the final layer); ``dn_logits`` / ``dn_boxes`` (L, B, N, ...) the same
    heads on the denoising queries (N = 0 without denoising); ``enc_logits`` (B, Q, nc) /
    ``enc_boxes`` (B, Q, 4) the encoder's query selection; boxes are (cx, cy, w, h) in [0, 1];
    ``dn_group_size``, ``dn_groups`` (ints) and ``image_size`` (H, W). D-FINE adds its edge
    distributions for the fine-grained localisation loss (``pred_corners``, ``dn_corners``,
    ``ref_initial``, ``dn_ref_initial``, ``corner_bins``, ``reg_scale``; see its decoder).
    """
    n = 0 if dn is None else dn.num
    all_logits, all_boxes = torch.stack(logits), torch.stack(boxes)
    return {
        "pred_logits": all_logits[:, :, n:], "pred_boxes": all_boxes[:, :, n:],
        "dn_logits": all_logits[:, :, :n], "dn_boxes": all_boxes[:, :, :n],
        "enc_logits": enc_logits, "enc_boxes": enc_boxes,
        "dn_group_size": 0 if dn is None else dn.group_size, "dn_groups": 0 if dn is None else dn.groups,
        "image_size": tuple(image_size),
    }


def prepend_denoising(decoder: nn.Module, target: torch.Tensor, ref_unact: torch.Tensor, gt: GroundTruth,
                      num_queries: int) -> tuple[torch.Tensor, torch.Tensor, Denoising | None, torch.Tensor | None]:
    """Put the batch's denoising queries in front of the ``num_queries`` selected ones.

    ``decoder`` holds ``nc``, ``num_denoising``, ``label_noise``, ``box_noise`` and
    ``denoising_class_embed``. Returns ``(target, ref_unact, dn, attend)``: the query contents and
    unactivated reference boxes with the denoising groups first, the groups (None when the decoder
    has none or the batch holds no box) and their attention mask. Without groups the class
    embedding still enters the graph as a zero term, since DDP needs every parameter used."""
    dn = make_denoising(gt, decoder.nc, num_queries, num_denoising=decoder.num_denoising,
                        label_noise=decoder.label_noise, box_noise=decoder.box_noise) \
        if decoder.num_denoising > 0 else None
    if dn is None:
        return target + 0.0 * decoder.denoising_class_embed.weight.sum(), ref_unact, None, None
    target = torch.cat([decoder.denoising_class_embed(dn.labels).to(target.dtype), target], 1)
    ref_unact = torch.cat([dn.ref_unact.to(ref_unact.dtype), ref_unact], 1)
    return target, ref_unact, dn, dn.attend
