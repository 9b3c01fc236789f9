"""The fake model's aiohttp application: one factory, :func:`make_app`, for the CLI and for tests.

A :class:`State` holds everything the server counts and everything a test may steer (``healthy``) or
wait for (``request_seen``, ``cancel_seen``). Completions in flight are tracked as tasks, so a
shutdown can wait for them and abort exactly the ones still running at its deadline.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import time
import uuid
from typing import Any

from aiohttp import web

from router.tools.fake_model import openai


@dataclasses.dataclass(slots=True, eq=False)
class State:
    """What one fake model server has seen. ``active`` is derived, so it can never drift."""

    started: int = 0
    """Completions (and ``/sse`` streams) whose handler began."""
    finished: int = 0
    """Completions written to the end (``[DONE]`` for streams)."""
    cancelled: int = 0
    """Completions abandoned: the client went away, or a shutdown aborted them at its deadline."""
    healthy: bool = True
    """``/health`` answers 200 only while this is true and no shutdown started; tests flip it."""
    shutting_down: bool = False
    last_headers: dict[str, str] = dataclasses.field(default_factory=dict)
    """The headers of the last completion, ``/sse`` or ``/echo`` request."""
    seen_ids: set[str] = dataclasses.field(default_factory=set)
    """``id`` query values of the completions and streams that reached the server."""
    request_seen: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    cancel_seen: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    inflight: set[asyncio.Task[Any]] = dataclasses.field(default_factory=set)
    """The handler tasks of the completions running now."""
    busy: set[object] = dataclasses.field(default_factory=set)
    """The connections (aiohttp's ``request.protocol``) with a request being handled: the others are
    idle keep-alive connections, which a shutdown closes at once."""

    @property
    def active(self) -> int:
        return self.started - self.finished - self.cancelled

    def stats(self) -> dict[str, int]:
        return {"started": self.started, "finished": self.finished, "cancelled": self.cancelled, "active": self.active}


SETTINGS = web.AppKey("settings", openai.Settings)
STATE = web.AppKey("state", State)

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class _Generating:
    """Counts one generation from start to end, whatever ends it, and tracks its task while it runs."""

    def __init__(self, request: web.Request) -> None:
        self.state = request.app[STATE]
        self.state.last_headers = dict(request.headers)
        if "id" in request.query:
            self.state.seen_ids.add(request.query["id"])

    def __enter__(self) -> None:
        self.state.started += 1
        self.state.request_seen.set()
        task = asyncio.current_task()
        assert task is not None
        self.state.inflight.add(task)
        task.add_done_callback(self.state.inflight.discard)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if kind is None:
            self.state.finished += 1
        elif issubclass(kind, (asyncio.CancelledError, ConnectionError)):
            # The client went away (a write to a closed connection, or aiohttp's handler cancellation
            # on disconnect), or a shutdown aborted us: either way the "generation" is abandoned.
            self.state.cancelled += 1
            self.state.cancel_seen.set()


async def _completion(request: web.Request, *, chat: bool) -> web.StreamResponse:
    try:
        body = await request.json() if request.can_read_body else {}
    except ValueError:
        raise openai.bad_request("the body is not JSON") from None
    if not isinstance(body, dict):
        raise openai.bad_request("the body must be a JSON object")
    settings = request.app[SETTINGS]
    gen = openai.resolve(settings, body, request.query, chat=chat)
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:16]
    created, model = int(time.time()), str(body.get("model") or settings.model)
    with _Generating(request):
        if gen.first_token_ms:
            await asyncio.sleep(gen.first_token_ms / 1000)
        if not gen.stream:
            await asyncio.sleep(gen.chunks * gen.interval_ms / 1000)
            return web.json_response(openai.full_payload(gen, rid=rid, created=created, model=model))
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)
        for seq in range(gen.chunks):
            if seq:
                await asyncio.sleep(gen.interval_ms / 1000)
            chunk = openai.chunk_payload(gen, rid=rid, created=created, model=model, seq=seq)
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    return response


async def completions(request: web.Request) -> web.StreamResponse:
    return await _completion(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _completion(request, chat=True)


async def health(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.shutting_down:
        return web.json_response({"status": "shutting_down"}, status=503)
    if not state.healthy:
        return web.json_response({"status": "unhealthy"}, status=503)
    return web.json_response({"status": "ok"})


async def stats(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE].stats())


async def models(request: web.Request) -> web.Response:
    name = request.app[SETTINGS].model
    return web.json_response({"object": "list", "data": [{"id": name, "object": "model", "owned_by": "drain-router"}]})


# -- The testing kit's extra routes: shapes a proxy must relay, and failures it must survive. ------


async def sse(request: web.Request) -> web.StreamResponse:
    """``/sse?n=N&iv=SECS&first=SECS&pad=BYTES``: ``first`` s of silence (a prefill), then N events
    ``data: i`` (plus ``pad`` filler bytes) every ``iv`` s, then ``data: [DONE]``."""
    n, iv = int(request.query.get("n", 5)), float(request.query.get("iv", 0.01))
    first, pad = float(request.query.get("first", 0)), "x" * int(request.query.get("pad", 0))
    with _Generating(request):
        if first:
            await asyncio.sleep(first)
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)
        for i in range(n):
            await response.write(f"data: {i}{pad}\n\n".encode())
            if iv:
                await asyncio.sleep(iv)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    return response


async def echo(request: web.Request) -> web.Response:
    """Reads the whole body as it streams in; answers its size, digest and the headers seen."""
    request.app[STATE].last_headers = dict(request.headers)
    digest, size = hashlib.sha256(), 0
    async for data in request.content.iter_any():
        digest.update(data)
        size += len(data)
    answer = {
        "method": request.method,
        "path_qs": request.path_qs,
        "size": size,
        "sha256": digest.hexdigest(),
        "headers": dict(request.headers),
    }
    hops = {"Keep-Alive": "timeout=5", "X-Upstream": "yes", "Connection": "X-Drop-Me", "X-Drop-Me": "1"}
    return web.json_response(answer, headers=hops)


async def _abort_after(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    await asyncio.sleep(0.05)
    assert request.transport is not None
    request.transport.abort()
    return response


async def cut(request: web.Request) -> web.StreamResponse:
    """``/cut?n=N``: N events, then the connection is aborted mid-stream (a crashed model server)."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for i in range(int(request.query.get("n", 2))):
        await response.write(f"data: {i}\n\n".encode())
    return await _abort_after(request, response)


async def short(request: web.Request) -> web.StreamResponse:
    """Promise 100 bytes, send 10, die: a crash before the small body is complete."""
    response = web.StreamResponse(headers={"Content-Length": "100"})
    await response.prepare(request)
    await response.write(b"0123456789")
    return await _abort_after(request, response)


async def lowercase_hops(request: web.Request) -> web.Response:
    """Hop-by-hop headers with lowercase names, as many servers send them."""
    hops = {"keep-alive": "timeout=5", "connection": "X-Drop-Lower", "x-drop-lower": "1", "x-kept": "yes"}
    return web.Response(text="ok", headers=hops)


async def status(request: web.Request) -> web.Response:
    return web.Response(status=int(request.match_info["code"]))


@web.middleware
async def track_busy(request: web.Request, handler: Any) -> web.StreamResponse:
    busy = request.app[STATE].busy
    busy.add(request.protocol)
    try:
        return await handler(request)
    finally:
        busy.discard(request.protocol)


def make_app(settings: openai.Settings, state: State | None = None) -> web.Application:
    """The fake model server. Run it with ``handler_cancellation=True`` (the CLI and the testing kit
    do) so a client that leaves is noticed during a silent prefill too, as a model server does."""
    app = web.Application(middlewares=[track_busy])
    app[SETTINGS] = settings
    app[STATE] = State() if state is None else state
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/stats", stats)
    app.router.add_get("/sse", sse)
    app.router.add_route("*", "/echo", echo)
    app.router.add_get("/cut", cut)
    app.router.add_get("/short", short)
    app.router.add_get("/lowercase-hops", lowercase_hops)
    app.router.add_route("*", "/status/{code}", status)
    return app
