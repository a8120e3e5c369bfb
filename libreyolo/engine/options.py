"""The options of ``predict()`` and ``benchmark``, declared once (see :mod:`libreyolo.options`).

``Predictor.predict`` checks its arguments with this table and ``libreyolo predict`` /
``libreyolo benchmark`` parse the command line with it.
"""
from __future__ import annotations

from libreyolo.options import (
    MAX_BENCH_N,
    MAX_WORKERS,
    NETWORK_TIMEOUT_S,
    Opt,
    as_bool,
    as_compile_mode,
    as_device,
    as_graph_mode,
    batch_opt,
    imgsz_opt,
)
from libreyolo.tasks import all_task_options

# the options of every predict call, whatever the task
COMMON_PREDICT_OPTIONS: dict[str, Opt] = {
    "imgsz": imgsz_opt(),
    "half": Opt(as_bool, None, "fp16 inference (CUDA)", True),
    "device": Opt(as_device, None, "cpu, cuda, cuda:N or mps"),
    "batch": batch_opt(None, "images per forward (default 16, lowered to fit the input budget)"),
    "cuda_graph": Opt(as_graph_mode, False, "replay the forward from CUDA graphs: true or auto", True),
    "color_format": Opt(str, "bgr", "channel order of numpy arrays", choices=("bgr", "rgb")),
    "verbose": Opt(as_bool, False, "log one line per image", True),
    "stream": Opt(as_bool, False, "return a generator of Results", True),
    "progress": Opt(as_bool, None, "progress bar on stderr (default: on a terminal, for long runs)", True),
    "workers": Opt(int, None, "threads decoding the next batch while one runs (default: 4 on CUDA, 0 on the CPU; "
                   "same results for every value)", min=0, max=MAX_WORKERS),
    "decode": Opt(str, "cpu", "where JPEG files are decoded: cpu (Pillow) or cuda (nvJPEG on the CUDA device, "
                  "needs torchvision: extra gpu-decode)", choices=("cpu", "cuda")),
}

# LibreYOLO(..., compile=...), model.compile(...) and `libreyolo predict compile=...` (libreyolo.engine.compiled)
COMPILE_OPTION = Opt(as_compile_mode, False, "torch.compile the inference copy, validated against eager before "
                     "first use: true (reduce-overhead on CUDA, default on the CPU), false, or a mode (default, "
                     "reduce-overhead, max-autotune, max-autotune-no-cudagraphs)", True)

# the options of a video source (libreyolo.data.video), declared once: predict(), track() and the CLI
VIDEO_OPTIONS: dict[str, Opt] = {
    "vid_stride": Opt(int, 1, "video sources: keep every n-th frame", min=1, max=10_000),
    "start_frame": Opt(int, 0, "video sources: the first frame to predict (0-based; earlier frames are decoded "
                       "and dropped)", min=0),
    "end_frame": Opt(int, None, "video sources: stop before this frame (unset: the end of the video)", min=1),
    "reconnect": Opt(int, 0, "live sources (streams, webcams): reopen a stream that drops or stalls up to this many "
                     "times (waiting 0.5, 1, 2, 4, then 8 s before each try), then stop with an error; 0: stop at "
                     "once", min=0, max=10_000),
    "stream_timeout": Opt(float, NETWORK_TIMEOUT_S, "live sources: seconds to open a stream and to wait for its next "
                          "data before it counts as stalled", min=0.1, max=3600.0, unit="s"),
}

# what a video source (file, stream, webcam) takes: frames kept, and the annotated video (libreyolo.data.video)
VIDEO_PREDICT_OPTIONS: dict[str, Opt] = {
    **VIDEO_OPTIONS,
    "save": Opt(as_bool, False, "video sources: write the annotated video to save_dir/<name>.mp4", True),
    "save_dir": Opt(str, "runs/predict", "where the annotated video goes"),
    "save_json": Opt(as_bool, False, "video sources: write every frame's predictions to save_dir/<name>.json", True),
    "save_csv": Opt(as_bool, False, "video sources: write every prediction of every frame as a row of "
                    "save_dir/<name>.csv", True),
}

# with the tasks' own options (libreyolo.tasks: detect conf, iou, max_det, max_nms, classes; semantic
# classes), each declared once by its task
PREDICT_OPTIONS: dict[str, Opt] = {**all_task_options(), **COMMON_PREDICT_OPTIONS, **VIDEO_PREDICT_OPTIONS}

BENCH_OPTIONS: dict[str, Opt] = {
    "device": Opt(as_device, None, "cpu, cuda, cuda:N (unset: cuda when available)"),
    "imgsz": imgsz_opt("network input size, also of the exports (unset: the model's)"),
    "batch": batch_opt(1, "images per predict() call (and the exports' batch)"),
    "n": Opt(int, 50, "timed calls per format (median reported)", min=1, max=MAX_BENCH_N),
    "workers": Opt(int, 0, "DataLoader workers of the data= validation", min=0, max=MAX_WORKERS),
    "floor": Opt(float, 0.01, "fail (exit 1) when a format's metric is below eager minus this (absolute)",
                 min=0.0, max=1.0),
    "half": Opt(as_bool, False, "fp16 (CUDA)", True),
    "int8": Opt(as_bool, False, "also an INT8 row (<format>-int8) per format with INT8 artifacts: exported with "
                "int8=True, calibrated on data='s train split and gated on its val split (needs data=)", True),
    "max_drop": Opt(float, None, "int8: the largest metric drop the INT8 accuracy gate allows (export default 0.02)",
                    min=0.0, max=1.0),
    "cuda_graph": Opt(as_graph_mode, True, "also time predict(cuda_graph=...): true, auto or false", True),
}
