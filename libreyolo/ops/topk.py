"""Top-k postprocessing, no NMS: set prediction (DETR line) and one-to-one dense heads.

Set prediction (:func:`topk_postprocess`):

Input: ``pred_logits`` (B, Q, nc) raw class logits and ``pred_boxes`` (B, Q, 4) boxes
(cx, cy, w, h) normalised to the network input. Per image: sigmoid scores, the ``max_det``
best (query, class) pairs over all Q x nc (one query may give several classes), keep those
above ``conf``, boxes to xyxy in source pixels. Boxes are not clipped to the image: the
reference pipelines return them as the network predicts them.

Two stages, as for the dense detectors (:mod:`libreyolo.ops.postprocess`), so that a CUDA graph
can hold the first: :func:`topk_padded` (fixed shapes, nothing read back: a padded
``(B, k, 6)`` tensor and ``counts``) and :func:`~libreyolo.ops.postprocess.read_detections`.
The eager postprocessing is the same two calls (:func:`topk_postprocess`), so the graphed and
the eager pipeline run one implementation.

One-to-one dense heads (:func:`one2one_postprocess`, e.g. YOLOv9-E2E): ``predictions``
(B, 4 + nc, N) as the NMS families lay them out (xyxy boxes in network-input pixels, then class
probabilities), but at most one prediction per object, so no NMS: per image the ``max_det``
anchors with the best class score, then the ``max_det`` best (anchor, class) pairs among them
(the same pairs as one top-k over all N x nc, in two cheaper steps), kept above ``conf``, boxes
out of the letterbox and clipped to the image (:func:`~libreyolo.ops.postprocess.source_boxes`,
as the NMS families do), boxes left with no area dropped. The same two stages: :func:`one2one_padded`
and the read-back.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from libreyolo.ops.postprocess import (
    pack_params,
    params_to,
    read_detections,
    read_detections_later,
    source_boxes,
    unpack_params,
)

_PARAM_HEAD = 1  # conf; then nc class switches, then 5 numbers per image (:func:`source_frame`)


def cxcywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    cx, cy, w, h = boxes.unbind(-1)
    return torch.stack((cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h), dim=-1)


def source_frame(meta: Any) -> tuple[float, float, float, float, float]:
    """``(left, top, ratio, in_w, in_h)``: a normalised coordinate ``x`` maps to source pixels as
    ``(x * in - offset) / ratio``.

    A stretch meta maps normalised coordinates straight to the source size (offset 0, ratio 1:
    exactly one multiplication). Any other meta (a letterbox) is read as: content of
    ``orig_shape * ratio`` placed at ``pad`` and padded by the same amount on the far side (true
    for centred placement and for unpadded inputs, such as the validator's plain probes), so
    boxes go to input pixels and then back.
    """
    h, w = meta.orig_shape
    if hasattr(meta, "normalized_to_original"):
        return 0.0, 0.0, 1.0, float(w), float(h)
    left, top = meta.pad
    ratio = meta.ratio
    return float(left), float(top), float(ratio), w * ratio + 2 * left, h * ratio + 2 * top


def pack_set_params(metas: Sequence[Any], *, conf: float, nc: int, classes: Sequence[int] | None = None,
                    device: torch.device | str | None = None) -> torch.Tensor:
    """Everything per call that is not a shape, as one float32 vector: ``conf``, one 0/1 switch
    per class (``classes``; ids outside ``0..nc-1`` are ignored), then each image's
    :func:`source_frame`. A CUDA graph takes it as an input (new thresholds, classes or image
    sizes need no recapture)."""
    wanted = None if classes is None else {int(c) for c in classes}
    switches = [1.0] * nc if wanted is None else [1.0 if c in wanted else 0.0 for c in range(nc)]
    frames = [v for m in metas for v in source_frame(m)]
    return params_to(torch.tensor([float(conf), *switches, *frames], dtype=torch.float32), device)


def topk_padded(logits: torch.Tensor, boxes: torch.Tensor, params: torch.Tensor, *,
                max_det: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Detections of a batch, padded: ``(B, k, 6)`` (x1, y1, x2, y2, score, class; zeros after the
    kept rows), ``k = min(max_det, Q * nc)``, and ``counts`` (B,) int64, on the device. Every shape
    is fixed by the inputs' and nothing is read back. ``params``: :func:`pack_set_params`."""
    logits, boxes = logits.float(), boxes.float()
    batch, queries, nc = logits.shape
    conf = params[0]
    allowed = params[_PARAM_HEAD:_PARAM_HEAD + nc] > 0.5
    left, top, ratio, in_w, in_h = params[_PARAM_HEAD + nc:].view(batch, 5, 1).unbind(1)
    scores = torch.sigmoid(logits).masked_fill(~allowed, -1.0)  # a class not asked for is never kept
    k = min(max_det, queries * nc)
    best, index = scores.flatten(1).topk(k, dim=1)
    query = torch.div(index, nc, rounding_mode="floor")
    label = index - query * nc
    xyxy = cxcywh_to_xyxy(boxes.gather(1, query.unsqueeze(2).expand(-1, -1, 4)))
    scale = torch.stack((in_w, in_h, in_w, in_h), -1)    # (B, 1, 4)
    offset = torch.stack((left, top, left, top), -1)
    xyxy = (xyxy * scale - offset) / ratio.unsqueeze(2)
    return _kept_first(xyxy, best, label, best > conf)


def _kept_first(xyxy: torch.Tensor, best: torch.Tensor, label: torch.Tensor,
                keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, k, 6)`` rows (x1, y1, x2, y2, score, class) with the ``keep`` ones first, in their
    (score) order, zeros after them, and ``counts`` (B,): fixed shapes, nothing read back."""
    # (a NaN score sorts first in topk and is not kept)
    order = (~keep).to(torch.uint8).sort(dim=1, stable=True).indices
    rows = torch.cat((xyxy, best.unsqueeze(2), label.to(torch.float32).unsqueeze(2)), 2)
    rows = rows.gather(1, order.unsqueeze(2).expand(-1, -1, 6))
    counts = keep.sum(1)
    filled = torch.arange(best.shape[1], device=best.device).unsqueeze(0) < counts.unsqueeze(1)
    return torch.where(filled.unsqueeze(2), rows, rows.new_zeros(())), counts


def topk_postprocess_later(logits: torch.Tensor, boxes: torch.Tensor, metas: Sequence[Any], *, conf: float,
                           max_det: int, classes: Sequence[int] | None = None
                           ) -> Callable[[], list[dict[str, torch.Tensor]]]:
    """:func:`topk_postprocess` enqueued now and read back by the returned call."""
    if len(metas) != logits.shape[0]:
        raise ValueError(f"{logits.shape[0]} predictions but {len(metas)} preprocessing metas")
    params = pack_set_params(metas, conf=conf, nc=logits.shape[-1], classes=classes, device=logits.device)
    return read_detections_later(*topk_padded(logits, boxes, params, max_det=max_det))


def topk_postprocess(logits: torch.Tensor, boxes: torch.Tensor, metas: Sequence[Any], *, conf: float,
                     max_det: int, classes: Sequence[int] | None = None) -> list[dict[str, torch.Tensor]]:
    """One dict per image: ``xyxy`` (K, 4) source pixels, ``conf`` (K,), ``cls`` (K,) float; best first.

    ``classes`` removes other classes before the top-k, so up to ``max_det`` detections of the
    wanted classes are returned.
    """
    return topk_postprocess_later(logits, boxes, metas, conf=conf, max_det=max_det, classes=classes)()


class SetPostprocess:
    """The device stage of :func:`topk_postprocess` as a family declares it (``Family.device_postprocess``,
    the same interface as :class:`~libreyolo.ops.postprocess.DetectPostprocess`)."""

    def __init__(self, logits: str = "pred_logits", boxes: str = "pred_boxes") -> None:
        self.logits, self.boxes = logits, boxes

    def params(self, metas: Sequence[Any], opts: Any, *, nc: int, device: torch.device) -> torch.Tensor:
        return pack_set_params(metas, conf=opts["conf"], nc=nc, classes=opts.get("classes"), device=device)

    def static(self, opts: Any) -> tuple[tuple[str, Any], ...]:
        return (("max_det", int(opts["max_det"])),)

    def __call__(self, outputs: dict[str, torch.Tensor], params: torch.Tensor, *,
                 max_det: int) -> dict[str, torch.Tensor]:
        dets, counts = topk_padded(outputs[self.logits], outputs[self.boxes], params, max_det=max_det)
        return {"detections": dets, "counts": counts}

    def scores(self, outputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The (query, class) probabilities, the values ``conf`` is compared with."""
        return torch.sigmoid(outputs[self.logits].float())

    def read(self, padded: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        return read_detections(padded["detections"], padded["counts"])

    def read_later(self, padded: dict[str, torch.Tensor]) -> Callable[[], list[dict[str, torch.Tensor]]]:
        return read_detections_later(padded["detections"], padded["counts"])

    def capture_safe(self, device: torch.device) -> str | None:
        """Always None: sigmoid, top-k, gathers and a sort of fixed shapes never wait for the device."""
        return None


def one2one_padded(predictions: torch.Tensor, params: torch.Tensor, *,
                   max_det: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Detections of a batch of one-to-one predictions, padded: ``(B, k, 6)``, ``k = min(max_det,
    N * nc)``, and ``counts`` (B,), on the device; fixed shapes, nothing read back. ``params``:
    :func:`~libreyolo.ops.postprocess.pack_params` (its ``iou`` is not read: there is no NMS)."""
    pred = predictions.float()
    batch, channels, n = pred.shape
    nc = channels - 4
    conf, _, allowed = unpack_params(params, nc)
    x1, y1, x2, y2 = source_boxes(pred, params, nc)
    scores = pred[:, 4:].masked_fill(~allowed.view(1, nc, 1), -1.0)  # a class not asked for is never kept
    anchors = scores.amax(1).topk(min(max_det, n), dim=1).indices  # (B, k1): the best anchors
    cand = scores.gather(2, anchors.unsqueeze(1).expand(-1, nc, -1)).transpose(1, 2).flatten(1)  # anchor-major
    best, index = cand.topk(min(max_det, cand.shape[1]), dim=1)
    slot = torch.div(index, nc, rounding_mode="floor")
    label = index - slot * nc
    anchor = anchors.gather(1, slot)
    xyxy = torch.stack((x1, y1, x2, y2), -1).gather(1, anchor.unsqueeze(2).expand(-1, -1, 4))
    keep = (best > conf) & (xyxy[..., 2] > xyxy[..., 0]) & (xyxy[..., 3] > xyxy[..., 1])
    return _kept_first(xyxy, best, label, keep)


def one2one_postprocess_later(predictions: torch.Tensor, metas: Sequence[Any], *, conf: float, max_det: int,
                              classes: Sequence[int] | None = None) -> Callable[[], list[dict[str, torch.Tensor]]]:
    """:func:`one2one_postprocess` enqueued now and read back by the returned call."""
    if len(metas) != predictions.shape[0]:
        raise ValueError(f"{predictions.shape[0]} predictions but {len(metas)} letterbox metas")
    params = pack_params(metas, conf=conf, iou=0.0, nc=predictions.shape[1] - 4, classes=classes,
                         device=predictions.device)
    return read_detections_later(*one2one_padded(predictions, params, max_det=max_det))


def one2one_postprocess(predictions: torch.Tensor, metas: Sequence[Any], *, conf: float, max_det: int,
                        classes: Sequence[int] | None = None) -> list[dict[str, torch.Tensor]]:
    """One dict per image: ``xyxy`` (K, 4) source pixels, ``conf`` (K,), ``cls`` (K,) float; best first."""
    return one2one_postprocess_later(predictions, metas, conf=conf, max_det=max_det, classes=classes)()


class One2OnePostprocess(SetPostprocess):
    """The device stage of :func:`one2one_postprocess` as a family declares it (the interface of
    :class:`SetPostprocess`: ``max_det`` fixes the shapes; nothing waits for the device)."""

    def __init__(self, output: str = "predictions") -> None:
        self.output = output

    def params(self, metas: Sequence[Any], opts: Any, *, nc: int, device: torch.device) -> torch.Tensor:
        return pack_params(metas, conf=opts["conf"], iou=0.0, nc=nc, classes=opts.get("classes"), device=device)

    def __call__(self, outputs: dict[str, torch.Tensor], params: torch.Tensor, *,
                 max_det: int) -> dict[str, torch.Tensor]:
        dets, counts = one2one_padded(outputs[self.output], params, max_det=max_det)
        return {"detections": dets, "counts": counts}

    def scores(self, outputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The anchors' class probabilities, the values ``conf`` is compared with."""
        return outputs[self.output][:, 4:]
