"""The HTTP service of ``libreyolo serve`` (FastAPI): ``POST /predict``, ``GET /health``,
``GET /info`` and a drop-an-image page at ``/``. Needs ``pip install 'libreyolo[serve]'``.

``create_app(model_or_batcher, ...)`` builds the app, so tests and other servers can mount it.
Every request goes through one :class:`~libreyolo.serve.Batcher`, whose budgets (requests held,
decoded pixels held, imgsz, network pixels per request: :mod:`libreyolo.serve.budget`) admit it
or refuse it at once. Request bodies are read in chunks and refused with 413 as soon as they pass
``max_bytes`` (a declared Content-Length over the limit is refused before anything is read), and
with 408 when they take longer than ``body_timeout``. Status codes: 400 a malformed multipart body
or a query key given twice, 408 a body too slow, 413 too large (body, image or requested work),
415 not a decodable image, 422 a bad option, 429 busy (a budget is full: try again), 500 a batch
aborted, 503 closing down; errors are JSON ``{"detail": "<the library's one-line message>"}``.
A client that disconnects mid-upload is one line in the log (``libreyolo`` logger, INFO).
docs/serving.md lists every case.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
from importlib import resources
from typing import Any

from libreyolo.errors import ArgumentError, ImageError, LibreYOLOError, require
from libreyolo.serve.batcher import Batcher, BatcherClosed
from libreyolo.serve.options import SERVER_OPTIONS
from libreyolo.utils.log import LOGGER

try:  # FastAPI resolves the endpoints' annotations (strings here) in this module's globals
    from starlette.requests import Request
except ImportError:  # the serve extra is missing: create_app() says what to install
    Request = Any  # type: ignore[assignment,misc]


class _TooLarge(Exception):
    def __init__(self, size: int, limit: int, declared: bool) -> None:
        how = "declares" if declared else "has more than"
        super().__init__(f"the request body {how} {size:,} bytes, over the limit of {limit:,} (max_bytes); "
                         "send a smaller image or start the server with a larger max_bytes=")


class _BadUpload(Exception):
    pass


class _SlowBody(Exception):
    pass


class _Gone(Exception):
    """The client disconnected before its body arrived."""


def _query_options(request: Any) -> dict[str, str]:
    """The query parameters, each given once (a repeated key is refused, as the CLI refuses it)."""
    items = request.query_params.multi_items()
    seen: set[str] = set()
    for key, _ in items:
        if key in seen:
            raise _BadUpload(f"{key} is given twice in the query; give each option once")
        seen.add(key)
    return dict(items)


def _page() -> str:
    return resources.files("libreyolo.serve").joinpath("page.html").read_text(encoding="utf-8")


async def _read_image(request: Any, max_bytes: int, timeout: float, closing: asyncio.Event) -> bytes:
    """The uploaded image's bytes, all arrived within ``timeout`` seconds (else :class:`_SlowBody`)
    and before the server began to shut down (else BatcherClosed: a slow body cannot hold shutdown)."""
    from starlette.requests import ClientDisconnect

    read = asyncio.ensure_future(_read_body(request, max_bytes))
    stop = asyncio.ensure_future(closing.wait())
    try:
        done, _ = await asyncio.wait({read, stop}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if read in done:
            try:
                return read.result()
            except ClientDisconnect:
                raise _Gone() from None
        if closing.is_set():
            raise BatcherClosed("the server is shutting down; send the request again to a running server")
        raise _SlowBody(f"the request body did not arrive within {timeout:g} s (body_timeout); send it faster "
                        "or ask for a server with a larger body_timeout=")
    finally:
        for task in (read, stop):
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task


async def _read_body(request: Any, max_bytes: int) -> bytes:
    """The uploaded image's bytes: a multipart file field, or else the raw body; at most max_bytes read."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise _TooLarge(int(declared), max_bytes, True)

    async def limited() -> Any:
        total = 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > max_bytes:
                raise _TooLarge(max_bytes, max_bytes, False)
            yield chunk

    if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        return b"".join([chunk async for chunk in limited()])
    from starlette.datastructures import UploadFile
    from starlette.formparsers import MultiPartException, MultiPartParser

    try:
        form = await MultiPartParser(request.headers, limited(), max_files=1, max_fields=32,
                                     max_part_size=64 << 10).parse()
    except MultiPartException as exc:
        raise _BadUpload(f"malformed multipart body: {exc.message}; send one image as a file field "
                         "(curl -F file=@image.jpg) or as the raw body") from None
    try:
        files = [v for v in form.values() if isinstance(v, UploadFile)]
        if not files:
            raise _BadUpload("the multipart body has no file field; send the image as a file "
                             "(curl -F file=@image.jpg) or as the raw body")
        return await files[0].read()
    finally:
        await form.close()


def _model_info(model: Any) -> dict[str, Any]:
    info = {"runtime": type(model).__name__, "task": getattr(model, "task", None)}
    family = getattr(model, "family", None)
    info.update(family=getattr(family, "name", None), size=getattr(model, "size", None),
                imgsz=getattr(model, "imgsz", None), names=getattr(model, "names", None))
    for attr in ("source", "path"):
        if getattr(model, attr, None) is not None:
            info["source"] = str(getattr(model, attr))
            break
    with contextlib.suppress(Exception):
        info["device"] = str(model.device)
    return info


def create_app(model_or_batcher: Any, *, max_bytes: int = SERVER_OPTIONS["max_bytes"].default,
               annotate: bool = False, max_batch: int = 8, max_wait_ms: float = 2.0,
               body_timeout: float = SERVER_OPTIONS["body_timeout"].default, **predict_kw: Any) -> Any:
    """A FastAPI app serving a model (wrapped in a new :class:`Batcher` that the app closes on
    shutdown, with ``max_batch``, ``max_wait_ms`` and ``predict_kw``, which may hold the Batcher's
    budgets ``max_queued``, ``max_pixels``, ``max_imgsz``, ``max_work``) or an existing Batcher
    (left open: its owner closes it). ``annotate``: the default of ``POST /predict?annotate=``;
    ``body_timeout``: seconds a request body may take to arrive."""
    require("fastapi", "serve", "libreyolo serve")
    from fastapi import FastAPI
    from fastapi.responses import HTMLResponse, JSONResponse

    max_bytes = SERVER_OPTIONS["max_bytes"].check("max_bytes", max_bytes)
    body_timeout = SERVER_OPTIONS["body_timeout"].check("body_timeout", body_timeout)
    annotate_default = SERVER_OPTIONS["annotate"].check("annotate", annotate)
    owned = not isinstance(model_or_batcher, Batcher)
    if owned:
        batcher = Batcher(model_or_batcher, max_batch=max_batch, max_wait_ms=max_wait_ms, **predict_kw)
    else:
        if predict_kw:
            raise ArgumentError(f"create_app() got predict options {sorted(predict_kw)} with a ready Batcher; "
                                "give them to the Batcher instead")
        batcher = model_or_batcher
    model = batcher.model

    closing = asyncio.Event()  # set when shutdown begins: body reads in progress end with 503
    loop: list[Any] = []

    def begin_shutdown() -> None:
        """Refuse the bodies still arriving (503) from now on; safe from a signal handler."""
        if loop:
            loop[0].call_soon_threadsafe(closing.set)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> Any:
        loop.append(asyncio.get_running_loop())
        yield
        closing.set()
        if owned:  # uvicorn has finished the in-flight requests by now; this finishes queued ones
            await asyncio.to_thread(batcher.close)

    app = FastAPI(title="LibreYOLO", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.batcher = batcher
    app.state.begin_shutdown = begin_shutdown

    def error(status: int, exc: BaseException) -> Any:
        headers = {"Retry-After": "1"} if status == 429 else None
        return JSONResponse({"detail": str(exc)}, status_code=status, headers=headers)

    @app.get("/", response_class=HTMLResponse)
    def page() -> Any:
        return HTMLResponse(_page())

    @app.get("/health")
    def health() -> Any:
        if batcher.closed:
            return JSONResponse({"status": "closing"}, status_code=503)
        return {"status": "ok"}

    @app.get("/info")
    def info() -> Any:
        from libreyolo import __version__

        graphs = None
        if callable(getattr(model, "graph_info", None)):
            with contextlib.suppress(Exception):
                graphs = json.loads(json.dumps(model.graph_info(), default=str))
        return {"version": __version__, "model": _model_info(model),
                "predict_defaults": json.loads(json.dumps(batcher.predict_kw, default=str)),
                "limits": {"max_bytes": max_bytes, "body_timeout": body_timeout,
                           "max_queued": batcher.admission.max_queued, "max_pixels": batcher.admission.max_pixels,
                           "max_imgsz": batcher.max_imgsz, "max_work": batcher.max_work},
                "graphs": graphs, "batcher": batcher.stats()}

    @app.post("/predict")
    async def predict(request: Request) -> Any:
        # before the body is read, a bad option or a full server costs no upload
        if closing.is_set():
            return error(503, BatcherClosed("the server is shutting down; send the request to a running server"))
        try:
            options = _query_options(request)
        except _BadUpload as exc:
            return error(400, exc)
        try:
            want_image = SERVER_OPTIONS["annotate"].check("annotate", options.pop("annotate", annotate_default))
            batcher.check_options(options)
            batcher.admission.check_room()
        except LibreYOLOError as exc:
            return error(getattr(exc, "status", 422), exc)
        try:
            data = await _read_image(request, max_bytes, body_timeout, closing)
        except _TooLarge as exc:
            return error(413, exc)
        except _BadUpload as exc:
            return error(400, exc)
        except _SlowBody as exc:
            return error(408, exc)
        except BatcherClosed as exc:
            return error(503, exc)
        except _Gone:
            LOGGER.info("libreyolo serve: a client (%s) disconnected before its request body arrived",
                        request.client.host if request.client else "?")
            return error(400, ArgumentError("the client disconnected"))
        try:
            result = await batcher.apredict(data, **options)
        except asyncio.CancelledError:  # shutdown's grace ran out (uvicorn cancels): one line, not a traceback
            LOGGER.warning("libreyolo serve: a request in flight was cut at shutdown (grace ran out)")
            return error(503, BatcherClosed("the server shut down before this request was answered"))
        except ImageError as exc:
            return error(415, exc)
        except BatcherClosed as exc:
            return error(503, exc)
        except LibreYOLOError as exc:  # 413 and 429 (budgets), 500 (a batch aborted), else 422
            return error(getattr(exc, "status", 422), exc)
        body: dict[str, Any] = {"task": getattr(model, "task", None), "orig_shape": list(result.orig_shape),
                                "speed": result.speed, "predictions": result.summary()}
        if want_image:
            body["annotated_png"] = await asyncio.to_thread(_png_base64, result)
        return JSONResponse(body)

    return app


def _png_base64(result: Any) -> str:
    buf = io.BytesIO()
    result.plot().save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")
