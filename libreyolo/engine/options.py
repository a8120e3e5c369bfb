"""The options of ``predict()`` and ``benchmark``, declared once (see :mod:`libreyolo.options`).

``Predictor.predict`` checks its arguments with this table and ``libreyolo predict`` /
``libreyolo benchmark`` parse the command line with it.
"""
from __future__ import annotations

from libreyolo.options import (
    MAX_BENCH_N,
    MAX_DET,
    MAX_NMS,
    MAX_WORKERS,
    Opt,
    as_bool,
    as_device,
    as_graph_mode,
    as_ids,
    batch_opt,
    fraction,
    imgsz_opt,
)

PREDICT_OPTIONS: dict[str, Opt] = {
    "conf": fraction(0.25, "confidence threshold"),
    "iou": fraction(0.45, "NMS IoU threshold"),
    "max_det": Opt(int, 300, "maximum detections per image", min=1, max=MAX_DET),
    "max_nms": Opt(int, None, "candidates per image entering NMS (default 30000)", min=1, max=MAX_NMS),
    "imgsz": imgsz_opt(),
    "classes": Opt(as_ids, None, "keep only these class ids, e.g. 0,2"),
    "half": Opt(as_bool, None, "fp16 inference (CUDA)", True),
    "device": Opt(as_device, None, "cpu, cuda, cuda:N or mps"),
    "batch": batch_opt(None, "images per forward (default 16, lowered to fit the input budget)"),
    "cuda_graph": Opt(as_graph_mode, False, "replay the forward from CUDA graphs: true or auto", True),
    "color_format": Opt(str, "bgr", "channel order of numpy arrays", choices=("bgr", "rgb")),
    "verbose": Opt(as_bool, False, "log one line per image", True),
    "stream": Opt(as_bool, False, "return a generator of Results", True),
    "progress": Opt(as_bool, None, "progress bar on stderr (default: on a terminal, for long runs)", True),
}

BENCH_OPTIONS: dict[str, Opt] = {
    "device": Opt(as_device, None, "cpu, cuda, cuda:N (unset: cuda when available)"),
    "imgsz": imgsz_opt("network input size, also of the exports (unset: the model's)"),
    "batch": batch_opt(1, "images per predict() call (and the exports' batch)"),
    "n": Opt(int, 50, "timed calls per format (median reported)", min=1, max=MAX_BENCH_N),
    "workers": Opt(int, 0, "DataLoader workers of the data= validation", min=0, max=MAX_WORKERS),
    "floor": Opt(float, 0.01, "fail (exit 1) when a format's metric is below eager minus this (absolute)",
                 min=0.0, max=1.0),
    "half": Opt(as_bool, False, "fp16 (CUDA)", True),
    "cuda_graph": Opt(as_graph_mode, True, "also time predict(cuda_graph=...): true, auto or false", True),
}
