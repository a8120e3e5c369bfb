"""Detection postprocessing shared by every box-regressing family, eager, graphed or exported.

Input: ``predictions`` (B, 4 + nc, N), xyxy boxes in network-input pixels followed by
per-class probabilities. For every image of the batch at once: map boxes back to source pixels
and clip them to the image, drop boxes left with no area (and classes not asked for), take the
(box, class) pairs whose probability is above ``conf`` (multi-label), keep the best ``max_nms``
of them, run class-aware greedy NMS (:mod:`libreyolo.ops.nms`), keep at most ``max_det``.

Visiting order: descending score, ties by lower box-major index (box ``n``, class ``k`` has
index ``n * nc + k``): a stable ``torch.sort`` of the candidates in box-major order. Made
exact and device-independent by sorting 64-bit keys ``score bits << 32 | ~index`` (scores
above ``conf >= 0`` are positive floats, whose bit patterns sort like the floats).

Two stages, split so that a CUDA graph can hold the first:

- :func:`detect_padded`: device tensors in, a padded ``(B, max_det, 6)`` tensor (x1, y1, x2, y2,
  score, class; zeros after the kept rows) and ``counts`` (B,) out. On CUDA every shape is fixed
  (top-k of exactly ``max_nms`` keys, the Triton NMS kernel) and nothing waits for the device.
  Elsewhere the same steps size themselves to the candidates found (the host reads a count,
  which costs nothing on a CPU), with the same result.
- :func:`read_detections`: reads ``counts`` back (the one synchronisation) and slices per image.

What ``max_nms`` changes: only when more than ``max_nms`` pairs of one image pass ``conf``; then
the lowest-scored ones are never visited. A pair can only be suppressed by higher-scored ones,
so the result is then the first detections of the uncapped result (a prefix), fewer of them
only if the cap is reached before ``max_det`` boxes are kept.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from libreyolo.errors import ArgumentError
from libreyolo.ops.letterbox import LetterboxMeta
from libreyolo.ops.nms import greedy_nms

DEFAULT_MAX_NMS = 30000
# fixed-shape candidate selection: a full sort of the keys instead of a top-k of max_nms of them up
# to this many keys per call. H200, YOLOv9-t at 640 (672,000 keys per image), eager: batch 1 sort
# 0.149 ms against topk(30000) 0.308 ms; batch 32 sort 2.26 ms against topk 0.99 ms
# (bench/results/2026-12-01-serving-profile-h200.json). Inside the whole-pipeline graph, batch-1
# predict: sparse fp32 3.97 ms sorting against 4.22 with topk, dense 5.32 against 5.45
# (bench/results/2026-12-01-serving-profile-h200-mask.json, same detections).
SORT_BELOW = 1 << 20
_LOW = (1 << 32) - 1
_PARAM_HEAD = 2  # conf, iou; then nc class switches, then 5 numbers per image


def check_max_nms(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgumentError(f"max_nms must be a positive integer (candidates kept before NMS), got {value!r}")
    return value


def pack_params(metas: Sequence[LetterboxMeta], *, conf: float, iou: float, nc: int,
                classes: Sequence[int] | None = None, device: torch.device | str | None = None) -> torch.Tensor:
    """Everything per call that is not a shape, as one float32 vector (one host-to-device copy).

    Layout: ``conf, iou``, one 0/1 switch per class (``classes``; ids outside ``0..nc-1`` are
    ignored), then per image ``left, top, ratio, width, height`` of its letterbox placement. A
    CUDA graph takes it as an input, so new thresholds, classes or image sizes need no recapture.
    """
    wanted = None if classes is None else {int(c) for c in classes}
    switches = [1.0] * nc if wanted is None else [1.0 if c in wanted else 0.0 for c in range(nc)]
    frames = [v for m in metas for v in (m.pad[0], m.pad[1], m.ratio, m.orig_shape[1], m.orig_shape[0])]
    return params_to(torch.tensor([float(conf), float(iou), *switches, *frames], dtype=torch.float32), device)


def params_to(params: torch.Tensor, device: torch.device | str | None) -> torch.Tensor:
    """A host parameter vector on ``device`` (None: left on the host). To a GPU through pinned memory
    and non-blocking: a copy from pageable memory would first wait for the work queued there."""
    if device is None or torch.device(device).type != "cuda":
        return params if device is None else params.to(device)
    return params.pin_memory().to(device, non_blocking=True)


def unpack_params(params: torch.Tensor, nc: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``conf``, ``iou`` (0-d) and the class switches as a (nc,) bool mask, from :func:`pack_params`."""
    return params[0], params[1], params[_PARAM_HEAD:_PARAM_HEAD + nc] > 0.5


def source_boxes(pred: torch.Tensor, params: torch.Tensor, nc: int) -> tuple[torch.Tensor, ...]:
    """``x1, y1, x2, y2`` (B, N) each: the xyxy boxes of ``pred`` (B, 4 + nc, N, network-input pixels)
    taken out of each image's letterbox (``params`` from :func:`pack_params`) and clipped to it."""
    left, top, ratio, width, height = params[_PARAM_HEAD + nc:].view(pred.shape[0], 5, 1).unbind(1)
    return (torch.minimum(((pred[:, 0] - left) / ratio).clamp(min=0), width),
            torch.minimum(((pred[:, 1] - top) / ratio).clamp(min=0), height),
            torch.minimum(((pred[:, 2] - left) / ratio).clamp(min=0), width),
            torch.minimum(((pred[:, 3] - top) / ratio).clamp(min=0), height))


def _keys(scores: torch.Tensor, index: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Sort keys: higher score first, then lower ``index``; -1 where ``mask`` is False."""
    keys = (scores.contiguous().view(torch.int32).to(torch.int64) << 32) | (_LOW - index)
    return keys if mask is None else keys.masked_fill_(~mask, -1)


def _top_candidates(scores: torch.Tensor, above: torch.Tensor, usable: torch.Tensor, allowed: torch.Tensor,
                    max_nms: int, fixed: bool) -> torch.Tensor:
    """(B, k) sort keys of each image's best candidates, descending, -1 padded.

    ``scores``/``above``: (B, nc, N) (class-major, as the network lays them out; the keys carry
    box-major indices ``n * nc + k``), ``usable`` (B, N), ``allowed`` (nc,). Fixed: ``k =
    min(max_nms, N * nc)``, one top-k over all pairs. Otherwise the pairs above ``conf`` are
    compacted first (cheap when few pass) and k is the most any image has, capped at
    ``max_nms``. Both give the same keys.
    """
    batch, nc, n = scores.shape
    device = scores.device
    # (counted per image: count_nonzero along a dimension is several times slower on a CPU)
    most_above = 0 if fixed else max(int(row.count_nonzero()) for row in above.view(batch, -1))
    if not fixed and most_above == 0:
        return torch.empty((batch, 0), dtype=torch.int64, device=device)
    if not fixed and most_above <= max_nms:  # else compacting cannot pay: the cap is reached anyway
        img, cls, box = above.nonzero(as_tuple=True)
        ok = usable[img, box] & allowed[cls]
        img, cls, box = img[ok], cls[ok], box[ok]
        counts = torch.bincount(img, minlength=batch).tolist()
        most = max(counts, default=0)
        keys = _keys(scores[img, cls, box], box * nc + cls)
        keys, order = keys.sort(descending=True)  # unique within an image
        img, regroup = img[order].sort(stable=True)  # group by image, keeping each image's order
        keys = keys[regroup]
        starts = torch.tensor([0] + counts[:-1], device=device).cumsum(0)
        out = torch.full((batch, most), -1, dtype=torch.int64, device=device)
        out[img, torch.arange(img.shape[0], device=device) - starts[img]] = keys
        return out
    index = (torch.arange(n, device=device) * nc).unsqueeze(0) + torch.arange(nc, device=device).unsqueeze(1)
    mask = above & usable.unsqueeze(1) & allowed.unsqueeze(1)
    keys = _keys(scores, index, mask).view(batch, nc * n)
    k = min(max_nms, nc * n)
    if keys.numel() <= SORT_BELOW:  # the same values as topk (the keys are unique, padding is all -1)
        return keys.sort(dim=1, descending=True).values[:, :k]
    return keys.topk(k, dim=1).values


def detect_padded(predictions: torch.Tensor, params: torch.Tensor, *, max_det: int,
                  max_nms: int = DEFAULT_MAX_NMS, fixed_shape: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Detections of a batch, padded: ``(B, max_det, 6)`` and ``counts`` (B,) int64, on the device.

    ``params`` from :func:`pack_params`, on the predictions' device. ``fixed_shape`` (default:
    on CUDA) makes every shape independent of the data and reads nothing back to the host.
    """
    pred = predictions.float()
    batch, channels, n = pred.shape
    nc = channels - 4
    device = pred.device
    fixed = device.type == "cuda" if fixed_shape is None else fixed_shape
    conf, iou, allowed = unpack_params(params, nc)
    x1, y1, x2, y2 = source_boxes(pred, params, nc)
    usable = (x2 > x1) & (y2 > y1)
    scores = pred[:, 4:]  # (B, nc, N)
    keys = _top_candidates(scores, scores > conf, usable, allowed, max_nms, fixed)
    dets = pred.new_zeros((batch, max_det, 6))
    if keys.shape[1] == 0:
        return dets, torch.zeros(batch, dtype=torch.int64, device=device)
    valid = keys >= 0
    index = torch.where(valid, _LOW - (keys & _LOW), 0)
    box_idx = torch.div(index, nc, rounding_mode="floor")
    cls = index - box_idx * nc
    score = (keys >> 32).to(torch.int32).view(torch.float32)
    boxes = torch.stack((x1, y1, x2, y2), -1)  # (B, N, 4) source pixels
    cand = boxes.gather(1, box_idx.unsqueeze(2).expand(-1, -1, 4))
    keep, counts = greedy_nms(cand, cls, valid.sum(1), iou, max_det,
                              backend=None if fixed or device.type != "cuda" else "torch")
    slot = keep.clamp(min=0)
    rows = torch.cat((cand.gather(1, slot.unsqueeze(2).expand(-1, -1, 4)), score.gather(1, slot).unsqueeze(2),
                      cls.gather(1, slot).to(torch.float32).unsqueeze(2)), 2)
    dets = torch.where((keep >= 0).unsqueeze(2), rows, dets)
    return dets, counts


def read_detections(dets: torch.Tensor, counts: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """Per-image dicts ``xyxy`` (K, 4), ``conf`` (K,), ``cls`` (K,) float; reads ``counts`` (a sync)."""
    n = counts.tolist()
    xyxy, conf, cls = dets[..., :4].contiguous(), dets[..., 4].contiguous(), dets[..., 5].contiguous()
    return [{"xyxy": xyxy[i, :k], "conf": conf[i, :k], "cls": cls[i, :k]} for i, k in enumerate(n)]


def read_detections_later(dets: torch.Tensor, counts: torch.Tensor) -> Callable[[], list[dict[str, torch.Tensor]]]:
    """:func:`read_detections` in two steps: now, ``counts`` starts its way to page-locked host
    memory (non-blocking, on CUDA); the returned call waits for that copy alone and slices. In
    between the host is free to enqueue the next batch. The detections stay on their device."""
    if counts.device.type != "cuda":
        return lambda: read_detections(dets, counts)
    host = torch.empty(counts.shape, dtype=counts.dtype, pin_memory=True)
    host.copy_(counts, non_blocking=True)
    arrived = torch.cuda.Event()
    arrived.record()

    def finish() -> list[dict[str, torch.Tensor]]:
        arrived.synchronize()
        return read_detections(dets, host)

    return finish


def detect_postprocess(
    predictions: torch.Tensor,
    metas: Sequence[LetterboxMeta],
    *,
    conf: float,
    iou: float,
    max_det: int,
    classes: Sequence[int] | None = None,
    max_nms: int = DEFAULT_MAX_NMS,
) -> list[dict[str, torch.Tensor]]:
    """One dict per image: ``xyxy`` (K, 4) source pixels, ``conf`` (K,), ``cls`` (K,) float."""
    return detect_postprocess_later(predictions, metas, conf=conf, iou=iou, max_det=max_det, classes=classes,
                                    max_nms=max_nms)()


def detect_postprocess_later(
    predictions: torch.Tensor,
    metas: Sequence[LetterboxMeta],
    *,
    conf: float,
    iou: float,
    max_det: int,
    classes: Sequence[int] | None = None,
    max_nms: int = DEFAULT_MAX_NMS,
) -> Callable[[], list[dict[str, torch.Tensor]]]:
    """:func:`detect_postprocess` enqueued now and read back by the returned call
    (:func:`read_detections_later`)."""
    if len(metas) != predictions.shape[0]:
        raise ValueError(f"{predictions.shape[0]} predictions but {len(metas)} letterbox metas")
    params = pack_params(metas, conf=conf, iou=iou, nc=predictions.shape[1] - 4, classes=classes,
                         device=predictions.device)
    return read_detections_later(*detect_padded(predictions, params, max_det=max_det,
                                                max_nms=check_max_nms(max_nms)))


class DetectPostprocess:
    """The device stage of :func:`detect_postprocess` as a family declares it (see ``Family.device_postprocess``).

    ``params(...)`` packs a call's thresholds, classes and letterbox placements;
    ``__call__(outputs, params, ...)`` is the fixed-shape, sync-free stage a CUDA graph captures;
    ``read(...)`` turns its padded output into per-image dicts.
    """

    def __init__(self, output: str = "predictions") -> None:
        self.output = output

    def params(self, metas: Sequence[LetterboxMeta], opts: Any, *, nc: int, device: torch.device) -> torch.Tensor:
        """Everything of one call that is not a shape: ``opts`` (the detect task's options) and placements."""
        return pack_params(metas, conf=opts["conf"], iou=opts["iou"], nc=nc, classes=opts.get("classes"),
                           device=device)

    def static(self, opts: Any) -> tuple[tuple[str, Any], ...]:
        """The options that fix the captured stage's shapes (one graph per value)."""
        return (("max_det", int(opts["max_det"])), ("max_nms", check_max_nms(opts.get("max_nms") or DEFAULT_MAX_NMS)))

    def __call__(self, outputs: dict[str, torch.Tensor], params: torch.Tensor, *, max_det: int,
                 max_nms: int) -> dict[str, torch.Tensor]:
        dets, counts = detect_padded(outputs[self.output], params, max_det=max_det, max_nms=max_nms)
        return {"detections": dets, "counts": counts}

    def scores(self, outputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The candidates' class probabilities, the values ``conf`` is compared with (any layout)."""
        return outputs[self.output][:, 4:]

    def read(self, padded: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        return read_detections(padded["detections"], padded["counts"])

    def read_later(self, padded: dict[str, torch.Tensor]) -> Callable[[], list[dict[str, torch.Tensor]]]:
        """:meth:`read` in two steps (:func:`read_detections_later`)."""
        return read_detections_later(padded["detections"], padded["counts"])

    def capture_safe(self, device: torch.device) -> str | None:
        """None if :meth:`__call__` never waits for the device there, else why not."""
        from libreyolo.ops.nms import capture_safe_reason

        return capture_safe_reason(device)


__all__ = ["DEFAULT_MAX_NMS", "DetectPostprocess", "check_max_nms", "detect_padded", "detect_postprocess",
           "detect_postprocess_later", "pack_params", "params_to", "read_detections", "read_detections_later",
           "source_boxes", "unpack_params"]
