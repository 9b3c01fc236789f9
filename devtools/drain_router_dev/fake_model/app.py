"""The fake model's aiohttp application: one factory, :func:`make_app`, for the CLI and for tests.

Here are the HTTP handlers; what they count is :class:`.state.State` (on the app under
:data:`.state.STATE`), and a realtime session's own conversation is :class:`.session.Session`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.typedefs import Handler

from drain_router_dev.fake_model import openai
from drain_router_dev.fake_model.batch import Batch
from drain_router_dev.fake_model.session import GOING_AWAY, SESSION_CLOSE_TIMEOUT_SECS, Session, end_of
from drain_router_dev.fake_model.state import SETTINGS, STATE, Generating, State

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


async def _event_stream(request: web.Request, events: AsyncIterator[str]) -> web.StreamResponse:
    """Answer with server-sent events: each of ``events`` as one ``data:`` event as soon as it comes,
    then ``data: [DONE]``. The completions and ``/sse`` both stream this way."""
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    async for data in events:
        await response.write(f"data: {data}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


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
    batch = request.app[STATE].batch
    with Generating(request), batch.generating():
        if gen.first_token_ms:
            await asyncio.sleep(gen.first_token_ms / 1000)
        if not gen.stream:
            if settings.batch_size:
                for _ in range(gen.chunks):
                    await batch.pause(gen.interval_ms, settings.batch_size)
            else:
                await asyncio.sleep(gen.chunks * gen.interval_ms / 1000)
            return web.json_response(openai.full_payload(gen, rid=rid, created=created, model=model))
        tokens = _chunks(gen, batch, settings.batch_size, rid=rid, created=created, model=model)
        return await _event_stream(request, tokens)


async def _chunks(
    gen: openai.Generation, batch: Batch, batch_size: int, *, rid: str, created: int, model: str
) -> AsyncIterator[str]:
    """A streamed completion's chunks (:func:`.openai.stream_chunks`), its tokens ``gen.interval_ms``
    apart, stretched by the load past ``batch_size`` (:meth:`Batch.pause`)."""
    for paced, chunk in openai.stream_chunks(gen, rid=rid, created=created, model=model):
        if paced:
            await batch.pause(gen.interval_ms, batch_size)
        yield json.dumps(chunk)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _completion(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _completion(request, chat=True)


async def health(request: web.Request) -> web.Response:
    status = request.app[STATE].status
    return web.json_response({"status": status}, status=200 if status == "ok" else 503)


async def stats(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE].stats())


#: The Content-Type prometheus_client gives its text format, as vLLM's /metrics answers.
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: a few of vLLM's gauges in the Prometheus text format, from the fake's counts
    (``vllm:num_requests_running`` is the streams generating now), and how many scrapes it answered."""
    state = request.app[STATE]
    state.metrics_scrapes += 1
    text = (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{model_name="{request.app[SETTINGS].model}"}} {state.active}\n'
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{model_name="{request.app[SETTINGS].model}"}} 0\n'
        "# HELP fake_model_metrics_scrapes_total Scrapes of /metrics answered.\n"
        "# TYPE fake_model_metrics_scrapes_total counter\n"
        f"fake_model_metrics_scrapes_total {state.metrics_scrapes}\n"
    )
    return web.Response(body=text.encode(), headers={"Content-Type": METRICS_CONTENT_TYPE})


async def models(request: web.Request) -> web.Response:
    name = request.app[SETTINGS].model
    return web.json_response({"object": "list", "data": [{"id": name, "object": "model", "owned_by": "drain-router"}]})


# -- /v1/realtime: a WebSocket session with OpenAI-Realtime-shaped events. ---------------------------


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
    session = Session(ws, request.app[SETTINGS])
    state.sessions[session] = task
    state.sessions_opened += 1
    state.session_seen.set()
    try:
        await session.run(request)
    finally:
        state.sessions.pop(session, None)
        state.session_ends[end_of(session)] += 1
    return ws


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
    with Generating(request):
        if first:
            await asyncio.sleep(first)
        return await _event_stream(request, _counted(n, every=iv, pad=pad))


async def _counted(n: int, *, every: float, pad: str) -> AsyncIterator[str]:
    """``/sse``'s events: ``0`` to ``n - 1`` (each with ``pad``), each followed by ``every`` s of pause."""
    for i in range(n):
        yield f"{i}{pad}"
        if every:
            await asyncio.sleep(every)


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
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/sse", sse)
    app.router.add_route("*", "/echo", echo)
    app.router.add_get("/cut", cut)
    app.router.add_get("/short", short)
    app.router.add_get("/lowercase-hops", lowercase_hops)
    app.router.add_route("*", "/status/{code}", status)
    return app
