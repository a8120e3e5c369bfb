"""The ``detect`` task: boxes, classes and scores (``Results.boxes``), mAP for training and val.

Families: yolo9, yolox (dense predictions, NMS), rtdetr, dfine (set predictions, top-k). Their
postprocess returns ``{"xyxy": (N, 4), "conf": (N,), "cls": (N,)}`` per image in original-image
pixels; decoded outputs are compared as matched detection sets
(:func:`libreyolo.comparison.matching.match_detections`).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from libreyolo.errors import ExportError
from libreyolo.options import MAX_DET, MAX_NMS, Opt, as_ids, fraction
from libreyolo.tasks import register_task
from libreyolo.tasks.base import PROBE_IMAGES, Task, TaskOptions

if TYPE_CHECKING:  # torch loads on first use, so the CLI reads its options without it
    import torch

# export validation compares detections above this confidence (lowered for a model that scores few
# boxes above it on the sample image: :func:`detection_conf`)
VALIDATION_CONF = 0.25

DETECT_OPTIONS: dict[str, Opt] = {
    "conf": fraction(0.25, "confidence threshold"),
    "iou": fraction(0.45, "NMS IoU threshold"),
    "max_det": Opt(int, 300, "maximum detections per image", min=1, max=MAX_DET),
    "max_nms": Opt(int, None, "candidates per image entering NMS (default 30000)", min=1, max=MAX_NMS),
    "classes": Opt(as_ids, None, "keep only these class ids, e.g. 0,2"),
}


@register_task
class Detect(Task):
    name = "detect"
    payload = "boxes"
    trackable = True  # libreyolo.track follows Results.boxes
    options = DETECT_OPTIONS
    metric = "mAP50-95"
    decoded_match = "libreyolo.comparison.matching:match_detections"
    data_help = "a dataset YAML (path, train, val, names; YOLO .txt labels)"
    what = "detections"

    def make_payload(self, pred: dict[str, torch.Tensor], orig_shape: tuple[int, int]) -> Any:
        from libreyolo.results import Boxes

        return Boxes(pred["xyxy"], pred["conf"], pred["cls"], orig_shape)

    def decoded(self, payload: Any) -> dict[str, torch.Tensor]:
        return {"xyxy": payload.xyxy, "conf": payload.conf, "cls": payload.cls}

    def export_validation_options(self, embedded: dict[str, Any] | None) -> TaskOptions:
        """``conf`` VALIDATION_CONF (or the embedded NMS's, where higher), the embedded NMS's ``iou`` and
        ``max_det`` (else predict's defaults)."""
        if embedded:
            return self.predict_options({"conf": max(VALIDATION_CONF, embedded["conf"]), "iou": embedded["iou"],
                                         "max_det": embedded["max_det"]})
        return self.predict_options({"conf": VALIDATION_CONF, "iou": 0.45, "max_det": 300})

    def validation_options(self, model: Any, sample: torch.Tensor, metas: list, opts: Any) -> TaskOptions:
        conf = detection_conf(model, sample, metas, opts.conf)
        return self.predict_options({"conf": conf, "iou": opts.iou, "max_det": opts.max_det})

    def validation_note(self, opts: Any) -> str | None:
        if opts.conf < VALIDATION_CONF:
            return (f"the eager model scores few boxes above {VALIDATION_CONF} on the sample image "
                    f"(e.g. untrained weights), so detections are compared at conf={opts.conf:.3g}")
        return None

    def match_options(self, opts: Any) -> dict[str, Any]:
        return {"conf": opts.conf, "max_det": opts.max_det, "nms_iou": opts.iou}

    # --- training and val ------------------------------------------------------------------
    def claims_data(self, data: Any) -> str | None:
        from libreyolo.train.data import load_data_yaml
        from libreyolo.train.labels import label_path

        probe = load_data_yaml(data).val[:PROBE_IMAGES]
        n = sum(label_path(p).is_file() for p in probe)
        return f"{n} of its first {len(probe)} val images have YOLO .txt labels" if n else None

    def load_data(self, data: Any) -> Any:
        from libreyolo.train.data import load_data_yaml

        self.check_data_arg(data)
        return load_data_yaml(data)

    def require_extras(self, *, validating: bool = True) -> None:
        from libreyolo.errors import require

        require("cv2", "train", "detection training and validation (image resizing and augmentation)")
        if validating:
            from libreyolo.train.metrics import coco_backend

            coco_backend()  # faster-coco-eval or pycocotools, for mAP

    def train_dataset(self, model: Any, cfg: Any, imgsz: int, args: Any) -> tuple[Any, Any]:
        from libreyolo.train import data as D

        hyp = D.AugmentConfig(**{k: getattr(args, k) for k in (
            "mosaic", "close_mosaic", "degrees", "translate", "scale", "shear", "fliplr", "flipud", "hsv_h",
            "hsv_s", "hsv_v")})
        return D.DetectionDataset(cfg.train, cfg.names, imgsz, augment=True, hyp=hyp), D.collate_detect

    def val_dataset(self, model: Any, cfg: Any, imgsz: int) -> tuple[Any, Any]:
        from libreyolo.train import data as D

        return D.DetectionDataset(cfg.val, cfg.names, imgsz, augment=False), D.collate_detect

    def metrics(self, model: Any) -> Any:
        from libreyolo.train.metrics import DetectionMetrics

        return DetectionMetrics(model.names)

    def score_batch(self, model: Any, metrics: Any, named: dict[str, torch.Tensor], batch: Any,
                    opts: TaskOptions) -> None:
        from libreyolo.ops.letterbox import LetterboxMeta

        targets, infos = batch[1], batch[2]
        metas = [LetterboxMeta(tuple(info["orig_shape"]), float(info["ratio"]), tuple(info["pad"])) for info in infos]
        preds = model.family.postprocess(named, metas, opts.replace(classes=None))
        gts = []
        for j, meta in enumerate(metas):
            rows = targets[targets[:, 0] == j]
            gts.append({"xyxy": meta.to_original(rows[:, 2:6].float()), "cls": rows[:, 1].long()})
        metrics.update([{k: v.cpu() for k, v in p.items()} for p in preds],
                       [{k: v.cpu() for k, v in g.items()} for g in gts])

    def fitness(self, metrics: Any) -> float | None:
        if "mAP50-95" not in metrics:
            return None
        return 0.9 * metrics["mAP50-95"] + 0.1 * metrics["mAP50"]

    def synthetic_batch(self, model: Any, batch: int, imgsz: int, generator: torch.Generator) -> torch.Tensor:
        import torch
        rows = []
        for j in range(batch):
            k = int(torch.randint(1, 4, (1,), generator=generator))
            xy = torch.rand(k, 2, generator=generator) * imgsz * 0.6
            wh = 16 + torch.rand(k, 2, generator=generator) * imgsz * 0.3
            cls = torch.randint(0, model.nc, (k, 1), generator=generator).float()
            rows.append(torch.cat([torch.full((k, 1), float(j)), cls, xy, (xy + wh).clamp(max=imgsz - 1)], 1))
        return torch.cat(rows)

    def synthetic_dataset(self, root: str | Path, **kw: Any) -> Path:
        from libreyolo.train.shapes import make_shapes_dataset

        return make_shapes_dataset(root, task="detect", **kw)


def detection_conf(model: Any, sample: torch.Tensor, metas: list, conf: float, wanted: int = 100) -> float:
    """``conf``, lowered when fewer than ``wanted`` (box, class) pairs of the sample pass it, so
    that the decoded-detection comparison always has detections to compare."""
    import torch

    family = model.family
    with torch.inference_mode():
        out = family.named_outputs(model.net(sample.to(model.device, next(model.net.parameters()).dtype)))
    if not all(bool(torch.isfinite(t).all()) for t in out.values() if t.is_floating_point()):
        raise ExportError("the eager model itself outputs NaN or Inf on the sample image (overflowing or broken "
                          "weights), so there is nothing valid to export or compare; nothing was written")
    name = family.export.nms_output()
    if name is None:
        # no candidate tensor to rank (a set predictor, e.g. DETR): step conf down until the
        # family's own postprocessing keeps enough detections
        for c in (conf, 0.1, 0.05, 0.02, 0.01, 0.005, 0.001):
            if c > conf:
                continue
            kept = family.postprocess(out, metas, conf=c, iou=0.45, max_det=300)
            if sum(int(k["conf"].numel()) for k in kept) >= min(wanted, 20):
                return c
        return c
    scores = out[name][:, 4:].float().flatten()
    if int((scores > conf).sum()) >= wanted or scores.numel() <= wanted:
        return conf
    return float(scores.topk(wanted).values[-1]) * 0.999
