"""The drain's span events on the spans of a real SIGTERM (``--tracing``): a request in flight at
SIGTERM gets ``drain_started``, one answered during the window gets ``connection_close_sent``, one
queued at closing ``refused_closing``, one cut at the deadline ``deadline_aborted``; a WebSocket
session gets ``websocket_1001_sent``, a gRPC call ``goaway_sent``."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator

import aiohttp
import grpc
import pytest
from aiohttp import WSMsgType, web

from drain_router.decisions import spans
from drain_router_dev.process import wait_until
from tests import grpcupstream, otlp, rawupstream
from tests.tracing.conftest import StartTraced

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
ERROR = 2


async def _fetch(port: int, path: str) -> tuple[int, dict[str, str]] | None:
    """A GET through the router; None when the connection was cut (the deadline)."""
    try:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}{path}") as resp:
            await resp.read()
            return resp.status, dict(resp.headers)
    except aiohttp.ClientError:
        return None


async def test_drain_events_on_http_spans(
    start_traced: StartTraced, receiver: otlp.Receiver, raw_upstream: rawupstream.RawUpstream
) -> None:
    """0. /echo before any drain 1. /silent (never answered) is in flight, two admission slots 2. SIGTERM (a 2 s window, the
    deadline 3 s after it) 3. /echo in the window 4. a second /silent takes the other slot 5. a third
    request waits in the queue 6. closing refuses it 7. the deadline cuts both /silent.
    Result: the first /silent has drain_started and deadline_aborted (an error); the second only
    deadline_aborted; /echo in the window has connection_close_sent (the one before, no event); the
    queued one refused_closing."""
    p = await start_traced(
        raw_upstream.url,
        "--termination-grace-secs",
        "5",
        "--max-concurrent-requests",
        "2",
        "--tracing-keep-query",  # the spans are told apart by their query values
        drain_secs="2",
    )
    before = await _fetch(p.port, "/echo?before=1")
    assert before is not None and before[1].get("Connection") != "close"
    first = asyncio.ensure_future(_fetch(p.port, "/silent?n=1"))
    await wait_until(lambda: raw_upstream.paths().count("/silent") == 1, timeout=5, what="the first /silent")
    p.signal(signal.SIGTERM)
    await p.wait_event("drain.start")
    answer = await _fetch(p.port, "/echo")
    assert answer is not None and answer[1].get("Connection") == "close"
    second = asyncio.ensure_future(_fetch(p.port, "/silent?n=2"))
    await wait_until(lambda: raw_upstream.paths().count("/silent") == 2, timeout=5, what="the second /silent")
    queued = asyncio.ensure_future(_fetch(p.port, "/echo?queued=1"))
    refused = await queued
    assert refused is not None and refused[0] == 503
    assert await first is None and await second is None
    assert await p.wait(10) == 1
    got = await receiver.wait_spans(5)
    by_target = {(s.attributes["url.path"], s.attributes.get("url.query", "")): s for s in got}
    one, two = by_target[("/silent", "n=1")], by_target[("/silent", "n=2")]
    assert one.events == [spans.DRAIN_STARTED, spans.DEADLINE_ABORTED]
    assert (one.status_code, one.attributes["drain_router.outcome"]) == (ERROR, "deadline_aborted")
    assert two.events == [spans.DEADLINE_ABORTED]
    assert by_target[("/echo", "")].events == [spans.CONNECTION_CLOSE_SENT]
    assert by_target[("/echo", "before=1")].events == []
    assert by_target[("/echo", "queued=1")].events == [spans.REFUSED_CLOSING]


@pytest.fixture
async def ws_upstream() -> AsyncIterator[tuple[str, list[str]]]:
    """A WebSocket echo server recording each handshake's traceparent."""
    parents: list[str] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        parents.append(request.headers.get("traceparent", ""))
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                await ws.send_str(msg.data)
        return ws

    app = web.Application()
    app.router.add_get("/v1/realtime", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", parents
    finally:
        await runner.cleanup()


async def test_a_websocket_session_is_one_span_with_its_1001(
    start_traced: StartTraced, receiver: otlp.Receiver, ws_upstream: tuple[str, list[str]]
) -> None:
    """1. a session opens with a traceparent 2. SIGTERM (no window; --websocket-close-at closing)
    Result: one span for the session, the handshake upstream its child; drain_started and
    websocket_1001_sent on it; the client got Close 1001."""
    url, parents = ws_upstream
    p = await start_traced(url, "--websocket-close-at", "closing")
    async with aiohttp.ClientSession() as s:
        headers = {"traceparent": f"00-{TRACE}-{PARENT}-01"}
        async with s.ws_connect(f"http://127.0.0.1:{p.port}/v1/realtime", headers=headers) as ws:
            await ws.send_str("hello")
            assert (await ws.receive(timeout=5)).data == "hello"
            p.signal(signal.SIGTERM)
            msg = await ws.receive(timeout=5)
            assert (msg.type, msg.data) == (WSMsgType.CLOSE, 1001)
    [span] = await receiver.wait_spans(1)
    assert (span.trace_id, span.parent_span_id) == (TRACE, PARENT)
    assert parents == [f"00-{TRACE}-{span.span_id}-01"]
    assert span.attributes["drain_router.kind"] == "websocket"
    assert span.attributes["http.response.status_code"] == 101
    assert span.events == [spans.DRAIN_STARTED, spans.WEBSOCKET_1001_SENT]


@pytest.fixture
async def grpc_up() -> AsyncIterator[grpcupstream.Upstream]:
    async with grpcupstream.running() as up:
        yield up


async def test_grpc_calls_continue_the_trace_and_get_goaway_and_the_deadline(
    start_traced: StartTraced, receiver: otlp.Receiver, grpc_up: grpcupstream.Upstream
) -> None:
    """1. a unary call with a traceparent 2. a streaming call in flight 3. SIGTERM (no window, the
    deadline 1 s after it). Result: the unary call's span continues the client's trace and is the
    upstream's parent, with the RPC attributes; the stream's span has drain_started, goaway_sent and
    deadline_aborted, and is an error (grpc-status 14)."""
    p = await start_traced(
        "http://127.0.0.1:9",
        "--grpc-port",
        "0",
        "--grpc-upstream",
        f"http://127.0.0.1:{grpc_up.port}",
        "--termination-grace-secs",
        "3",
    )
    async with grpcupstream.channel(p.grpc_port) as ch:
        metadata = (("traceparent", f"00-{TRACE}-{PARENT}-01"),)
        assert await grpcupstream.method(ch, "Echo")(b"hi", metadata=metadata, timeout=5) == b"hi"
        [unary] = await receiver.wait_spans(1)
        assert (unary.name, unary.trace_id, unary.parent_span_id) == ("t.T/Echo", TRACE, PARENT)
        assert grpc_up.metadata[-1]["traceparent"] == f"00-{TRACE}-{unary.span_id}-01"
        attrs = unary.attributes
        assert (attrs["rpc.system"], attrs["rpc.service"], attrs["rpc.method"]) == ("grpc", "t.T", "Echo")
        assert attrs["rpc.grpc.status_code"] == 0
        assert attrs["drain_router.outcome"] == "completed"
        call = grpcupstream.method(ch, "Stream")(b"100 100")
        await grpc_up.wait_active(1)
        p.signal(signal.SIGTERM)
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for _ in call:
                pass
        assert await call.code() == grpc.StatusCode.UNAVAILABLE
    got = await receiver.wait_spans(1, **{"rpc.method": "Stream"})
    stream = got[0]
    assert stream.events == [spans.DRAIN_STARTED, spans.GOAWAY_SENT, spans.DEADLINE_ABORTED]
    assert stream.status_code == ERROR
    assert stream.attributes["rpc.grpc.status_code"] == 14
