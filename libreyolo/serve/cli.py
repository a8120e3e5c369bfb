"""``libreyolo serve``: the HTTP service (:mod:`libreyolo.serve.app`) under uvicorn."""
from __future__ import annotations

from typing import Any

from libreyolo.engine.options import PREDICT_OPTIONS
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


def cmd_serve(args: Any) -> int:
    from libreyolo.errors import ArgumentError, require

    if not args["model"]:
        raise ArgumentError("serve needs model=<checkpoint|artifact>, e.g. model=LibreYOLO9t.pt")
    require("fastapi", "serve", "libreyolo serve")
    uvicorn = require("uvicorn", "serve", "libreyolo serve")
    from libreyolo import LibreYOLO
    from libreyolo.serve.app import create_app

    model = LibreYOLO(args["model"], device=args["device"], verify=args["verify"])
    given = {k for k in args.given if k in all_task_options() or k in ("imgsz", "half", "cuda_graph")}
    predict_kw = {k: args[k] for k in given}
    app = create_app(model, max_bytes=args["max_bytes"], annotate=args["annotate"], max_batch=args["max_batch"],
                     max_wait_ms=args["max_wait_ms"], in_flight=args["in_flight"], overlap=args["overlap"],
                     device=args["device"], **predict_kw)
    if args["warmup"]:
        app.state.batcher.warmup()
    print(f"libreyolo serve: {args['model']} on http://{args['host']}:{args['port']}/ (max_batch "
          f"{args['max_batch']}, max_wait_ms {args['max_wait_ms']}); Ctrl-C stops after the requests in flight",
          flush=True)
    uvicorn.run(app, host=args["host"], port=args["port"], log_level="warning")
    return 0
