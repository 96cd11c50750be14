"""The FastAPI app: OpenAI's routes over a GenerationService.

    GET  /health                 200 when a model is loaded (no key needed)
    GET  /v1/models[/{id}]       the loaded model
    POST /v1/chat/completions    messages through the model's chat template (or the plain format)
    POST /v1/completions         a raw prompt

Every refusal is an OpenAI-style {"error": {...}} body with a 4xx status; a bug is a 500 with
one line (its traceback goes to the server's log). A loopback-bound server answers only Host
headers that name the loopback (a web page reaching it through DNS rebinding gets a 400), and
a POST must be application/json, so a page cannot send one without a CORS preflight, which
fails unless --cors named its origin.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from app.server.config import LOOPBACK_HOSTS, ServerConfig
from app.server.errors import ApiError, unavailable
from app.server.replies import Reply
from app.server.schemas import ChatRequest, CompletionRequest, parse_body
from app.server.service import Failed, Finished, GenerationService, Job, Piece, Started

log = logging.getLogger("flashdesk.server")

DRAIN_MAX_BYTES = 64 << 20  # an oversize body is read through up to this, so its client gets the 413
DISCONNECT_POLL_S = 0.25  # how often a request waiting for its turn (or a whole reply) checks its client
OWNER = "flashdesk"


class JobStream(StreamingResponse):
    """A reply streamed as server-sent events; whatever ends the response (the last event, the
    client leaving, the server stopping) lets go of the job: a generation still running stops."""

    def __init__(self, job: Job, events: object):
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.job = job

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.abandon()


def create_app(service: GenerationService, config: ServerConfig) -> FastAPI:
    app = FastAPI(title="FlashDesk", docs_url=None, redoc_url=None, openapi_url=None,
                  dependencies=[Depends(_host_check(config))])
    if config.cors:
        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])
    _add_error_handlers(app)

    @app.get("/health")
    async def health() -> JSONResponse:
        if service.model_id() is None:
            return JSONResponse({"status": "no model loaded"}, 503)
        return JSONResponse({"status": "ok"})

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(_key_check(config))])

    @v1.get("/models")
    async def models() -> JSONResponse:
        name = service.model_id()
        return JSONResponse({"object": "list", "data": [_model_object(name)] if name else []})

    @v1.get("/models/{model}")
    async def model(model: str) -> JSONResponse:
        return JSONResponse(_model_object(_served_name(service, model)))

    @v1.post("/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _generate(request, service, config, ChatRequest)

    @v1.post("/completions")
    async def completions(request: Request) -> Response:
        return await _generate(request, service, config, CompletionRequest)

    app.include_router(v1)
    return app


async def _generate(request: Request, service: GenerationService, config: ServerConfig,
                    schema: type[ChatRequest] | type[CompletionRequest]) -> Response:
    req = parse_body(await _read_body(request, config.max_body_bytes), schema, config.max_tokens)
    req.model = _served_name(service, req.model)  # the reply names the model that wrote it
    inbox: asyncio.Queue = asyncio.Queue()
    loop = asyncio.get_running_loop()
    job = service.submit(req, lambda item: loop.call_soon_threadsafe(inbox.put_nowait, item))
    streaming = False
    client = _Client(request)
    try:
        first = await client.next(inbox)  # Started once the prompt fits (or Failed)
        if first is None:
            return Response(status_code=499)  # the client left while waiting: nobody reads this
        if isinstance(first, Failed):
            raise first.error
        assert isinstance(first, Started)
        reply = Reply(req.kind, req.model, first.prompt_tokens, req.return_tokens, req.logprobs is not None,
                      bool(req.tools))
        if req.stream:
            streaming = True
            return JobStream(job, _events(reply, inbox, req.include_usage))
        while True:
            item = await client.next(inbox)
            if item is None:
                return Response(status_code=499)
            if isinstance(item, Failed):
                raise item.error
            if isinstance(item, Finished):
                return JSONResponse(reply.whole(item))
    finally:
        if not streaming:  # the stream lets go of the job when it ends (JobStream)
            job.abandon()


class _Client:
    """Watches whether the client is still there while the handler waits for its job's reports."""

    def __init__(self, request: Request):
        self._request = request
        self._next_check = time.monotonic() + DISCONNECT_POLL_S

    async def next(self, inbox: asyncio.Queue) -> object | None:
        """The job's next report, or None once the client has disconnected (checked every
        DISCONNECT_POLL_S, whether reports come fast, as a reply's steps do, or not at all)."""
        get = asyncio.ensure_future(inbox.get())
        while True:
            done, _ = await asyncio.wait({get}, timeout=max(0.0, self._next_check - time.monotonic()))
            if time.monotonic() >= self._next_check:
                self._next_check = time.monotonic() + DISCONNECT_POLL_S
                if await self._request.is_disconnected():
                    get.cancel()
                    return None
            if done:
                return get.result()


async def _events(reply: Reply, inbox: asyncio.Queue, include_usage: bool):  # noqa: ANN202 - an async generator
    first = reply.first_chunk()
    if first is not None:
        yield _sse(first)
    while True:
        item = await inbox.get()
        if isinstance(item, Piece):
            chunk = reply.text_chunk(item.text, item.logprobs)
            if chunk is not None:
                yield _sse(chunk)
        elif isinstance(item, Finished):
            for chunk in reply.last_chunks(item):
                yield _sse(chunk)
            if include_usage:
                yield _sse(reply.usage_chunk(item))
            break
        elif isinstance(item, Failed):  # after the 200 went out, an error is an event of its own
            yield _sse(item.error.body())
            break
    yield b"data: [DONE]\n\n"


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def _read_body(request: Request, limit: int) -> bytes:
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise ApiError(415, "send the request body as JSON with Content-Type: application/json",
                       code="unsupported_media_type")
    # an oversize body is still read (and dropped), up to DRAIN_MAX_BYTES: a client that is still
    # sending when the 413 goes out and the connection closes would see a reset, not the 413
    body = bytearray()
    seen = 0
    length = request.headers.get("content-length", "")
    over = length.isdigit() and int(length) > limit
    async for chunk in request.stream():
        seen += len(chunk)
        over = over or seen > limit
        if not over:
            body += chunk
        elif seen > DRAIN_MAX_BYTES:
            break
    if over:
        raise ApiError(413, f"the request body is larger than {limit} bytes", code="body_too_large")
    return bytes(body)


def _served_name(service: GenerationService, model: str) -> str:
    served = service.model_id()
    if served is None:
        raise unavailable("no model is loaded")
    return resolve_model(model, [served])


def resolve_model(requested: str, served: list[str]) -> str:
    """The served model a request's name picks: any name, when one model is served (as llama.cpp's
    server does: a client configured for another server sends its own); the named one among several."""
    if len(served) == 1:
        return served[0]
    if requested in served:
        return requested
    raise ApiError(404, f"the model {requested!r} does not exist; this server serves {', '.join(served)}",
                   code="model_not_found", param="model")


def _model_object(name: str) -> dict:
    return {"id": name, "object": "model", "created": int(time.time()), "owned_by": OWNER}


def _host_check(config: ServerConfig):  # noqa: ANN202 - a FastAPI dependency
    async def check(request: Request) -> None:
        if config.loopback and (request.url.hostname or "").lower() not in LOOPBACK_HOSTS:
            raise ApiError(400, "this server answers requests to the loopback address only", code="bad_host")
    return check


def _key_check(config: ServerConfig):  # noqa: ANN202 - a FastAPI dependency
    expected = f"Bearer {config.api_key}".encode() if config.api_key else None

    async def check(request: Request) -> None:
        if expected is None:
            return
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            raise ApiError(401, "a valid API key is needed: send Authorization: Bearer KEY",
                           code="invalid_api_key")
    return check


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_request: Request, e: ApiError) -> JSONResponse:
        return JSONResponse(e.body(), e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
        err = ApiError(e.status_code, f"{request.method} {request.url.path}: {e.detail}", code=code)
        return JSONResponse(err.body(), e.status_code, headers=dict(e.headers or {}))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, e: RequestValidationError) -> JSONResponse:
        return JSONResponse(ApiError(400, f"bad request: {e.errors()[0].get('msg', '')}").body(), 400)

    @app.exception_handler(Exception)
    async def bug(_request: Request, e: Exception) -> JSONResponse:
        log.error("request failed", exc_info=e)
        return JSONResponse(ApiError(500, f"internal error ({type(e).__name__})", "server_error").body(), 500)
