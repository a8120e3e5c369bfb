"""DETR training loss (RT-DETR, D-FINE; DEIM's MAL and the LW-DETR line's IA-BCE as other class
terms): Hungarian matching, varifocal + L1 + GIoU terms.

Called on the dict the families' ``train_decode`` returns (see
:func:`libreyolo.models.detr_shared.denoising.pack_train_outputs`). Every supervised head is scored:

- each decoder layer (for D-FINE also its pre-box head) and the encoder's query selection: the
  predictions are matched one-to-one to the image's boxes by a Hungarian assignment minimising
  ``2 * focal class cost + 5 * L1 + 2 * (-GIoU)`` (:class:`HungarianMatcher`);
- the same decoder heads on the denoising queries: targets are known (query ``g * 2m + j`` of
  group ``g`` is the noised copy of box ``j``), so there is no matching, and the negative half of
  each group learns background; these terms are normalised by ``boxes * groups``.

Each matched set contributes three terms, normalised by the number of boxes in the batch:
varifocal classification (an IoU-aware BCE: the matched query's target is its box's IoU with the
ground truth at the true class, unmatched queries are pushed to 0 with a focal weight), L1 on
(cx, cy, w, h) in [0, 1], and ``1 - GIoU``; the terms are summed over all heads.

D-FINE's outputs also carry its per-layer edge distributions; for those a fourth term is added,
the fine-grained localisation loss (FGL): on every matched pair of every decoder layer (and the
denoising pairs), a distribution-focal loss pulling each edge's distribution to the two bins
around the true distance from the layer-0 initial box, weighted by the IoU of the layer's box
(gain 0.15). RT-DETR outputs have no distributions and get three terms.

Not implemented: D-FINE's decoupled distillation loss (DDF: KL from the last layer's
distributions to the earlier layers'), the "union of matches" across layers that D-FINE's
reference uses for FGL/DDF (each layer's own matches are used here), the auxiliary dense O2M
branch of later D-FINE versions, and a cross-process all-reduce of the box count under
distributed training (each process normalises by its own boxes).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from libreyolo.errors import ArgumentError, LibreYOLOError
from libreyolo.models.detr_shared.denoising import GroundTruth, cxcywh_to_xyxy, split_targets

__all__ = ["DetrLoss", "HungarianMatcher", "IaBceLoss", "MalLoss", "bin_interpolation", "edge_distances",
           "generalized_box_iou", "linear_assignment"]

Match = list[tuple[torch.Tensor, torch.Tensor]]  # per image: (query indices, gt indices)


def linear_assignment(cost: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Minimum-cost one-to-one assignment of an (R, C) cost matrix: (rows, cols), min(R, C) pairs."""
    try:
        from scipy.optimize import linear_sum_assignment
    except ImportError as exc:
        raise LibreYOLOError("DETR training (rtdetr, dfine) needs scipy for the Hungarian matching; install the "
                             "training extra: pip install 'libreyolo[train]'") from exc
    rows, cols = linear_sum_assignment(cost.detach().cpu().double().numpy())
    return torch.as_tensor(rows, dtype=torch.long), torch.as_tensor(cols, dtype=torch.long)


def _iou_union(a: torch.Tensor, b: torch.Tensor, pairwise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if pairwise:
        a, b = a[:, None], b[None]
    area_a = (a[..., 2] - a[..., 0]).clamp(min=0) * (a[..., 3] - a[..., 1]).clamp(min=0)
    area_b = (b[..., 2] - b[..., 0]).clamp(min=0) * (b[..., 3] - b[..., 1]).clamp(min=0)
    wh = (torch.minimum(a[..., 2:], b[..., 2:]) - torch.maximum(a[..., :2], b[..., :2])).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    union = area_a + area_b - inter
    return inter / union.clamp(min=1e-7), union


def generalized_box_iou(a: torch.Tensor, b: torch.Tensor, pairwise: bool = False) -> torch.Tensor:
    """GIoU of xyxy boxes: elementwise (N, 4) x (N, 4) -> (N,), or pairwise (N, 4) x (M, 4) -> (N, M)."""
    iou, union = _iou_union(a, b, pairwise)
    if pairwise:
        a, b = a[:, None], b[None]
    wh = (torch.maximum(a[..., 2:], b[..., 2:]) - torch.minimum(a[..., :2], b[..., :2])).clamp(min=0)
    hull = (wh[..., 0] * wh[..., 1]).clamp(min=1e-7)
    return iou - (hull - union) / hull


def edge_distances(start: torch.Tensor, boxes_xyxy: torch.Tensor, reg_scale: torch.Tensor) -> torch.Tensor:
    """The edge distances D-FINE's decoder would need to turn ``start`` (K, 4) (cx, cy, w, h) into the
    xyxy ``boxes_xyxy`` (K, 4): the inverse of its ``distance2bbox``; (K, 4) (left, top, right, bottom)."""
    scale = reg_scale.abs()
    unit_w = start[:, 2] / scale + 1e-16
    unit_h = start[:, 3] / scale + 1e-16
    return torch.stack(((start[:, 0] - boxes_xyxy[:, 0]) / unit_w - 0.5 * scale,
                        (start[:, 1] - boxes_xyxy[:, 1]) / unit_h - 0.5 * scale,
                        (boxes_xyxy[:, 2] - start[:, 0]) / unit_w - 0.5 * scale,
                        (boxes_xyxy[:, 3] - start[:, 1]) / unit_h - 0.5 * scale), -1)


def bin_interpolation(values: torch.Tensor, bins: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For (N,) values on the ascending (R + 1,) bin values: the left bin index (N,) in [0, R - 1]
    and the weight of the left bin (N,) in [0, 1] that interpolates the value (clamped at the ends)."""
    left = (torch.searchsorted(bins, values.contiguous(), right=True) - 1).clamp(0, bins.shape[0] - 2)
    lo, hi = bins[left], bins[left + 1]
    w_left = ((hi - values) / (hi - lo).clamp(min=1e-12)).clamp(0.0, 1.0)
    return left, w_left


class HungarianMatcher:
    """One-to-one matching of queries to boxes, per image.

    Cost of query ``q`` for box ``j`` of class ``c``: ``w_class * focal(q, c) + w_bbox * |b_q - b_j|_1
    - w_giou * GIoU(b_q, b_j)``, where ``focal`` is the focal loss of predicting ``c`` minus that of
    not predicting it (``alpha``, ``gamma``), and boxes are (cx, cy, w, h) in [0, 1].
    """

    def __init__(self, w_class: float = 2.0, w_bbox: float = 5.0, w_giou: float = 2.0, alpha: float = 0.25,
                 gamma: float = 2.0) -> None:
        self.w_class, self.w_bbox, self.w_giou = w_class, w_bbox, w_giou
        self.alpha, self.gamma = alpha, gamma

    def cost(self, logits: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor,
             gt_boxes: torch.Tensor) -> torch.Tensor:
        """(Q, nc) logits, (Q, 4) boxes, (n,) labels, (n, 4) boxes -> (Q, n) cost."""
        p = torch.sigmoid(logits.float())[:, labels]
        pos = self.alpha * (1 - p) ** self.gamma * -torch.log(p + 1e-8)
        neg = (1 - self.alpha) * p ** self.gamma * -torch.log(1 - p + 1e-8)
        l1 = torch.cdist(boxes.float(), gt_boxes.float(), p=1)
        giou = generalized_box_iou(cxcywh_to_xyxy(boxes.float()), cxcywh_to_xyxy(gt_boxes.float()), pairwise=True)
        cost = self.w_class * (pos - neg) + self.w_bbox * l1 - self.w_giou * giou
        return torch.nan_to_num(cost, nan=1e8, posinf=1e8, neginf=-1e8)

    @torch.no_grad()
    def __call__(self, logits: torch.Tensor, boxes: torch.Tensor, gt: GroundTruth, groups: int = 1) -> Match:
        """(B, Q, nc) logits and (B, Q, 4) boxes against per-image ``gt`` -> per image (queries, gts).

        The costs of all images are computed in one (B * Q, total boxes) matrix and copied to the
        host once; each image then solves its own (Q, n) block. With ``groups`` > 1 (Group-DETR)
        the Q queries are that many equal groups, each matched one-to-one to the boxes on its own,
        so every box has one query per group."""
        b, q = logits.shape[:2]
        counts = [len(labels) for labels, _ in gt]
        empty = torch.zeros(0, dtype=torch.long)
        if sum(counts) == 0:
            return [(empty, empty) for _ in gt]
        labels = torch.cat([lab for lab, _ in gt]).to(logits.device)
        gt_boxes = torch.cat([box for _, box in gt]).to(boxes.device)
        cost = self.cost(logits.reshape(b * q, -1), boxes.reshape(b * q, 4), labels, gt_boxes)
        cost = cost.reshape(b, q, -1).cpu()
        out, start, size = [], 0, q // groups
        for i, n in enumerate(counts):
            pairs = [linear_assignment(cost[i, g * size:(g + 1) * size, start:start + n]) for g in range(groups)] \
                if n else [(empty, empty)]
            out.append((torch.cat([r + g * size for g, (r, _) in enumerate(pairs)]), torch.cat([c for _, c in pairs])))
            start += n
        return out


class DetrLoss:
    """The RT-DETR / D-FINE training loss (see the module docstring).

    Args:
        nc: number of classes of the model.
        vfl, l1, giou: gains of the varifocal, L1 and GIoU terms.
        alpha, gamma: the varifocal loss's negative weight and focusing power.
        matcher: the Hungarian matcher (default :class:`HungarianMatcher` with its defaults).
    """

    def __init__(self, nc: int, *, vfl: float = 1.0, l1: float = 5.0, giou: float = 2.0, fgl: float = 0.15,
                 alpha: float = 0.75, gamma: float = 2.0, matcher: HungarianMatcher | None = None) -> None:
        self.nc = nc
        self.columns: tuple[int, ...] | None = None  # class -> logit column, where they differ
        self.gains = (vfl, l1, giou, fgl)
        self.alpha, self.gamma = alpha, gamma
        self.matcher = matcher or HungarianMatcher()

    def __call__(self, out: dict, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Loss of one batch.

        Args:
            out: the family's ``train_decode`` output.
            targets: (M, 6) rows ``[image index, class, x1, y1, x2, y2]`` in input pixels.

        Returns:
            (loss, items): ``loss`` is ``(vfl + l1 + giou [+ fgl]) * B`` with each term gain-weighted and
            summed over all heads (the batch factor as in the yolo9 loss, so the trainer's accumulation
            treats families alike); ``items`` the detached terms [vfl, l1, giou], plus fgl when ``out``
            carries edge distributions (D-FINE). Computed in float32.
        """
        self._check(out)
        device = out["pred_logits"].device
        with torch.autocast(device_type=device.type, enabled=False):
            return self._loss(out, targets.to(device=device, dtype=torch.float32))

    def _loss(self, out: dict, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pred_logits, pred_boxes = out["pred_logits"].float(), out["pred_boxes"].float()
        b = pred_logits.shape[1]
        gt = self._columns(split_targets(targets, b, out["image_size"]))
        groups_q = int(out.get("query_groups", 1))  # Group-DETR: every box is matched once per query group
        num_boxes = max(sum(len(lab) for lab, _ in gt), 1) * groups_q
        fgl = "pred_corners" in out
        total = pred_logits.new_zeros(4)
        for i, (logits, boxes) in enumerate(zip(pred_logits, pred_boxes, strict=True)):
            pairs = self._pairs(self.matcher(logits, boxes, gt, groups_q), gt, logits.device)
            total = total + self._terms(logits, boxes, pairs, num_boxes)
            if fgl and (k := self._corner_index(out, "pred", i)) is not None:
                total[3:] += self._fgl(out["pred_corners"][k], boxes, out["ref_initial"], pairs, out, num_boxes)
        enc_logits, enc_boxes = out["enc_logits"].float(), out["enc_boxes"].float()
        enc_match = self.matcher(enc_logits, enc_boxes, gt, groups_q)
        total = total + self._terms(enc_logits, enc_boxes, self._pairs(enc_match, gt, enc_logits.device), num_boxes)
        groups = int(out["dn_groups"])
        if groups and out["dn_logits"].shape[2]:
            pairs = self._pairs(self._dn_match(gt, int(out["dn_group_size"]), groups), gt, pred_logits.device)
            norm = num_boxes * groups
            for i, (logits, boxes) in enumerate(zip(out["dn_logits"].float(), out["dn_boxes"].float(), strict=True)):
                total = total + self._terms(logits, boxes, pairs, norm)
                if fgl and (k := self._corner_index(out, "dn", i)) is not None:
                    total[3:] += self._fgl(out["dn_corners"][k], boxes, out["dn_ref_initial"], pairs, out, norm)
        items = total * total.new_tensor(self.gains)
        if not fgl:
            items = items[:3]
        return items.sum() * b, items.detach()

    def _columns(self, gt: GroundTruth) -> GroundTruth:
        """Ground truth with each class replaced by its logit column (the same unless the loss was
        built with ``columns``, e.g. a COCO head with one column per category id)."""
        if self.columns is None:
            return gt
        table = torch.as_tensor(self.columns, dtype=torch.long)
        return [(table[labels.cpu()].to(labels.device), boxes) for labels, boxes in gt]

    @staticmethod
    def _corner_index(out: dict, prefix: str, head: int) -> int | None:
        """The edge distributions belong to the last heads (D-FINE: all but its pre-box head)."""
        k = head - (out[f"{prefix}_logits"].shape[0] - out[f"{prefix}_corners"].shape[0])
        return k if k >= 0 else None

    @staticmethod
    def _dn_match(gt: GroundTruth, group_size: int, groups: int) -> Match:
        """Denoising targets: in group g, the positive query g * 2 * group_size + j is box j."""
        out = []
        for labels, _ in gt:
            j = torch.arange(len(labels)).repeat(groups)
            g = torch.arange(groups).repeat_interleave(len(labels))
            out.append((g * 2 * group_size + j, j))
        return out

    @staticmethod
    def _pairs(match: Match, gt: GroundTruth, device: torch.device) -> tuple[torch.Tensor, ...]:
        """Matched pairs flattened over the batch: image (K,), query (K,), label (K,), box (K, 4)."""
        img = torch.cat([torch.full_like(q, i) for i, (q, _) in enumerate(match)]).to(device)
        query = torch.cat([q for q, _ in match]).to(device)
        labels = torch.cat([lab[j.to(lab.device)] for (_, j), (lab, _) in zip(match, gt, strict=True)]).to(device)
        boxes = torch.cat([box[j.to(box.device)] for (_, j), (_, box) in zip(match, gt, strict=True)]).to(device)
        return img, query, labels, boxes.float()

    def _terms(self, logits: torch.Tensor, boxes: torch.Tensor, pairs: tuple[torch.Tensor, ...],
               norm: float) -> torch.Tensor:
        """[varifocal, L1, 1 - GIoU, 0] of one head, (B, Q, nc) and (B, Q, 4), each summed and divided by ``norm``."""
        img, query, gt_labels, gt_boxes = pairs
        target = torch.zeros_like(logits)
        positive = torch.zeros_like(logits, dtype=torch.bool)
        if query.numel():
            pred = boxes[img, query]
            giou = generalized_box_iou(cxcywh_to_xyxy(pred), cxcywh_to_xyxy(gt_boxes))
            iou, _ = _iou_union(cxcywh_to_xyxy(pred.detach()), cxcywh_to_xyxy(gt_boxes), pairwise=False)
            target[img, query, gt_labels] = iou.clamp(min=0).to(target.dtype)
            positive[img, query, gt_labels] = True
            l1 = (pred - gt_boxes).abs().sum() / norm
            giou_loss = (1 - giou).sum() / norm
        else:  # no boxes: zero box terms that stay attached (every parameter gets a gradient, as DDP needs)
            l1 = boxes.sum() * 0.0
            giou_loss = l1.clone()
        cls = self._class_term(logits, target, positive) / norm
        return torch.stack((cls, l1, giou_loss, torch.zeros_like(cls)))

    def _class_term(self, logits: torch.Tensor, target: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
        """Varifocal loss, summed: BCE towards ``target`` (the matched box's IoU at its class, else 0),
        positives weighted by their target, negatives by ``alpha * p ** gamma``."""
        p = torch.sigmoid(logits).detach()
        weight = torch.where(positive, target, self.alpha * p ** self.gamma)
        return F.binary_cross_entropy_with_logits(logits, target, weight=weight, reduction="sum")

    @staticmethod
    def _fgl(corners: torch.Tensor, boxes: torch.Tensor, initial: torch.Tensor, pairs: tuple[torch.Tensor, ...],
             out: dict, norm: float) -> torch.Tensor:
        """D-FINE's fine-grained localisation loss of one layer: each matched edge distribution
        (B, Q, 4 * (reg_max + 1)) is pulled towards the two bins around the true edge distance from
        the initial box (B, Q, 4), weighted by closeness, then by the IoU of the layer's box (B, Q, 4)
        with its target; summed over edges and divided by ``norm``. Returns a (1,) tensor."""
        img, query, _, gt_boxes = pairs
        if not query.numel():
            return corners.sum().reshape(1) * 0.0
        bins = out["corner_bins"].detach().float()
        logits = corners[img, query].float().reshape(-1, bins.shape[0])  # (K * 4, reg_max + 1)
        start = initial[img, query].detach().float()
        distance = edge_distances(start, cxcywh_to_xyxy(gt_boxes), out["reg_scale"].detach().float())
        left, w_left = bin_interpolation(distance.reshape(-1), bins)
        ce_left = F.cross_entropy(logits, left, reduction="none")
        ce_right = F.cross_entropy(logits, left + 1, reduction="none")
        iou, _ = _iou_union(cxcywh_to_xyxy(boxes[img, query].detach()), cxcywh_to_xyxy(gt_boxes), pairwise=False)
        loss = (ce_left * w_left + ce_right * (1 - w_left)) * iou.clamp(min=0).repeat_interleave(4)
        return (loss.sum() / norm).reshape(1)

    def _check(self, out: dict) -> None:
        need = ("pred_logits", "pred_boxes", "enc_logits", "enc_boxes", "dn_logits", "dn_boxes", "dn_groups",
                "dn_group_size", "image_size")  # dn_* empty / 0 without denoising
        if not isinstance(out, dict) or any(k not in out for k in need):
            got = sorted(out) if isinstance(out, dict) else type(out).__name__
            raise ArgumentError(f"DetrLoss: expected the dict a DETR family's train_decode returns (keys {need}), "
                                f"got {got}")
        if out["pred_logits"].ndim != 4 or out["pred_logits"].shape[-1] != self.nc:
            raise ArgumentError(f"DetrLoss: pred_logits have shape {tuple(out['pred_logits'].shape)}, expected "
                                f"(layers, B, Q, {self.nc}); is the loss built with the model's number of classes?")


class MalLoss(DetrLoss):
    """DEIM's training loss: :class:`DetrLoss` with the matchability-aware loss (MAL) as its class
    term. A matched query's target at its class is ``IoU ** gamma`` with weight 1; every other
    (query, class) is pushed to 0 with weight ``p ** gamma`` (no ``alpha``, as the reference's
    criterion is configured: ``mal_alpha`` unset, ``gamma`` 1.5). Its first item is ``mal``; the
    other terms and gains are D-FINE's (L1 5, GIoU 2, FGL 0.15; MAL 1)."""

    def __init__(self, nc: int, *, mal: float = 1.0, l1: float = 5.0, giou: float = 2.0, fgl: float = 0.15,
                 gamma: float = 1.5, matcher: HungarianMatcher | None = None) -> None:
        super().__init__(nc, vfl=mal, l1=l1, giou=giou, fgl=fgl, gamma=gamma, matcher=matcher)

    def _class_term(self, logits: torch.Tensor, target: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
        p = torch.sigmoid(logits).detach()
        weight = torch.where(positive, torch.ones_like(p), p ** self.gamma)
        return F.binary_cross_entropy_with_logits(logits, target ** self.gamma, weight=weight, reduction="sum")


class IaBceLoss(DetrLoss):
    """The LW-DETR line's training loss (RF-DETR, LW-DETR): :class:`DetrLoss`'s matching and box
    terms over Group-DETR query groups (``query_groups`` in the outputs: each group is matched to
    the boxes on its own and the terms are normalised by ``boxes * groups``), every decoder layer
    and the encoder selection, no denoising, with the IoU-aware BCE (IA-BCE) as the class term.

    IA-BCE: a matched (query, class) is pulled to ``t = max(p ** alpha * IoU ** (1 - alpha), 0.01)``
    (``p`` and the IoU detached) with weight 1; every other (query, class) is pushed to 0 with weight
    ``p ** gamma``, where ``p`` keeps its gradient (as the reference's criterion computes it). alpha
    0.25, gamma 2; gains class 1, L1 5, GIoU 2 (the reference's coefficients). Its first item is
    ``ia_bce``.

    Args:
        nc: classes (targets are 0..nc-1).
        head: logit columns of the network when wider than ``nc`` (RF-DETR: ``nc + 1``, the last
            column is never a target and learns to stay low).
        columns: class -> logit column where the head is laid out otherwise (LW-DETR's COCO head:
            one column per COCO category id).
    """

    def __init__(self, nc: int, *, head: int | None = None, columns: tuple[int, ...] | None = None,
                 cls: float = 1.0, l1: float = 5.0, giou: float = 2.0, alpha: float = 0.25, gamma: float = 2.0,
                 matcher: HungarianMatcher | None = None) -> None:
        width = nc if head is None else int(head)
        if width < nc or (columns is not None and (len(columns) != nc or max(columns) >= width)):
            raise ArgumentError(f"IaBceLoss: a {width}-column head cannot hold {nc} classes"
                                + (f" at columns {columns}" if columns is not None else ""))
        super().__init__(width, vfl=cls, l1=l1, giou=giou, fgl=0.0, alpha=alpha, gamma=gamma, matcher=matcher)
        self.classes = nc
        self.columns = tuple(columns) if columns is not None else None

    def _class_term(self, logits: torch.Tensor, target: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
        p = torch.sigmoid(logits)
        t = (p.detach() ** self.alpha * target ** (1 - self.alpha)).clamp(min=0.01)
        pos_w = torch.where(positive, t, torch.zeros_like(t))
        neg_w = torch.where(positive, 1 - t, p ** self.gamma)
        # -pos_w * log(p) - neg_w * log(1 - p), with log(1 - p) = log(p) - x
        return (neg_w * logits - F.logsigmoid(logits) * (pos_w + neg_w)).sum()
