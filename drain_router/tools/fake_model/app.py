"""The fake model's aiohttp application: one factory, :func:`make_app`, for the CLI and for tests.

A :class:`State` holds everything the server counts and everything a test may steer (``healthy``) or
wait for (``request_seen``, ``cancel_seen``). Completions in flight are tracked as tasks, so a
shutdown can wait for them and abort exactly the ones still running at its deadline.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import hashlib
import itertools
import json
import os
import time
import uuid
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler

from drain_router.tools.fake_model import openai, realtime


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
    sessions: dict[_Session, asyncio.Task[Any]] = dataclasses.field(default_factory=dict)
    """The ``/v1/realtime`` sessions open now, with their handler tasks."""
    sessions_opened: int = 0
    session_ends: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    """How the sessions that ended did: ``client_<code>`` (the client sent a Close with that code),
    ``server_<code>`` (this server closed first: 1001 at a shutdown), ``abnormal`` (the connection
    was lost without a Close)."""
    session_seen: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    @property
    def active(self) -> int:
        return self.started - self.finished - self.cancelled

    def stats(self) -> dict[str, int]:
        return {
            "started": self.started,
            "finished": self.finished,
            "cancelled": self.cancelled,
            "active": self.active,
            "sessions": len(self.sessions),
            "sessions_opened": self.sessions_opened,
            "sessions_closed": sum(self.session_ends.values()),
        }


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


# -- /v1/realtime: a WebSocket session with OpenAI-Realtime-shaped events. ---------------------------

#: How long a session waits for the client's Close reply after sending its own (aiohttp's default is 10 s).
SESSION_CLOSE_TIMEOUT_SECS = 2.0
#: The Close code a shutdown sends to the sessions still open at its deadline (RFC 6455 §7.4.1).
GOING_AWAY = int(aiohttp.WSCloseCode.GOING_AWAY)


class _Session:
    """One realtime session: reads client events, runs one response at a time, writes server events."""

    def __init__(self, ws: web.WebSocketResponse, settings: openai.Settings) -> None:
        self.ws, self.settings = ws, settings
        self.responding: asyncio.Task[None] | None = None
        self.server_close: int | None = None
        """The code of the Close this server sent first (a shutdown's), if it did."""
        prefix = "evt_" + uuid.uuid4().hex[:12]
        self._ids = (f"{prefix}_{n}" for n in itertools.count())

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send_str(json.dumps(event))

    async def respond(self, response: realtime.Response) -> None:
        rid = "resp_" + uuid.uuid4().hex[:16]
        await self.send(realtime.response_created(event_id=next(self._ids), response_id=rid))
        for seq in range(response.deltas):
            if seq and response.interval_ms:
                await asyncio.sleep(response.interval_ms / 1000)
            event = realtime.text_delta(event_id=next(self._ids), response_id=rid, seq=seq, total=response.deltas)
            await self.send(event)
        await self.send(realtime.response_done(event_id=next(self._ids), response_id=rid, deltas=response.deltas))

    async def handle(self, text: str) -> None:
        try:
            event = realtime.parse_client_event(text)
            if event["type"] == "response.create":
                if self.responding is not None and not self.responding.done():
                    raise realtime.BadEvent("conversation_already_has_active_response", "a response is in progress")
                asked = realtime.resolve_response(self.settings, event)
                self.responding = asyncio.create_task(self.respond(asked))
            elif event["type"] == "response.cancel":
                if self.responding is not None:
                    self.responding.cancel()
            elif event["type"] != "session.update":  # accepted, and nothing to change
                raise realtime.BadEvent("unknown_event", f"unknown event type {event['type']!r}")
        except realtime.BadEvent as exc:
            await self.send(realtime.error(event_id=next(self._ids), code=exc.code, message=str(exc)))

    async def run(self, request: web.Request) -> None:
        await self.ws.prepare(request)
        sid = "sess_" + uuid.uuid4().hex[:16]
        created = realtime.session_created(
            event_id=next(self._ids), session_id=sid, model=self.settings.model, server=os.getpid()
        )
        await self.send(created)
        try:
            async for msg in self.ws:  # pings are answered (autoping); a Close ends the loop (autoclose)
                if msg.type is aiohttp.WSMsgType.TEXT:
                    await self.handle(msg.data)
                elif msg.type is aiohttp.WSMsgType.BINARY:
                    await self.send(
                        realtime.error(event_id=next(self._ids), code="invalid_event", message="events are text")
                    )
        finally:
            if self.responding is not None:
                self.responding.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                    await self.responding


async def realtime_session(request: web.Request) -> web.StreamResponse:
    """``GET /v1/realtime`` (WebSocket): ``session.created``, then per ``response.create``:
    ``response.created``, ``response.text.delta`` x N (``response.deltas`` or ``max_output_tokens``,
    else ``--chunks``), every ``interval_ms`` (else ``--interval-ms``), ``response.done``."""
    state = request.app[STATE]
    state.last_headers = dict(request.headers)
    ws = web.WebSocketResponse(timeout=SESSION_CLOSE_TIMEOUT_SECS)
    if not ws.can_prepare(request).ok:
        raise web.HTTPBadRequest(text=json.dumps({"error": "a WebSocket handshake is expected"}))
    task = asyncio.current_task()
    assert task is not None
    session = _Session(ws, request.app[SETTINGS])
    state.sessions[session] = task
    state.sessions_opened += 1
    state.session_seen.set()
    try:
        await session.run(request)
    finally:
        state.sessions.pop(session, None)
        state.session_ends[_session_end(session)] += 1
    return ws


def _session_end(session: _Session) -> str:
    if session.server_close is not None:
        return f"server_{session.server_close}"
    code = session.ws.close_code
    if code is None or code == int(aiohttp.WSCloseCode.ABNORMAL_CLOSURE):
        return "abnormal"
    return f"client_{code}"


async def close_sessions(state: State, code: int = GOING_AWAY, message: bytes = b"server shutting down") -> int:
    """Send a Close with ``code`` to every open session and wait for their handlers (each waits up to
    ``SESSION_CLOSE_TIMEOUT_SECS`` for the client's Close). Returns how many there were."""
    open_now = list(state.sessions.items())
    for session, _ in open_now:
        session.server_close = code
    await asyncio.gather(*(s.ws.close(code=code, message=message) for s, _ in open_now), return_exceptions=True)
    tasks = [task for _, task in open_now]
    if tasks:
        await asyncio.wait(tasks, timeout=SESSION_CLOSE_TIMEOUT_SECS)
    return len(open_now)


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
async def track_busy(request: web.Request, handler: Handler) -> web.StreamResponse:
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
    app.router.add_get("/v1/realtime", realtime_session)
    app.router.add_get("/health", health)
    app.router.add_get("/stats", stats)
    app.router.add_get("/sse", sse)
    app.router.add_route("*", "/echo", echo)
    app.router.add_get("/cut", cut)
    app.router.add_get("/short", short)
    app.router.add_get("/lowercase-hops", lowercase_hops)
    app.router.add_route("*", "/status/{code}", status)
    return app
