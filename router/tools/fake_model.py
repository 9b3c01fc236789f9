"""``drain-router fake-model``: a stand-in OpenAI-compatible streaming model server.

A demo and test tool, not a model: it "generates" ``chunks`` tokens, one every ``interval_ms``,
after an optional ``first_token_ms`` of silent "prefill". Every streamed chunk carries a sequence
number (``seq``, from 0, and ``total``), so a client can tell a complete stream from one that lost
chunks; a complete stream ends with ``data: [DONE]``.

Endpoints:

- ``POST /v1/completions`` and ``POST /v1/chat/completions``: ``"stream": true`` answers server-sent
  events ``data: {json}\\n\\n``; otherwise one JSON body after the whole "generation" time.
  Per request, the query parameters ``chunks``, ``interval_ms`` and ``first_token_ms``, or the JSON
  fields of the same names (``max_tokens`` also sets ``chunks``), override the server defaults.
- ``GET /health``: 200 while serving, 503 once a graceful shutdown started.
- ``GET /stats``: ``started``, ``finished``, ``cancelled`` and ``active`` completion counters.
- ``GET /v1/models``: the one model, for OpenAI clients that list models first.

On SIGTERM it stops accepting, lets running streams finish, and exits 0. With ``--exit-on-sigterm``
it dies at once, cutting every stream, like a model server that does not drain: the reason the
model server container needs a preStop hold (see the README, "Why the model server needs a preStop hold").
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import sys
import time
import uuid
from typing import Any

import click
from aiohttp import web

#: Upper bounds for per-request overrides: a typo must not tie the server up for a day.
MAX_CHUNKS = 100_000
MAX_INTERVAL_MS = 60_000

DEFAULT_CHUNKS = 16
DEFAULT_INTERVAL_MS = 50


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    chunks: int = DEFAULT_CHUNKS
    """Tokens (stream chunks) per completion, when the request does not say."""
    interval_ms: int = DEFAULT_INTERVAL_MS
    """Milliseconds between two chunks: the "decode" speed."""
    first_token_ms: int = 0
    """Milliseconds of silence before the first chunk: the "prefill"."""
    model: str = "fake-model"
    """The model name reported in answers."""


@dataclasses.dataclass(slots=True)
class Counters:
    """Completions seen by this process. ``active`` is derived, so it can never drift."""

    started: int = 0
    """Completions whose handler began."""
    finished: int = 0
    """Completions written to the end (``[DONE]`` for streams)."""
    cancelled: int = 0
    """Completions abandoned: the client went away, or a shutdown cancelled them."""

    @property
    def active(self) -> int:
        return self.started - self.finished - self.cancelled

    def as_dict(self) -> dict[str, int]:
        return {"started": self.started, "finished": self.finished, "cancelled": self.cancelled, "active": self.active}


@dataclasses.dataclass(slots=True)
class Lifecycle:
    shutting_down: bool = False


SETTINGS = web.AppKey("settings", Settings)
COUNTERS = web.AppKey("counters", Counters)
LIFECYCLE = web.AppKey("lifecycle", Lifecycle)


@dataclasses.dataclass(frozen=True, slots=True)
class Generation:
    chunks: int
    interval_ms: int
    first_token_ms: int
    stream: bool
    chat: bool


def _int_param(name: str, raw: object, maximum: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise web.HTTPBadRequest(
            text=json.dumps({"error": f"{name} must be a whole number"}), content_type="application/json"
        )
    try:
        value = int(raw)
    except ValueError:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": f"{name} must be a whole number"}), content_type="application/json"
        ) from None
    if not 0 <= value <= maximum:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": f"{name} must be between 0 and {maximum}"}), content_type="application/json"
        )
    return value


def resolve(settings: Settings, body: dict[str, Any], query: Any, *, chat: bool) -> Generation:
    """The generation a request asks for: query parameter > JSON field > server default."""

    def pick(name: str, default: int, maximum: int, *aliases: str) -> int:
        for source in (query, body):
            for key in (name, *aliases):
                if key in source and source[key] is not None:
                    return _int_param(key, source[key], maximum)
        return default

    return Generation(
        chunks=pick("chunks", settings.chunks, MAX_CHUNKS, "max_tokens"),
        interval_ms=pick("interval_ms", settings.interval_ms, MAX_INTERVAL_MS),
        first_token_ms=pick("first_token_ms", settings.first_token_ms, MAX_INTERVAL_MS),
        stream=bool(body.get("stream", False)),
        chat=chat,
    )


def chunk_payload(gen: Generation, *, rid: str, created: int, model: str, seq: int) -> dict[str, Any]:
    """One streamed chunk in the OpenAI shape, plus ``seq``/``total`` so losses are detectable."""
    last = seq == gen.chunks - 1
    text = f" tok{seq}"
    if gen.chat:
        delta: dict[str, Any] = {"content": text}
        if seq == 0:
            delta["role"] = "assistant"
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": "length" if last else None}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length" if last else None}
        obj = "text_completion"
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [choice],
        "seq": seq,
        "total": gen.chunks,
    }


def full_payload(gen: Generation, *, rid: str, created: int, model: str) -> dict[str, Any]:
    text = "".join(f" tok{i}" for i in range(gen.chunks))
    if gen.chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "length",
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        obj = "text_completion"
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": {"prompt_tokens": 0, "completion_tokens": gen.chunks, "total_tokens": gen.chunks},
    }


async def _completion(request: web.Request, *, chat: bool) -> web.StreamResponse:
    try:
        body = await request.json() if request.can_read_body else {}
    except ValueError:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": "the body is not JSON"}), content_type="application/json"
        ) from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(
            text=json.dumps({"error": "the body must be a JSON object"}), content_type="application/json"
        )
    settings = request.app[SETTINGS]
    gen = resolve(settings, body, request.query, chat=chat)
    counters = request.app[COUNTERS]
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:16]
    created = int(time.time())
    model = str(body.get("model") or settings.model)

    counters.started += 1
    try:
        if gen.first_token_ms:
            await asyncio.sleep(gen.first_token_ms / 1000)
        if not gen.stream:
            await asyncio.sleep(gen.chunks * gen.interval_ms / 1000)
            response: web.StreamResponse = web.json_response(full_payload(gen, rid=rid, created=created, model=model))
        else:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await response.prepare(request)
            for seq in range(gen.chunks):
                if seq:
                    await asyncio.sleep(gen.interval_ms / 1000)
                chunk = chunk_payload(gen, rid=rid, created=created, model=model, seq=seq)
                await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
    except (asyncio.CancelledError, ConnectionResetError):
        # The client went away (a write to a closed connection, or aiohttp's handler cancellation
        # on disconnect), or a shutdown cancelled us: either way the "generation" is abandoned.
        counters.cancelled += 1
        raise
    counters.finished += 1
    return response


async def completions(request: web.Request) -> web.StreamResponse:
    return await _completion(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _completion(request, chat=True)


async def health(request: web.Request) -> web.Response:
    if request.app[LIFECYCLE].shutting_down:
        return web.json_response({"status": "shutting_down"}, status=503)
    return web.json_response({"status": "ok"})


async def stats(request: web.Request) -> web.Response:
    return web.json_response(request.app[COUNTERS].as_dict())


async def models(request: web.Request) -> web.Response:
    name = request.app[SETTINGS].model
    return web.json_response({"object": "list", "data": [{"id": name, "object": "model", "owned_by": "drain-router"}]})


def make_app(settings: Settings) -> web.Application:
    app = web.Application()
    app[SETTINGS] = settings
    app[COUNTERS] = Counters()
    app[LIFECYCLE] = Lifecycle()
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/stats", stats)
    return app


async def serve(
    settings: Settings, *, host: str, port: int, uds: str | None, exit_on_sigterm: bool, shutdown_timeout: float
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    if exit_on_sigterm:
        # Die at once, like a process without a SIGTERM handler: every open stream is cut.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    else:
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)

    app = make_app(settings)
    # handler_cancellation: a client that leaves is noticed during a silent prefill too.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    site: web.BaseSite
    site = web.UnixSite(runner, uds) if uds else web.TCPSite(runner, host, port)
    await site.start()
    address: dict[str, Any] = {"uds": uds} if uds else {"host": host, "port": runner.addresses[0][1]}
    _log(
        "fake_model.listening",
        **address,
        chunks=settings.chunks,
        interval_ms=settings.interval_ms,
        first_token_ms=settings.first_token_ms,
        exit_on_sigterm=exit_on_sigterm,
    )
    try:
        await stop.wait()
    finally:
        app[LIFECYCLE].shutting_down = True
        _log("fake_model.stopping", active=app[COUNTERS].active)
        await runner.cleanup()  # stops listening, waits for running streams up to shutdown_timeout
        _log("fake_model.stopped", **app[COUNTERS].as_dict())


def _log(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "ts": round(time.time(), 3), **fields}), flush=True)


@click.command("fake-model")
@click.option("--host", default="127.0.0.1", show_default=True, help="Listen address.")
@click.option(
    "--port",
    default=8000,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Listen port; 0 picks a free one (printed in the 'fake_model.listening' line).",
)
@click.option("--uds", default=None, metavar="PATH", help="Listen on this Unix socket instead of TCP.")
@click.option(
    "--chunks",
    default=DEFAULT_CHUNKS,
    show_default=True,
    type=click.IntRange(0, MAX_CHUNKS),
    help="Chunks (tokens) per completion; a request's 'chunks' or 'max_tokens' overrides it.",
)
@click.option(
    "--interval-ms",
    default=DEFAULT_INTERVAL_MS,
    show_default=True,
    type=click.IntRange(0, MAX_INTERVAL_MS),
    help="Milliseconds between chunks.",
)
@click.option(
    "--first-token-ms",
    default=0,
    show_default=True,
    type=click.IntRange(0, MAX_INTERVAL_MS),
    help="Silent milliseconds before the first chunk.",
)
@click.option("--model", default="fake-model", show_default=True, help="Model name in answers.")
@click.option(
    "--exit-on-sigterm",
    is_flag=True,
    default=False,
    help="Die at once on SIGTERM, cutting open streams (a model server that does not drain).",
)
@click.option(
    "--shutdown-timeout-secs",
    default=60.0,
    show_default=True,
    type=click.FloatRange(0),
    help="On a graceful SIGTERM, how long running streams may take before they are cancelled.",
)
def command(
    host: str,
    port: int,
    uds: str | None,
    chunks: int,
    interval_ms: int,
    first_token_ms: int,
    model: str,
    exit_on_sigterm: bool,
    shutdown_timeout_secs: float,
) -> None:
    """A stand-in OpenAI-compatible streaming model server, for demos and tests.

    POST /v1/completions and /v1/chat/completions ("stream": true for server-sent events, each
    chunk numbered by "seq", ending "data: [DONE]"); GET /health; GET /stats (started, finished,
    cancelled). It generates nothing real: it paces numbered chunks.
    """
    settings = Settings(chunks=chunks, interval_ms=interval_ms, first_token_ms=first_token_ms, model=model)
    try:
        asyncio.run(
            serve(
                settings,
                host=host,
                port=port,
                uds=uds,
                exit_on_sigterm=exit_on_sigterm,
                shutdown_timeout=shutdown_timeout_secs,
            )
        )
    except OSError as exc:
        click.echo(f"fake-model: cannot listen: {exc}", err=True)
        sys.exit(2)
