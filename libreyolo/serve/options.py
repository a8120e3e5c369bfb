"""The options of :class:`~libreyolo.serve.Batcher` and ``libreyolo serve``, declared once
(see :mod:`libreyolo.options`): the Python API, the CLI and its ``--help`` read these tables."""
from __future__ import annotations

from libreyolo.options import Opt, as_bool, imgsz_opt
from libreyolo.utils.checks import MAX_BATCH, MAX_IMGSZ

MAX_WAIT_MS = 10_000.0       # a request never waits longer than this for its batch to fill
MAX_BODY_BYTES = 1 << 30     # the largest request body max_bytes may allow (1 GiB)
MAX_PIXELS = 1 << 27         # default decoded pixels held by admitted requests: 134,217,728 (384 MiB of 8-bit RGB)

BATCHER_OPTIONS: dict[str, Opt] = {
    "max_batch": Opt(int, 8, "most requests coalesced into one forward", min=1, max=MAX_BATCH),
    "max_wait_ms": Opt(float, 2.0, "longest a request waits for its batch to fill", min=0.0, max=MAX_WAIT_MS,
                       unit="ms"),
    "in_flight": Opt(int, 1, "batches run at once, each on its own thread", min=1, max=8),
    # None: on for CUDA graphs on CUDA, where it was measured
    # (bench/results/2026-12-05-serve-h100-overlap-recorded-41.json: 32 clients, max_batch 16: 2,942
    # requests/s, p99 16.4 ms against 1,614/s, 34.6 ms for two threads without it)
    "overlap": Opt(as_bool, None, "each worker enqueues its next batch before reading the last one back, so a "
                   "batch's upload and launch overlap the device work of the one before (default: on with cuda_graph "
                   "on CUDA, off otherwise)", True),
    # budgets of the whole Batcher (libreyolo/serve/budget.py): beyond them a request is refused at once
    "max_queued": Opt(int, 1024, "most requests admitted at once, queued or running (more: busy, HTTP 429)",
                      min=1, max=1_000_000),
    "max_pixels": Opt(int, MAX_PIXELS, "most decoded image pixels the admitted requests hold together (3 bytes "
                      "each); an image over it alone: too large (413), else busy (429)", min=1, max=1 << 34,
                      unit="pixels"),
    "max_imgsz": imgsz_opt("largest imgsz a request may ask for (default: the served imgsz; more: 413)"),
    "max_work": Opt(int, None, "most network input pixels one request may cost: imgsz**2 for a detector, a "
                    "restorer's padded image with each tile's context (default: max_imgsz**2; more: 413)", min=1,
                    max=MAX_IMGSZ * MAX_IMGSZ * 64, unit="pixels"),
}

# predict() options a request may not set: they describe the batch or the call, not the image
NOT_PER_REQUEST = ("batch", "stream", "progress", "verbose", "device", "workers")


def _port(name: str, value: object) -> int:
    return Opt(int, 8000, "", min=0, max=65535).check(name, value)


_port.allowed = "an integer from 0 to 65535"  # type: ignore[attr-defined]

SERVER_OPTIONS: dict[str, Opt] = {
    "host": Opt(str, "127.0.0.1", "address to listen on (0.0.0.0: every interface)"),
    "port": Opt(_port, 8000, "TCP port (0: any free port)"),
    "max_bytes": Opt(int, 20 << 20, "largest request body accepted (larger: 413)", min=1, max=MAX_BODY_BYTES,
                     unit="bytes"),
    "annotate": Opt(as_bool, False, "POST /predict default: embed the annotated image as base64 PNG", True),
    "body_timeout": Opt(float, 60.0, "longest a request body may take to arrive (slower: 408)", min=0.01,
                        max=3600.0, unit="s"),
    "grace": Opt(float, 10.0, "on SIGTERM/Ctrl-C, how long requests in flight may finish before they are cut "
                 "(a second signal exits at once)", min=0.0, max=3600.0, unit="s"),
}
