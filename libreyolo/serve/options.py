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
    # None: 2 on CUDA (one batch's host work -- upload, results -- overlaps another's device work), 1 elsewhere
    "in_flight": Opt(int, None, "batches run at once, each on its own thread (default: 2 on CUDA, 1 elsewhere)",
                     min=1, max=8, none_ok=True),
    # measured on the H200 (README "Serving"): one worker keeping two batches in flight
    "overlap": Opt(as_bool, False, "each worker enqueues its next batch before reading the last one back, so on "
                   "CUDA a batch's upload and launch overlap the device work of the one before", True),
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
