"""The OpenAI-compatible HTTP server of `rlxc serve` (FastAPI): completions, chat, embeddings, models, health, metrics.

`create_app(engine, model_name, ...)` gives the ASGI app over a running `Engine` (and optionally a
`SentenceEmbedder`); `serve(...)` runs it under uvicorn. Requests are checked by `rlx.serving.api`
(4xx with an OpenAI-style error body); streams are server-sent events ending in `data: [DONE]`;
a client that goes away mid-stream cancels its sequences; a full queue answers 429. The runner's
LoRA adapters are models of their own: a request whose `model` is an adapter's name (or
"base:name") generates with it, and `/v1/models` lists them after the base model.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import secrets
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from rlx.errors import RlxError
from rlx.serving.api import ApiError, GenerationRequest, chat_request, completion_request, embedding_inputs, parse_json
from rlx.serving.engine import Engine, EngineClosed, Event
from rlx.serving.metrics import Metrics
from rlx.serving.scheduler import QueueFull


class _Choice:
    """One choice of a request: its engine request and the events it has had."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.request: Any = None
        self.events: list[Event] = []

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1].finish_reason is not None


class _Handoff:
    """Events from the engine's thread to one event loop's queues, a batch at a time: the first event of a batch
    schedules one wake-up of the loop (`call_soon_threadsafe`), the others join it, so a step's tokens for many
    streams wake the loop once rather than once each (each wake-up is a write to the loop's self-pipe, and the
    loop's run competes with the next step's compute for the cores)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._pending: list[tuple[asyncio.Queue[Any], Any]] = []

    def put(self, queue: asyncio.Queue[Any], item: Any) -> None:
        """Called on the engine's thread: `item` goes into `queue` on the loop's thread."""
        with self._lock:
            self._pending.append((queue, item))
            if len(self._pending) > 1:  # a wake-up is already scheduled: it takes this one too
                return
        self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        for queue, item in batch:
            queue.put_nowait(item)


class _Guard:
    """ASGI middleware: bearer-token auth on /v1/* (when `api_key` is set), and any unexpected exception as a 500
    with an OpenAI body (the server goes on). Plain ASGI: Starlette's `BaseHTTPMiddleware` would pass every
    streamed chunk through a task and a memory stream of its own."""

    def __init__(self, app: Any, api_key: str | None) -> None:
        self.app, self._want = app, None if api_key is None else f"Bearer {api_key}".encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self._want is not None and scope["path"].startswith("/v1/"):
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not secrets.compare_digest(given, self._want):
                err = ApiError(401, "invalid or missing API key (Authorization: Bearer ...)", code="invalid_api_key")
                await JSONResponse(err.body(), status_code=401)(scope, receive, send)
                return
        started = False

        async def tracked(message: dict[str, Any]) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if started:  # the response is under way: nothing can replace it
                raise
            err = ApiError(500, f"{type(exc).__name__}: {exc}", kind="server_error")
            await JSONResponse(err.body(), status_code=500)(scope, receive, send)


def create_app(engine: Engine, model_name: str, *, embedder: Any | None = None, embedding_model: str | None = None,
               api_key: str | None = None, metrics: Metrics | None = None) -> FastAPI:
    """The app over `engine` (started by the caller; stopped, draining, when the app shuts down)."""
    metrics = metrics or Metrics(engine.stats)
    if metrics is not engine.observer:
        engine.observer = metrics
    tokenizer = engine.runner.tokenizer
    max_context = engine.runner.max_context
    adapters = list(getattr(engine.runner, "adapters", ()))
    embed_lock = threading.Lock()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(engine.stop, True)  # uvicorn has let open requests finish

    app = FastAPI(title="rlx", lifespan=lifespan)
    app.state.engine, app.state.metrics = engine, metrics

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        metrics.requests.labels(request.url.path, str(exc.status)).inc()
        return JSONResponse(exc.body(), status_code=exc.status)

    app.add_middleware(_Guard, api_key=api_key)
    handoffs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Handoff] = weakref.WeakKeyDictionary()

    def check_model(name: str, known: Sequence[str | None]) -> None:
        if name not in known:
            raise ApiError(404, f"the model {name!r} does not exist; this server has {[k for k in known if k]}",
                           param="model", code="model_not_found")

    def adapter_of(name: str) -> str | None:
        """The LoRA adapter a request's `model` names (None: the base model), or a 404."""
        if name == model_name:
            return None
        base, _, adapter = name.rpartition(":")
        if name in adapters or (base == model_name and adapter in adapters):
            return name if name in adapters else adapter
        raise ApiError(404, f"the model {name!r} does not exist; this server has {[model_name, *adapters]}",
                       param="model", code="model_not_found")

    def prompt_ids(req: GenerationRequest) -> list[int]:
        if req.messages is not None:
            if tokenizer is None or not getattr(tokenizer, "chat_template", None):
                raise ApiError(400, f"the model {model_name!r} has no chat template", param="messages")
            try:
                ids = tokenizer.encode(tokenizer.apply_chat_template(req.messages))
            except RlxError as exc:
                raise ApiError(400, str(exc), param="messages") from None
        elif isinstance(req.prompt, str):
            if tokenizer is None:
                raise ApiError(400, f"the model {model_name!r} has no tokenizer: give the prompt as token ids",
                               param="prompt")
            ids = tokenizer.encode(req.prompt)
        else:
            ids = list(req.prompt)
            if max(ids) >= engine.runner.vocab_size:
                raise ApiError(400, f"token ids must be below the vocabulary size {engine.runner.vocab_size}",
                               param="prompt")
        if not ids:
            raise ApiError(400, "the prompt encodes to no tokens", param="prompt")
        if len(ids) + req.params.max_tokens > max_context:
            raise ApiError(400, f"the prompt ({len(ids)} tokens) plus max_tokens ({req.params.max_tokens}) is over "
                                f"the context of {max_context} tokens", param="max_tokens",
                           code="context_length_exceeded")
        return ids

    def start(req: GenerationRequest, ids: list[int], adapter: str | None,
              events: asyncio.Queue[tuple[_Choice, Event]]) -> list[_Choice]:
        """Submit the request's choices; their events land in `events` as (choice, event)."""
        loop = asyncio.get_running_loop()
        handoff = handoffs.get(loop)
        if handoff is None:
            handoff = handoffs[loop] = _Handoff(loop)
        choices = [_Choice(i) for i in range(req.n)]
        try:
            for c in choices:
                params = req.params
                if req.n > 1 and params.seed is not None:  # distinct, reproducible choices
                    params = dataclasses.replace(params, seed=params.seed + c.index)
                c.request = engine.submit(ids, params, lambda e, c=c: handoff.put(events, (c, e)), adapter=adapter)
        except QueueFull as exc:
            cancel(choices)
            raise ApiError(429, f"the server is busy: {exc}", kind="requests", code="rate_limit_exceeded") from None
        except EngineClosed:
            cancel(choices)
            raise ApiError(503, "the server is shutting down", kind="server_error") from None
        return choices

    def cancel(choices: list[_Choice]) -> None:
        for c in choices:
            if c.request is not None:
                c.request.cancel()

    def token_text(token_id: int) -> str:
        """A token as logprobs show it: its text, or "bytes:\\xNN..." when it is not whole UTF-8 (as OpenAI)."""
        if tokenizer is None:
            return str(token_id)
        raw = tokenizer.token_bytes(token_id) if hasattr(tokenizer, "token_bytes") else None
        if raw is None:
            return tokenizer.decode([token_id])
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)

    def completion_logprobs(events: list[Event]) -> dict[str, Any]:
        tokens = [e for e in events if e.token_id is not None]
        return {"tokens": [token_text(e.token_id) for e in tokens], "token_logprobs": [e.logprob for e in tokens],
                "top_logprobs": [{token_text(i): lp for i, lp in e.top_logprobs} for e in tokens],
                "text_offset": [sum(len(x.text) for x in tokens[:k]) for k in range(len(tokens))]}

    def chat_logprobs(events: list[Event]) -> dict[str, Any]:
        def entry(i: int, lp: float) -> dict[str, Any]:
            text = token_text(i)
            raw = tokenizer.token_bytes(i) if hasattr(tokenizer, "token_bytes") else text.encode()
            return {"token": text, "logprob": lp, "bytes": list(raw)}

        return {"content": [{**entry(e.token_id, e.logprob), "top_logprobs": [entry(i, lp) for i, lp in e.top_logprobs]}
                            for e in events if e.token_id is not None]}

    async def collect(choices: list[_Choice], events: asyncio.Queue[tuple[_Choice, Event]]) -> None:
        while not all(c.done for c in choices):
            c, e = await events.get()
            c.events.append(e)
        for c in choices:
            last = c.events[-1]
            if last.finish_reason == "error":
                raise ApiError(500, f"generation failed: {last.error}", kind="server_error")

    async def generate(request: Request, chat: bool) -> Response:
        endpoint = request.url.path
        body = parse_json(await request.body())
        req = chat_request(body, max_context) if chat else completion_request(body, max_context)
        adapter = adapter_of(req.model)
        ids = prompt_ids(req)
        events: asyncio.Queue[tuple[_Choice, Event]] = asyncio.Queue()
        choices = start(req, ids, adapter, events)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(12)}"
        created = int(time.time())
        head = {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                "model": req.model}
        if req.stream:
            metrics.requests.labels(endpoint, "200").inc()
            return StreamingResponse(stream(req, choices, events, head, len(ids), chat),
                                     media_type="text/event-stream")
        try:
            await collect(choices, events)
        finally:
            cancel([c for c in choices if not c.done])
        out = []
        for c in choices:
            text = "".join(e.text for e in c.events)
            logprobs = None
            if req.params.logprobs:
                logprobs = chat_logprobs(c.events) if chat else completion_logprobs(c.events)
            reason = c.events[-1].finish_reason
            if chat:
                out.append({"index": c.index, "message": {"role": "assistant", "content": text},
                            "logprobs": logprobs, "finish_reason": reason})
            else:
                out.append({"index": c.index, "text": text, "logprobs": logprobs, "finish_reason": reason})
        generated = sum(sum(e.token_id is not None for e in c.events) for c in choices)
        metrics.requests.labels(endpoint, "200").inc()
        return JSONResponse({**head, "choices": out, "usage": _usage(len(ids), generated)})

    async def stream(req: GenerationRequest, choices: list[_Choice], events: asyncio.Queue[tuple[_Choice, Event]],
                     head: dict[str, Any], n_prompt: int, chat: bool) -> AsyncIterator[str]:
        head = {**head, "object": "chat.completion.chunk" if chat else "text_completion"}
        # every chunk is the head, then its one choice: the head's JSON is written once
        opening = "data: " + json.dumps(head)[:-1] + ', "choices": ['
        generated = 0
        try:
            if chat:
                for c in choices:
                    yield _sse({**head, "choices": [{"index": c.index, "delta": {"role": "assistant", "content": ""},
                                                     "logprobs": None, "finish_reason": None}]})
            while not all(c.done for c in choices):
                # the events that came since the last chunk went out (one step's, or more when the client is
                # slower than the steps), sent as one write
                batch = [await events.get()]
                while not events.empty():
                    batch.append(events.get_nowait())
                out = []
                for c, e in batch:
                    c.events.append(e)
                    if e.finish_reason == "error":
                        out.append(_sse(ApiError(500, f"generation failed: {e.error}", kind="server_error").body()))
                        continue
                    generated += e.token_id is not None
                    logprobs = None
                    if req.params.logprobs and e.token_id is not None:
                        logprobs = chat_logprobs([e]) if chat else completion_logprobs([e])
                    if chat:
                        delta = {"content": e.text} if e.text or e.token_id is not None else {}
                        choice = {"index": c.index, "delta": delta, "logprobs": logprobs,
                                  "finish_reason": e.finish_reason}
                    else:
                        choice = {"index": c.index, "text": e.text, "logprobs": logprobs,
                                  "finish_reason": e.finish_reason}
                    out.append(opening + json.dumps(choice) + "]}\n\n")
                yield "".join(out)
            if req.include_usage:
                yield _sse({**head, "choices": [], "usage": _usage(n_prompt, generated)})
            yield "data: [DONE]\n\n"
        finally:  # the client went away (or the stream ended): nothing left running for it
            cancel([c for c in choices if not c.done])

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        model, inputs = embedding_inputs(parse_json(await request.body()))
        check_model(model, [embedding_model])

        def run() -> tuple[Any, int]:
            with embed_lock:
                _, mask = embedder.tokenize(inputs)
                return embedder.embed(inputs), int(mask.sum())

        vectors, n_tokens = await asyncio.to_thread(run)
        data = [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]
        metrics.requests.labels(request.url.path, "200").inc()
        return JSONResponse({"object": "list", "data": data, "model": model,
                             "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})

    @app.get("/v1/models")
    async def models() -> Response:
        def card(name: str, **extra: str) -> dict[str, Any]:
            return {"id": name, "object": "model", "created": 0, "owned_by": "rlx", **extra}

        data = [card(model_name), *(card(a, parent=model_name) for a in adapters)]
        data += [card(embedding_model)] if embedder is not None else []
        return JSONResponse({"object": "list", "data": data})

    @app.get("/health")
    async def health() -> Response:
        status = "draining" if engine.closing else "ok"
        return JSONResponse({"status": status, **engine.stats()}, status_code=503 if engine.closing else 200)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def serve(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Run `app` under uvicorn until SIGINT/SIGTERM (open requests finish first, then the engine drains)."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                yield
                # uvicorn re-raises the SIGTERM it caught once shut down; a drained server exits 0 instead
                getattr(self, "_captured_signals", []).clear()

    Server(uvicorn.Config(app, host=host, port=port, log_level=log_level)).run()
