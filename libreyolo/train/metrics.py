"""Validation metrics: COCO box mAP for detectors, top-1/top-5 accuracy for classifiers.

The AP numbers are not computed here: :class:`DetectionMetrics` builds the COCO ground-truth and
result structures in memory and hands them to faster-coco-eval (or, without it, pycocotools), so
the figures are the ones every paper and leaderboard reports. Only the single precision/recall
operating point, which COCO does not give, is computed in this file.
"""
from __future__ import annotations

import contextlib
import io
from typing import Any

import numpy as np
import torch

from libreyolo.errors import ArgumentError, MissingDependencyError
from libreyolo.ops.boxes import box_iou

_EXTRA_HINT = "pip install 'libreyolo[train]'"


def coco_backend() -> tuple[str, Any, Any]:
    """(name, COCO class, COCOeval class) of the first installed COCO evaluator."""
    try:
        from faster_coco_eval import COCO, COCOeval_faster

        return "faster_coco_eval", COCO, COCOeval_faster
    except ImportError:
        pass
    try:
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval

        return "pycocotools", COCO, COCOeval
    except ImportError:
        pass
    raise MissingDependencyError(
        "computing mAP needs the optional package 'faster-coco-eval' (or 'pycocotools'), which is not installed: "
        f"{_EXTRA_HINT}"
    )


def _as_numpy(value: Any, name: str, box: bool, integer: bool = False) -> np.ndarray:
    """One image's boxes (n, 4) or per-box values (n,) as a float64 (or int64) array."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
    array = np.asarray(value, dtype=np.int64 if integer else np.float64)
    if array.size == 0:
        return array.reshape((0, 4) if box else (0,))
    if array.ndim != (2 if box else 1) or (box and array.shape[1] != 4):
        raise ArgumentError(f"'{name}' must have shape {'(n, 4)' if box else '(n,)'}, got {tuple(array.shape)}")
    return array


def _match_at_iou(pred_xyxy: np.ndarray, pred_cls: np.ndarray, pred_conf: np.ndarray,
                  gt_xyxy: np.ndarray, gt_cls: np.ndarray, iou: float) -> np.ndarray:
    """True-positive flags of one image's predictions, COCO-style greedy matching at one IoU threshold:
    predictions in descending confidence each take the best still-unmatched ground truth of their class."""
    tp = np.zeros(len(pred_cls), dtype=bool)
    if len(pred_cls) == 0 or len(gt_cls) == 0:
        return tp
    ious = box_iou(torch.from_numpy(pred_xyxy), torch.from_numpy(gt_xyxy)).numpy()
    ious[pred_cls[:, None] != gt_cls[None, :]] = -1.0
    candidates = np.flatnonzero(ious.max(1) >= iou)  # the others cannot match anything
    taken = np.zeros(len(gt_cls), dtype=bool)
    for i in candidates[np.argsort(-pred_conf[candidates], kind="stable")]:
        row = np.where(taken, -1.0, ious[i])
        j = int(row.argmax())
        if row[j] >= iou:
            tp[i] = True
            taken[j] = True
            if taken.all():
                break
    return tp


def _best_f1_precision_recall(tp: np.ndarray, conf: np.ndarray, pred_cls: np.ndarray,
                              gt_cls: np.ndarray) -> tuple[float, float]:
    """Class-mean precision and recall at the confidence threshold that maximises the class-mean F1.

    Per class (classes with at least one ground truth), precision and recall are traced as functions of
    the confidence threshold on a 1000-point grid in [0, 1]; the threshold with the best mean F1 is
    chosen once for all classes (the convention of the YOLO trainers)."""
    classes, counts = np.unique(gt_cls, return_counts=True)
    if len(classes) == 0:
        return 0.0, 0.0
    grid = np.linspace(0.0, 1.0, 1000)
    precision = np.zeros((len(classes), grid.size))
    recall = np.zeros((len(classes), grid.size))
    order = np.argsort(-conf, kind="stable")
    tp, conf, pred_cls = tp[order], conf[order], pred_cls[order]
    for k, (c, n_gt) in enumerate(zip(classes, counts, strict=True)):
        mine = pred_cls == c
        if not mine.any():
            continue
        tpc = np.cumsum(tp[mine])
        fpc = np.cumsum(~tp[mine])
        # np.interp needs increasing x: confidences are descending, so interpolate on their negatives
        recall[k] = np.interp(-grid, -conf[mine], tpc / n_gt, left=0.0)
        precision[k] = np.interp(-grid, -conf[mine], tpc / (tpc + fpc), left=1.0)
    f1 = 2 * precision * recall / np.maximum(precision + recall, 1e-16)
    best = int(f1.mean(0).argmax())
    return float(precision[:, best].mean()), float(recall[:, best].mean())


class DetectionMetrics:
    """COCO box metrics over a validation set, fed one batch at a time.

    ``update(preds, gts)`` takes, per image and in the same order, a prediction dict
    ``{"xyxy": (n, 4), "conf": (n,), "cls": (n,)}`` and a ground-truth dict ``{"xyxy": (m, 4), "cls": (m,)}``,
    boxes in original-image pixels. ``compute()`` returns:

    - ``"mAP50-95"`` and ``"mAP50"``: COCO's bbox AP (101-point interpolation, at most 100 detections per image,
      area range "all"), i.e. ``stats[0]`` and ``stats[1]`` of faster-coco-eval, or pycocotools when
      faster-coco-eval is not installed. Categories are the class ids + 1; classes without ground truth are
      left out of the mean, as COCO does.
    - ``"precision"`` and ``"recall"``: class means at IoU 0.5, at the single confidence threshold that maximises
      the class-mean F1 (COCO does not report such an operating point; it is computed here from all
      predictions, not only the top 100).
    - ``"images"`` and ``"instances"``: how many images and ground-truth boxes were evaluated. Images with
      neither ground truth nor predictions count; images with predictions and no ground truth add false positives.

    After ``compute()``, ``ap_per_class`` maps each class name with ground truth to its AP50-95.
    No predictions at all give zeros (not an error).
    """

    def __init__(self, names: dict[int, str]) -> None:
        self.names = {int(k): str(v) for k, v in dict(names).items()}
        self.ap_per_class: dict[str, float] = {}
        self.reset()

    def reset(self) -> None:
        self._preds: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._gts: list[tuple[np.ndarray, np.ndarray]] = []

    def update(self, preds: list[dict], gts: list[dict]) -> None:
        """Add a batch: one prediction dict and one ground-truth dict per image, in the same order."""
        if len(preds) != len(gts):
            raise ArgumentError(f"update() needs one prediction dict per ground-truth dict, got {len(preds)} "
                                f"predictions for {len(gts)} images")
        for pred, gt in zip(preds, gts, strict=True):
            p_xyxy = _as_numpy(pred["xyxy"], "preds[i]['xyxy']", box=True)
            p_conf = _as_numpy(pred["conf"], "preds[i]['conf']", box=False)
            p_cls = _as_numpy(pred["cls"], "preds[i]['cls']", box=False, integer=True)
            g_xyxy = _as_numpy(gt["xyxy"], "gts[i]['xyxy']", box=True)
            g_cls = _as_numpy(gt["cls"], "gts[i]['cls']", box=False, integer=True)
            if not len(p_xyxy) == len(p_conf) == len(p_cls):
                raise ArgumentError(f"a prediction dict has {len(p_xyxy)} boxes, {len(p_conf)} scores and "
                                    f"{len(p_cls)} classes; they must be equal")
            if len(g_xyxy) != len(g_cls):
                raise ArgumentError(f"a ground-truth dict has {len(g_xyxy)} boxes and {len(g_cls)} classes; "
                                    "they must be equal")
            self._preds.append((p_xyxy, p_conf, p_cls))
            self._gts.append((g_xyxy, g_cls))

    def coco_structures(self) -> tuple[dict, list[dict]]:
        """The accumulated data as a COCO ground-truth dataset dict and a COCO result list (ids are 1-based;
        category id = class id + 1; bbox = [x, y, w, h]; area = w * h; iscrowd = 0)."""
        class_ids = set(self.names)
        for _, g_cls in self._gts:
            class_ids.update(int(c) for c in g_cls)
        images, annotations, results = [], [], []
        for index, ((g_xyxy, g_cls), (p_xyxy, p_conf, p_cls)) in enumerate(zip(self._gts, self._preds, strict=True)):
            image_id = index + 1
            images.append({"id": image_id})
            g_wh = g_xyxy[:, 2:] - g_xyxy[:, :2]
            for (x, y), (w, h), c in zip(g_xyxy[:, :2].tolist(), g_wh.tolist(), g_cls.tolist(), strict=True):
                annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": c + 1,
                                    "bbox": [x, y, w, h], "area": w * h, "iscrowd": 0})
            p_xywh = np.concatenate([p_xyxy[:, :2], p_xyxy[:, 2:] - p_xyxy[:, :2]], 1)
            results.extend({"image_id": image_id, "category_id": c + 1, "score": score, "bbox": box}
                           for box, score, c in zip(p_xywh.tolist(), p_conf.tolist(), p_cls.tolist(), strict=True))
        categories = [{"id": c + 1, "name": self.names.get(c, str(c))} for c in sorted(class_ids)]
        return {"images": images, "annotations": annotations, "categories": categories}, results

    def _coco_eval(self, dataset: dict, results: list[dict]) -> tuple[np.ndarray, dict[int, float]]:
        """COCO stats and per-category AP50-95 from the installed evaluator."""
        backend, coco_cls, eval_cls = coco_backend()
        sink = io.StringIO()  # pycocotools prints progress to stdout; a library must not
        with contextlib.redirect_stdout(sink):
            if backend == "faster_coco_eval":
                gt = coco_cls(dataset)
            else:
                gt = coco_cls()
                gt.dataset = dataset
                gt.createIndex()
            dt = gt.loadRes(results)
            evaluator = eval_cls(gt, dt, iouType="bbox")
            evaluator.params.imgIds = [image["id"] for image in dataset["images"]]
            evaluator.evaluate()
            evaluator.accumulate()
            evaluator.summarize()
        # precision: [iou thresholds, recall points, categories, area ranges, max dets]; -1 = no ground truth
        precision = np.asarray(evaluator.eval["precision"])[:, :, :, 0, -1]
        per_category = {}
        for k, cat_id in enumerate(evaluator.params.catIds):
            values = precision[:, :, k]
            values = values[values > -1]
            if values.size:
                per_category[int(cat_id)] = float(values.mean())
        return np.asarray(evaluator.stats, dtype=np.float64), per_category

    def compute(self) -> dict[str, float | int]:
        """The metrics over everything passed to ``update`` so far (see the class docstring)."""
        instances = int(sum(len(g_cls) for _, g_cls in self._gts))
        out: dict[str, float | int] = {"mAP50-95": 0.0, "mAP50": 0.0, "precision": 0.0, "recall": 0.0,
                                       "images": len(self._gts), "instances": instances}
        self.ap_per_class = {}
        n_preds = sum(len(p_cls) for _, _, p_cls in self._preds)
        if n_preds == 0 or instances == 0:
            coco_backend()  # a missing evaluator is reported even when the answer is trivially zero
            return out
        dataset, results = self.coco_structures()
        stats, per_category = self._coco_eval(dataset, results)
        out["mAP50-95"] = max(float(stats[0]), 0.0)  # COCO reports -1 when nothing could be evaluated
        out["mAP50"] = max(float(stats[1]), 0.0)
        self.ap_per_class = {self.names.get(cat - 1, str(cat - 1)): ap for cat, ap in per_category.items()}

        tp = np.concatenate([_match_at_iou(p_xyxy, p_cls, p_conf, g_xyxy, g_cls, 0.5)
                             for (p_xyxy, p_conf, p_cls), (g_xyxy, g_cls) in zip(self._preds, self._gts, strict=True)])
        conf = np.concatenate([p_conf for _, p_conf, _ in self._preds])
        pred_cls = np.concatenate([p_cls for _, _, p_cls in self._preds])
        gt_cls = np.concatenate([g_cls for _, g_cls in self._gts])
        out["precision"], out["recall"] = _best_f1_precision_recall(tp, conf, pred_cls, gt_cls)
        return out


class ClassifyMetrics:
    """Top-1 and top-k accuracy (k = min(5, number of classes)) as fractions in [0, 1].

    ``compute()`` returns ``{"top1": ..., "top5": ...}``; the "top5" key keeps its name when there are fewer
    than five classes (it is then top-C accuracy, i.e. 1.0). No samples give zeros.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.samples = 0
        self._top1 = 0
        self._top5 = 0

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Add a batch of logits (B, C) and integer labels (B,)."""
        logits = torch.as_tensor(logits).detach()
        labels = torch.as_tensor(labels).detach().to(logits.device).long().reshape(-1)
        if logits.ndim != 2 or logits.shape[0] != labels.shape[0]:
            raise ArgumentError(f"ClassifyMetrics.update needs logits (B, C) and labels (B,), got "
                                f"{tuple(logits.shape)} and {tuple(labels.shape)}")
        if logits.shape[0] == 0:
            return
        k = min(5, logits.shape[1])
        top = logits.topk(k, dim=1).indices
        hits = top == labels[:, None]
        self._top1 += int(hits[:, 0].sum())
        self._top5 += int(hits.any(dim=1).sum())
        self.samples += int(labels.shape[0])

    def compute(self) -> dict[str, float]:
        if self.samples == 0:
            return {"top1": 0.0, "top5": 0.0}
        return {"top1": self._top1 / self.samples, "top5": self._top5 / self.samples}
