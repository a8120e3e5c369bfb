"""``libreyolo serve``: the HTTP service (:mod:`libreyolo.serve.app`) under uvicorn.

The address is bound before the model is loaded, so a taken port or a bad host is one line and
exit 2 at once. On SIGTERM or Ctrl-C the server stops accepting, lets the requests in flight finish
for at most ``grace`` seconds (then cuts them: a client trickling its body cannot hold shutdown),
and finishes the Batcher's queue; a second signal exits at once (status 128 + the signal).
"""
from __future__ import annotations

import os
import socket
from typing import Any

from libreyolo.engine.options import PREDICT_OPTIONS
from libreyolo.errors import ArgumentError
from libreyolo.options import Opt, as_bool
from libreyolo.serve.options import BATCHER_OPTIONS, SERVER_OPTIONS
from libreyolo.tasks import all_task_options

SERVE_OPTS: dict[str, Opt] = {
    "model": Opt(str, None, "checkpoint (.pt), architecture (.yaml) or artifact (.onnx/.pte/.engine/...)"),
    **SERVER_OPTIONS,
    **BATCHER_OPTIONS,
    **{k: PREDICT_OPTIONS[k] for k in ("imgsz", "device", "half", "cuda_graph")},
    **all_task_options(),  # the defaults of every request (conf, iou, ...); a request's query overrides them
    "warmup": Opt(as_bool, True, "run each padded batch size once before serving (captures CUDA graphs)", True),
    "verify": Opt(as_bool, True, "refuse artifacts changed since export and checkpoints with NaN/Inf weights", True),
}


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not yet listening), or an ArgumentError in one line."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise ArgumentError(f"host={host!r} is not an address to listen on ({why}); use 127.0.0.1 (this machine "
                            "only), 0.0.0.0 (every interface) or one of this machine's addresses") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a listener still fails
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ArgumentError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another port= "
                            "(port=0: any free one) or host=") from None
    sock.set_inheritable(True)
    return sock


def _server(uvicorn: Any, config: Any, grace: float) -> Any:
    class Server(uvicorn.Server):
        """uvicorn's server; a second SIGTERM (uvicorn: only a second SIGINT) exits at once."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.should_exit:
                os.write(2, b"libreyolo serve: second signal: exiting now, requests in flight are dropped\n")
                os._exit(128 + int(sig))
            os.write(2, f"libreyolo serve: stopping: requests in flight get at most {grace:g} s (grace); a second "
                        "Ctrl-C or SIGTERM exits at once\n".encode())
            super().handle_exit(sig, frame)
            config.app.state.begin_shutdown()  # bodies still arriving: 503 now

    return Server(config)


def cmd_serve(args: Any) -> int:
    from libreyolo.errors import require

    if not args["model"]:
        raise ArgumentError("serve needs model=<checkpoint|artifact>, e.g. model=LibreYOLO9t.pt")
    require("fastapi", "serve", "libreyolo serve")
    uvicorn = require("uvicorn", "serve", "libreyolo serve")
    sock = bind(args["host"], args["port"])  # before the model: a taken port costs no loading
    try:
        from libreyolo import LibreYOLO
        from libreyolo.serve.app import create_app

        model = LibreYOLO(args["model"], device=args["device"], verify=args["verify"])
        given = {k for k in args.given if k in all_task_options() or k in ("imgsz", "half", "cuda_graph")}
        predict_kw = {k: args[k] for k in given}
        budgets = {k: args[k] for k in ("max_queued", "max_pixels", "max_imgsz", "max_work")}
        app = create_app(model, max_bytes=args["max_bytes"], annotate=args["annotate"], max_batch=args["max_batch"],
                         max_wait_ms=args["max_wait_ms"], in_flight=args["in_flight"], overlap=args["overlap"],
                         body_timeout=args["body_timeout"], device=args["device"], **budgets, **predict_kw)
        if args["warmup"]:
            app.state.batcher.warmup()
        sock.listen(2048)  # connections queue from now on (uvicorn's backlog); the line below is true
        host, port = sock.getsockname()[:2]
        print(f"libreyolo serve: {args['model']} on http://{host}:{port}/ (max_batch "
              f"{args['max_batch']}, max_wait_ms {args['max_wait_ms']}); Ctrl-C stops after the requests in flight",
              flush=True)
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=args["grace"])
        _server(uvicorn, config, args["grace"]).run(sockets=[sock])
    finally:
        sock.close()
    return 0
