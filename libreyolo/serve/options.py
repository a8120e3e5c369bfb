"""The options of :class:`~libreyolo.serve.Batcher` and ``libreyolo serve``, declared once
(see :mod:`libreyolo.options`): the Python API, the CLI and its ``--help`` read these tables."""
from __future__ import annotations

from libreyolo.options import Opt, as_bool
from libreyolo.utils.checks import MAX_BATCH

MAX_WAIT_MS = 10_000.0       # a request never waits longer than this for its batch to fill
MAX_BODY_BYTES = 1 << 30     # the largest request body max_bytes may allow (1 GiB)

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
}
