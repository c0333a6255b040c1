"""The OpenAI-compatible HTTP API (FastAPI) over a `Scheduler`.

    GET  /v1/models              the served model
    POST /v1/chat/completions    messages through the model's chat template; streaming (SSE) or not
    POST /v1/completions         a raw text prompt (or token ids); streaming or not
    GET  /health                 200 while the scheduler serves, 503 once it cannot (with the key, or
                                 without one set: the job counters too, and the warm-up's progress:
                                 stage n of m, what is warm, programs compiled, seconds so far)
    GET  /docs, /openapi.json    the API's description (behind the key when there is one)

A request's `tree_size` must be one of the sizes the server offers (`tree_sizes` in GET
/v1/models; another is a 400 naming them), so that requests cannot make it build pools and
compile steps without bound.
Every response carries a `dart` object saying how it was decoded: the method, the draft tree size,
the accepted length of every step and their mean, tokens/s (compilation left out; `compile_s`
says how much there was) and, where plain decoding produced tokens (method "ar", or tree size 0 of
keep="auto"), `plain_tokens` and `draft_tau` (the mean accepted length of the drafted steps
alone). A streamed chunk carries what the step it came from was: `{"accepted": k}` for a
speculative step (0 for the prefill's first token), `{"plain_tokens": n}` for n tokens of plain
decoding (no draft was accepted). Errors are OpenAI's {"error": {message, type, param,
code}} with a 4xx status (5xx only for the server's own faults). Every request body, on every
route (the chat UI's too, its login included), is counted as it arrives and cut at one size limit
(a 413): no client, with or without the key, can make the server hold or parse more than that,
nor tokenise megabytes of text for a request that cannot fit its context anyway. At most
`max_connections` requests are served at once (streams, the UI's included): one more gets a 503
at once, so that no client can hold the process's file descriptors.
"""
from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from typing import Any, AsyncIterator

from fastapi import Depends, FastAPI, Request
from jinja2 import TemplateError
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import JSONResponse, RedirectResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from dart_jax.api.text import StopText, check_stops
from dart_jax.decoding.settings import GenerationSettings

from .options import MAX_CONNECTIONS
from .protocol import APIError, ChatCompletionRequest, CompletionRequest
from .scheduler import Job, Scheduler, async_sink

_FINISH = {"eos": "stop", "length": "length", "stop": "stop"}
# bytes of a request body per token of context (JSON escapes take up to 12 bytes a character), and at least 1 MiB
BODY_BYTES_PER_TOKEN, MIN_BODY_BYTES = 256, 1 << 20


def body_limit(max_length: int) -> int:
    """The largest request body the API reads for a server of `max_length` tokens of context."""
    return max(MIN_BODY_BYTES, BODY_BYTES_PER_TOKEN * int(max_length))


def check_bearer(header: str, key: str) -> bool:
    """Whether an Authorization header carries `key` as a bearer token (the scheme's case is free, RFC 7235)."""
    scheme, _, token = header.strip().partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(token.strip().encode(), key.encode())


class _BodyTooLarge(Exception):
    """Raised into the app by `BodyLimit`'s receive once a body passes the limit."""


class BodyLimit:
    """ASGI middleware for every HTTP route: a body declared larger than `limit` bytes gets a 413
    in OpenAI's error shape at once; an undeclared one (chunked) is counted as the app reads it,
    and the read that passes the limit raises into the app, whose answer is replaced by the 413.
    Nothing is buffered here: the app never holds more than `limit` bytes of a body."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, int(limit)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            return await self._refuse(scope, receive, send)
        size, over, answered = 0, False, False

        async def counted():
            nonlocal size, over
            if over:  # an app that reads on after the error gets no more of the body
                raise _BodyTooLarge
            message = await receive()
            if message["type"] == "http.request":
                size += len(message.get("body", b""))
                if size > self.limit:
                    over = True
                    raise _BodyTooLarge
            return message

        async def guarded(message):
            nonlocal answered
            if over:  # the app's own answer to the cut body (a 400, a 500) gives way to the 413
                return
            answered = answered or message["type"] == "http.response.start"
            await send(message)
        try:
            await self.app(scope, counted, guarded)
        except Exception:
            if not over:
                raise
        if over and not answered:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope, receive, send):
        error = APIError(413, f"the request body is larger than this server's limit of {self.limit} bytes (about "
                              f"{BODY_BYTES_PER_TOKEN} bytes per token of context, on every route); shorten the "
                              "prompt.",
                         code="request_too_large")
        await JSONResponse(error.body(), status_code=413)(scope, receive, send)


class ConnectionLimit:
    """ASGI middleware: at most `limit` HTTP requests served at once (a stream counts until it
    ends); one more gets a 503 in OpenAI's error shape at once, so that open connections (each a
    file descriptor) stay bounded whoever sends them."""

    def __init__(self, app, limit: int):
        self.app, self.limit, self.open = app, int(limit), 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.open >= self.limit:
            error = APIError(503, f"the server is serving its limit of {self.limit} requests at once "
                                  "(--max-connections); try again shortly.", kind="server_error", code="server_busy")
            return await JSONResponse(error.body(), status_code=503, headers={"Retry-After": "1"})(scope, receive, send)
        self.open += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.open -= 1


def _json_content(request: Request) -> bool:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


def _validation_message(request: Request, exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if request.method == "POST" and not _json_content(request):
        # FastAPI reads a body of another content type as no JSON at all: name the header, not the symptom
        got = request.headers.get("content-type")
        return (f"the request body must be JSON sent with the header 'Content-Type: application/json' (got "
                f"{repr(got) if got else 'no Content-Type'}).", None)
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON ({first.get('ctx', {}).get('error', first.get('msg'))}).", None
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    where = ".".join(loc) or "body"
    return f"{where}: {msg}", (loc[0] if loc else None)


class Server:
    """Holds what the routes share: the scheduler, the served name, the API key."""

    def __init__(self, scheduler: Scheduler, model_name: str, api_key: str | None = None):
        self.scheduler, self.model_name, self.api_key = scheduler, model_name, api_key
        self.model = scheduler.model
        self.created = int(time.time())

    # ------------------------------------------------------------------ checks
    def authorized(self, request: Request) -> bool:
        return self.api_key is None or check_bearer(request.headers.get("authorization", ""), self.api_key)

    def authorize(self, request: Request) -> None:
        if not self.authorized(request):
            raise APIError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>' with the "
                                "key the server was started with (--api-key).", code="invalid_api_key")

    def check_model(self, name: str) -> None:
        if name != self.model_name:
            raise APIError(404, f"the model {name!r} does not exist here; this server serves {self.model_name!r} "
                                "(see GET /v1/models).", param="model", code="model_not_found")

    def settings(self, body, prompt_len: int, max_tokens: int | None) -> GenerationSettings:
        context = self.scheduler.max_length
        if prompt_len >= context:
            raise APIError(400, f"the prompt has {prompt_len} tokens but this server's context is {context} tokens "
                                "(prompt + answer); shorten the prompt or start the server with a larger "
                                "--max-length.", param="messages", code="context_length_exceeded")
        seed = body.seed if body.seed is not None else secrets.randbits(32)
        return GenerationSettings(max_new_tokens=max_tokens or context - prompt_len, max_length=context,
                                  temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, seed=seed)

    def stop_text(self, body) -> StopText:
        """The request's detokenizer, with its stop strings and stop ids (checked against the vocabulary)."""
        if body.stop_token_ids:
            try:
                check_stops(None, body.stop_token_ids, self.model.engine.vocab_size)
            except ValueError as e:
                raise APIError(400, str(e), param="stop_token_ids") from None
        return StopText(self.model.decode, body.stop, body.stop_token_ids or ())

    def submit(self, ids: list[int], settings: GenerationSettings, body) -> tuple[Job, asyncio.Queue]:
        q, sink = async_sink(asyncio.get_running_loop())
        try:
            job = self.scheduler.submit(ids, settings, sink, method=body.method, tree_size=body.tree_size,
                                        stop_at_eos=not body.ignore_eos)
        except ValueError as e:
            raise APIError(400, str(e), param="tree_size" if str(e).startswith("tree_size") else None) from None
        except RuntimeError as e:
            raise APIError(503, str(e), kind="server_error") from None
        return job, q

    # ------------------------------------------------------------------ running a job
    async def pieces(self, job: Job, q: asyncio.Queue, stream: StopText) -> AsyncIterator[tuple[str, dict, str | None]]:
        """(new text, what the step was: {"accepted": k} or {"plain_tokens": n}, finish reason or
        None) until the job ends; a job whose client went away (this generator closed early) is
        cancelled."""
        try:
            while True:
                event = await q.get()
                if event.error:
                    if event.finish_reason == "shutdown":
                        raise APIError(503, event.error, kind="server_error", code="server_shutting_down")
                    raise APIError(500, f"generation failed: {event.error}", kind="server_error")
                piece = stream.feed(event.ids)
                step = {"plain_tokens": len(event.ids)} if event.plain else {"accepted": event.accepted}
                if stream.stopped:
                    self.scheduler.cancel(job)
                    yield piece, step, "stop"
                    return
                if event.done:
                    yield piece + stream.finish(), step, _FINISH.get(event.finish_reason, event.finish_reason)
                    return
                yield piece, step, None
        finally:
            self.scheduler.cancel(job)  # no-op when it finished

    def decoding(self, job: Job) -> dict[str, Any]:
        steps = list(job.stats.accept_lengths)
        out = {"method": job.method, "tree_size": job.tree_size,
               "accept_lengths": steps, "mean_accepted_length": sum(steps) / len(steps) if steps else 0.0,
               "steps": len(steps), "tokens_per_s": round(job.tokens_per_s, 3), "compile_s": round(job.compile_s, 3)}
        figures = job.stats.tree_figures()  # keep="auto": plain_tokens, draft_tau
        if job.tree_size is None:  # plain decoding: every token after the prefill's first is a plain one
            figures = {"plain_tokens": len(steps), "draft_tau": 0.0}
        out.update({k: figures[k] for k in ("plain_tokens", "draft_tau") if k in figures})
        return out

    @staticmethod
    def usage(job: Job) -> dict[str, int]:
        prompt, out = len(job.prompt_ids), len(job.token_ids)
        return {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out}

    async def complete(self, request: Request, job: Job, q: asyncio.Queue, stream: StopText) -> tuple[str, str]:
        """Run a job to its end for a non-streaming answer; cancelled if the client disconnects."""
        text, reason = [], None

        async def watch():
            while True:
                await asyncio.sleep(0.25)
                if await request.is_disconnected():
                    self.scheduler.cancel(job)
                    return
        watcher = asyncio.create_task(watch())
        try:
            async for piece, _, finish in self.pieces(job, q, stream):
                text.append(piece)
                reason = finish or reason
        finally:
            watcher.cancel()
        return "".join(text), reason or "stop"

    def sse(self, chunks: AsyncIterator[dict]) -> StreamingResponse:
        async def body():
            try:
                async for chunk in chunks:
                    yield f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n"
            except APIError as e:
                yield f"data: {json.dumps(e.body())}\n\n"
            yield "data: [DONE]\n\n"
        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def create_app(scheduler: Scheduler, *, model_name: str, api_key: str | None = None,
               max_connections: int = MAX_CONNECTIONS) -> FastAPI:
    """The API app; mount the UI on it with `dart_jax.serve.ui.mount`."""
    server = Server(scheduler, model_name, api_key)
    # with a key, the API's description is served behind it too (below) rather than by FastAPI
    open_docs = api_key is None
    app = FastAPI(title="dart_jax", description="DART speculative decoding, OpenAI-compatible API",
                  docs_url="/docs" if open_docs else None, openapi_url="/openapi.json" if open_docs else None,
                  redoc_url=None)
    app.state.server = server
    app.add_middleware(BodyLimit, limit=body_limit(scheduler.max_length))
    app.add_middleware(ConnectionLimit, limit=max_connections)  # the outermost: counts every request

    @app.exception_handler(APIError)
    async def _api_error(_, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        message, param = _validation_message(request, exc)
        return JSONResponse(APIError(400, message, param=param).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_, exc: StarletteHTTPException):
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return JSONResponse(APIError(exc.status_code, str(exc.detail), kind=kind).body(), status_code=exc.status_code)

    auth = [Depends(server.authorize)]

    if not open_docs:
        @app.get("/openapi.json", dependencies=auth, include_in_schema=False)
        async def openapi():
            return app.openapi()

        @app.get("/docs", dependencies=auth, include_in_schema=False)
        async def docs():
            return get_swagger_ui_html(openapi_url="/openapi.json", title="dart_jax API")

    @app.get("/health")
    async def health(request: Request):
        # the job counters and the warm-up's progress say how busy the server is: for those with the key only
        extra = {}
        if server.authorized(request):
            extra["jobs"] = scheduler.load()
            progress = getattr(scheduler, "progress", None)  # a warm-up's, once one started
            if progress is not None:
                extra["warmup"] = progress.snapshot()
        problem = scheduler.health()
        if problem is not None:
            return JSONResponse({"status": "unhealthy", "error": problem, **extra}, status_code=503)
        return {"status": "ok", **extra}

    @app.get("/v1/models", dependencies=auth)
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": server.created,
                                            "owned_by": "dart_jax", "methods": sorted(scheduler.methods),
                                            "max_length": scheduler.max_length,
                                            "tree_size": scheduler.default_tree_size,
                                            "tree_sizes": list(scheduler.tree_sizes)}]}

    @app.post("/v1/chat/completions", dependencies=auth)
    async def chat(body: ChatCompletionRequest, request: Request):
        server.check_model(body.model)
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in body.messages]
        thinking = body.enable_thinking()
        if thinking and not server.model.has_thinking_switch:
            raise APIError(400, "chat_template_kwargs.enable_thinking: this model's chat template has no thinking "
                                "switch (Qwen3's has one), so thinking cannot be turned on; drop the key.",
                           param="chat_template_kwargs")
        try:
            ids = server.model.encode(messages, enable_thinking=thinking)
        except ValueError as e:
            raise APIError(400, str(e), param="messages") from None
        except TemplateError as e:  # the model's chat template is broken: the server's fault, not the client's
            raise APIError(500, f"the model's chat template failed ({type(e).__name__}: {e}); the server's "
                                "tokenizer_config.json / chat_template.jinja needs fixing.", kind="server_error") from None
        stream = server.stop_text(body)
        settings = server.settings(body, len(ids), body.answer_tokens())
        job, q = server.submit(ids, settings, body)
        rid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        head = {"id": rid, "created": created, "model": model_name}
        if not body.stream:
            text, reason = await server.complete(request, job, q, stream)
            return {**head, "object": "chat.completion", "usage": server.usage(job), "dart": server.decoding(job),
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                 "finish_reason": reason, "logprobs": None}]}

        async def chunks():
            def chunk(delta, reason=None, **extra):
                return {**head, "object": "chat.completion.chunk",
                        "choices": [{"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}], **extra}
            yield chunk({"role": "assistant", "content": ""})
            async for piece, step, reason in server.pieces(job, q, stream):
                if piece or reason:
                    yield chunk({"content": piece} if piece else {}, reason,
                                dart=step if not reason else server.decoding(job))
            if body.include_usage():
                yield {**head, "object": "chat.completion.chunk", "choices": [], "usage": server.usage(job)}
        return server.sse(chunks())

    @app.post("/v1/completions", dependencies=auth)
    async def completions(body: CompletionRequest, request: Request):
        server.check_model(body.model)
        if isinstance(body.prompt, str):
            ids = server.model.encode(body.prompt, chat=False)
            if not ids:
                raise APIError(400, "the prompt is empty.", param="prompt")
        else:
            ids = list(body.prompt)
        stream = server.stop_text(body)
        settings = server.settings(body, len(ids), body.answer_tokens())
        job, q = server.submit(ids, settings, body)
        rid, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        head = {"id": rid, "object": "text_completion", "created": created, "model": model_name}
        if not body.stream:
            text, reason = await server.complete(request, job, q, stream)
            return {**head, "usage": server.usage(job), "dart": server.decoding(job),
                    "choices": [{"index": 0, "text": text, "finish_reason": reason, "logprobs": None}]}

        async def chunks():
            async for piece, step, reason in server.pieces(job, q, stream):
                if piece or reason:
                    yield {**head, "choices": [{"index": 0, "text": piece, "finish_reason": reason, "logprobs": None}],
                           "dart": step if not reason else server.decoding(job)}
            if body.include_usage():
                yield {**head, "choices": [], "usage": server.usage(job)}
        return server.sse(chunks())

    @app.get("/", include_in_schema=False)
    async def root(request: Request):
        if getattr(app.state, "ui_path", None):
            return RedirectResponse(app.state.ui_path)
        shown = {"model": model_name} if server.authorized(request) else {}
        return {"name": "dart_jax", **shown, "api": "/v1", "docs": "/docs"}

    return app
