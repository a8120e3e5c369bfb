"""Semantic-segmentation metrics: mean IoU, pixel accuracy and mean class accuracy.

One ``(nc, nc)`` confusion matrix (rows: ground truth, columns: prediction) is accumulated with
``torch.bincount`` on the tensors' own device; pixels whose ground truth is the ignore value are
left out. The means follow mmsegmentation's ``IoUMetric`` (a NaN-mean over classes): a class
counts in mIoU when it appears in the ground truth or the predictions (union > 0), and in mAcc
when it appears in the ground truth. Classes that appear nowhere are left out, not scored 0.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from libreyolo.errors import ArgumentError


def _pairs(pred: torch.Tensor | Sequence[torch.Tensor], gt: torch.Tensor | Sequence[torch.Tensor]
           ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Matching (prediction, ground truth) class maps of any shape, from tensors or lists of them."""
    if isinstance(pred, torch.Tensor) and isinstance(gt, torch.Tensor):
        pairs = [(pred, gt)]
    else:
        pred, gt = list(pred), list(gt)
        if len(pred) != len(gt):
            raise ArgumentError(f"update() needs one predicted mask per ground-truth mask, got {len(pred)} "
                                f"predictions for {len(gt)} masks")
        pairs = [(torch.as_tensor(p), torch.as_tensor(g)) for p, g in zip(pred, gt, strict=True)]
    for p, g in pairs:
        if p.shape != g.shape:
            raise ArgumentError(f"a predicted mask has shape {tuple(p.shape)} but its ground truth "
                                f"{tuple(g.shape)}; resize the prediction to the mask first")
        if p.is_floating_point() or g.is_floating_point():
            raise ArgumentError(f"masks must hold integer class ids, got {p.dtype} and {g.dtype} "
                                "(pass logits.argmax(1), not logits)")
    return pairs


class SemanticMetrics:
    """mIoU, pixel accuracy and mean class accuracy over a validation set, fed batch by batch.

    ``update(pred_masks, gt_masks)`` takes class-id maps: two tensors of the same shape
    (``(B, H, W)`` or ``(H, W)``) or two lists of them, one pair per image (sizes may differ
    between images). ``compute()`` returns fractions in [0, 1]:

    - ``"mIoU"``: mean over classes with union > 0 of TP / (TP + FP + FN);
    - ``"pixel_acc"``: correctly classified pixels / non-ignored pixels;
    - ``"mAcc"``: mean over classes present in the ground truth of TP / (TP + FN).

    After ``compute()``, ``iou_per_class`` maps the name (or id) of each counted class to its IoU.
    No pixels give zeros.
    """

    def __init__(self, nc: int, ignore_index: int = 255, names: dict[int, str] | None = None) -> None:
        if int(nc) < 1:
            raise ArgumentError(f"SemanticMetrics needs nc >= 1 classes, got {nc}")
        self.nc = int(nc)
        self.ignore_index = int(ignore_index)
        self.names = {int(k): str(v) for k, v in (names or {}).items()}
        self.iou_per_class: dict[str | int, float] = {}
        self.reset()

    def reset(self) -> None:
        self.confusion: torch.Tensor | None = None  # (nc, nc) int64, on the device of the first update

    def update(self, pred_masks: torch.Tensor | Sequence[torch.Tensor],
               gt_masks: torch.Tensor | Sequence[torch.Tensor]) -> None:
        """Add predicted and ground-truth class maps (see the class docstring)."""
        nc = self.nc
        for pred, gt in _pairs(pred_masks, gt_masks):
            device = self.confusion.device if self.confusion is not None else gt.device
            pred, gt = pred.detach().to(device).reshape(-1).long(), gt.detach().to(device).reshape(-1).long()
            valid = gt != self.ignore_index
            pred, gt = pred[valid], gt[valid]
            if gt.numel() == 0:
                if self.confusion is None:
                    self.confusion = torch.zeros((nc, nc), dtype=torch.int64, device=device)
                continue
            for what, values in (("ground-truth", gt), ("predicted", pred)):
                lo, hi = int(values.min()), int(values.max())
                if lo < 0 or hi >= nc:
                    bad = lo if lo < 0 else hi
                    raise ArgumentError(f"a {what} mask holds class id {bad}, outside 0..{nc - 1} (and not the "
                                        f"ignore value {self.ignore_index})")
            counts = torch.bincount(gt * nc + pred, minlength=nc * nc).reshape(nc, nc)
            self.confusion = counts if self.confusion is None else self.confusion + counts

    def compute(self) -> dict[str, float]:
        """The metrics over everything passed to ``update`` so far (see the class docstring)."""
        self.iou_per_class = {}
        if self.confusion is None or int(self.confusion.sum()) == 0:
            return {"mIoU": 0.0, "pixel_acc": 0.0, "mAcc": 0.0}
        cm = self.confusion.detach().cpu().double()
        tp = cm.diag()
        gt_count, pred_count = cm.sum(1), cm.sum(0)
        union = gt_count + pred_count - tp
        counted = union > 0
        iou = tp[counted] / union[counted]
        present = gt_count > 0
        self.iou_per_class = {self.names.get(c, c): float(v)
                              for c, v in zip(counted.nonzero().flatten().tolist(), iou.tolist(), strict=True)}
        return {"mIoU": float(iou.mean()), "pixel_acc": float(tp.sum() / cm.sum()),
                "mAcc": float((tp[present] / gt_count[present]).mean())}
