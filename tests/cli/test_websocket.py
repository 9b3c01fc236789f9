"""WebSocket tunnels through a real ``drain-router serve`` process, black-box.

A real WebSocket client (aiohttp's ``ws_connect``) talks through the router to a small aiohttp
WebSocket upstream: messages both ways, ping/pong, close codes from either side, a 16 MiB message,
a stalled reader with bounded router memory. Raw sockets for what a library would never send: a 101
without (or with a wrong) ``Sec-WebSocket-Accept``, a 2^63 frame length, frames pipelined before
the 101. The drain: sessions work through the window; at the deadline Close 1001 both ways.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import itertools
import os
import signal
import struct
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType, web
from prometheus_client.parser import text_string_to_metric_families

from drain_router.decisions.websocket_close import WEBSOCKET_QUIET_SECS
from drain_router_dev.process import wait_until
from tests.blackbox import by_outcome, inflight, requests_total, wait_idle
from tests.process import RouterProcess, Start, router_starter

KEY = base64.b64encode(b"0123456789abcdef").decode()


@dataclass
class WsUpstream:
    port: int = 0
    closes: list[int | None] = field(default_factory=list)
    received: list[str | bytes] = field(default_factory=list)
    """Every text or binary message the upstream received, in order."""
    """The close code of each session, as the upstream saw it."""
    sessions: int = 0
    reading: asyncio.Event = field(default_factory=asyncio.Event)
    """``/v1/stalled`` reads nothing until this is set."""
    flooded: int = 0
    """Messages of a ``flood:N`` the upstream has written so far."""
    flooding: Any = None
    """The protocol of the connection being flooded: its ``writing_paused`` says the router
    stopped reading the upstream."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


UPSTREAM = web.AppKey("upstream", WsUpstream)


async def _ws_handler(request: web.Request) -> web.StreamResponse:
    upstream = request.app[UPSTREAM]
    ws = web.WebSocketResponse(autoping=True, max_msg_size=0)
    await ws.prepare(request)
    upstream.sessions += 1
    async for msg in ws:
        if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
            upstream.received.append(msg.data)
        if msg.type == WSMsgType.TEXT:
            if msg.data.startswith("close:"):
                await ws.close(code=int(msg.data[6:]))
                break
            if msg.data.startswith("mute:"):  # received, not answered: the client's direction only
                continue
            if msg.data.startswith("tick:"):  # tick:N:MS, N messages MS apart: the upstream's direction only
                count, interval_ms = (int(x) for x in msg.data[5:].split(":"))
                for i in range(count):
                    await asyncio.sleep(interval_ms / 1000)
                    await ws.send_str(f"tick {i}")
                continue
            if msg.data.startswith("flood:"):  # send this many 64 KiB binary messages
                chunk = os.urandom(64 * 1024)
                upstream.flooding = request.protocol
                for _ in range(int(msg.data[6:])):
                    await ws.send_bytes(chunk)
                    upstream.flooded += 1
                continue
            await ws.send_str("echo:" + msg.data)
        elif msg.type == WSMsgType.BINARY:
            await ws.send_bytes(msg.data)
    upstream.closes.append(ws.close_code)
    return ws


async def _stalled_handler(request: web.Request) -> web.StreamResponse:
    upstream = request.app[UPSTREAM]
    ws = web.WebSocketResponse(max_msg_size=0)
    await ws.prepare(request)
    await upstream.reading.wait()
    count = 0
    async for msg in ws:
        if msg.type == WSMsgType.BINARY:
            count += 1
            if count == FLOOD:
                await ws.send_str("got all")
    return ws


@pytest.fixture
async def ws_upstream() -> AsyncIterator[WsUpstream]:
    upstream = WsUpstream()
    app = web.Application()
    app[UPSTREAM] = upstream
    app.router.add_get("/v1/realtime", _ws_handler)
    app.router.add_get("/v1/stalled", _stalled_handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    upstream.port = runner.addresses[0][1]
    try:
        yield upstream
    finally:
        await runner.cleanup()


@pytest.fixture
async def start_process(ws_upstream) -> AsyncIterator[Start]:
    async with router_starter(ws_upstream.url) as start:
        yield start


async def _outcomes(p: RouterProcess) -> dict[str, float]:
    return by_outcome(await requests_total(p.admin_port))


async def _sessions_gauge(p: RouterProcess) -> float:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{p.admin_port}/metrics") as resp:
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        if family.name == "drain_router_websocket_sessions":
            return family.samples[0].value
    raise AssertionError("no drain_router_websocket_sessions")


# -- through a WebSocket library ---------------------------------------------------------------


async def test_messages_both_ways_ping_and_close_codes(start_process, ws_upstream):
    p = await start_process()
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(f"http://127.0.0.1:{p.port}/v1/realtime", autoping=False) as ws:
            assert (await inflight(p.admin_port))["inflight"] == 1
            assert await _sessions_gauge(p) == 1
            await ws.send_str("hello")
            assert (await ws.receive(timeout=5)).data == "echo:hello"
            await ws.send_bytes(b"\x00\x01\xff")
            assert (await ws.receive(timeout=5)).data == b"\x00\x01\xff"
            await ws.ping(b"are you there")
            pong = await ws.receive(timeout=5)
            assert (pong.type, pong.data) == (WSMsgType.PONG, b"are you there")
            await ws.close(code=4000)
        await wait_until(lambda: ws_upstream.closes == [4000], timeout=5, what="the upstream saw 4000")
        # Closed by the upstream, with its code.
        async with s.ws_connect(f"http://127.0.0.1:{p.port}/v1/realtime") as ws:
            await ws.send_str("close:4001")
            msg = await ws.receive(timeout=5)
            assert (msg.type, msg.data) == (WSMsgType.CLOSE, 4001)
    await wait_idle(p.admin_port)
    assert (await _outcomes(p)).get("completed") == 2
    assert await _sessions_gauge(p) == 0


async def test_a_session_holds_an_admission_slot_until_it_closes(start_process, ws_upstream):
    """With ``--max-concurrent-requests 1`` an open session holds the one slot: a second handshake
    waits in the queue (the model server never sees it) and gets its 101 the moment the first
    session closes; a third, past the queue timeout, gets 503 with Retry-After, never the model
    server."""
    p = await start_process("--max-concurrent-requests", "1", "--queue-size", "1", "--queue-timeout-secs", "1")
    url = f"http://127.0.0.1:{p.port}/v1/realtime"

    async def counts() -> tuple[object, object]:
        report = await inflight(p.admin_port)
        return report["inflight"], report["queued"]

    async with aiohttp.ClientSession() as s:
        first = await s.ws_connect(url)
        second = asyncio.create_task(s.ws_connect(url))
        await wait_until(counts, 5, "the second handshake queued", until=lambda c: c == (1, 1))
        assert ws_upstream.sessions == 1
        await first.close()
        async with await asyncio.wait_for(second, 5) as ws:
            await wait_until(lambda: ws_upstream.sessions, 5, "the second session open", until=lambda n: n == 2)
            await ws.send_str("hello")
            assert (await ws.receive(timeout=5)).data == "echo:hello"
            async with s.get(
                url,
                headers={
                    "Connection": "Upgrade",
                    "Upgrade": "websocket",
                    "Sec-WebSocket-Version": "13",
                    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                },
            ) as third:
                assert third.status == 503
                assert int(third.headers["Retry-After"]) >= 1 and int(third.headers["retry-after-ms"]) >= 1000
            assert ws_upstream.sessions == 2
    await wait_idle(p.admin_port)
    assert await _outcomes(p) == {"completed": 2, "rejected": 1}


async def test_a_16_mib_message_both_ways(start_process, ws_upstream):
    p = await start_process()
    big = os.urandom(16 * 1024 * 1024)
    async with (
        aiohttp.ClientSession() as s,
        s.ws_connect(f"http://127.0.0.1:{p.port}/v1/realtime", max_msg_size=0) as ws,
    ):
        await ws.send_bytes(big)
        assert (await ws.receive(timeout=30)).data == big
    await wait_idle(p.admin_port)


def _peak_rss(p: RouterProcess) -> int:
    """The router's peak resident set size so far (``VmHWM``): a peak, so nothing between two
    samples is missed."""
    for line in Path(f"/proc/{p.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


async def _blocked(
    p: RouterProcess, progress: Callable[[], int], paused: Callable[[], bool], done: Callable[[], bool]
) -> None:
    """Wait until a flood's writer is blocked: its transport paused, and still paused with no
    progress after three round trips through the router's event loop (its admin listener runs on
    the same loop), each a turn in which a router that read regardless would take more. Returns at
    once when the whole flood was sent."""

    async def blocked_or_done() -> tuple[bool, int]:
        if done():
            return True, progress()
        if paused():
            before = progress()
            for _ in range(3):
                await inflight(p.admin_port)
            if paused() and progress() == before:
                return True, before
        return False, progress()

    await wait_until(
        blocked_or_done, 30, "the flood to block or finish (blocked?, bytes sent)", until=lambda seen: seen[0]
    )


FLOOD = 2048
"""64 KiB messages: 128 MiB, far more than every buffer on the way together."""
MEMORY_BOUND = 8 * 1024 * 1024
"""Growth of the router's peak RSS allowed over a flood: 128 MiB without back-pressure; under 1 MiB with it."""


async def test_a_stalled_reader_costs_bounded_router_memory(start_process, ws_upstream):
    """The upstream floods 128 MiB at a client that does not read: the router stops reading the
    upstream, whose writes block; when the client reads, everything arrives. The router's peak
    memory over the whole test stays bounded."""
    p = await start_process()
    peak = _peak_rss(p)
    async with (
        aiohttp.ClientSession() as s,
        s.ws_connect(f"http://127.0.0.1:{p.port}/v1/realtime", max_msg_size=0) as ws,
    ):
        await ws.send_str(f"flood:{FLOOD}")
        await _blocked(
            p,
            lambda: ws_upstream.flooded,
            lambda: ws_upstream.flooding is not None and ws_upstream.flooding.writing_paused,
            lambda: ws_upstream.flooded == FLOOD,
        )
        assert ws_upstream.flooded < FLOOD, "the router read the whole flood the client did not read"
        got = 0
        while got < FLOOD:
            msg = await ws.receive(timeout=30)
            assert msg.type == WSMsgType.BINARY
            got += 1
    grown = _peak_rss(p) - peak
    assert grown < MEMORY_BOUND, f"router peak RSS grew {grown} bytes"
    await wait_idle(p.admin_port)


# -- raw sockets -------------------------------------------------------------------------------


def _handshake(extra: str = "") -> bytes:
    return (
        "GET /v1/realtime HTTP/1.1\r\nHost: model\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        f"Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
    ).encode()


def _masked(opcode: int, payload: bytes) -> bytes:
    mask = b"\x01\x02\x03\x04"
    n = len(payload)
    head = bytes([0x80 | opcode]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack("!H", n))
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)


async def _read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    b0, b1 = await asyncio.wait_for(reader.readexactly(2), 5)
    n = b1 & 0x7F
    if n == 126:
        n = struct.unpack("!H", await reader.readexactly(2))[0]
    return b0 & 0x0F, await asyncio.wait_for(reader.readexactly(n), 5)


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(
            b"GET /v1/realtime HTTP/1.1\r\nHost: model\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            b"Sec-WebSocket-Version: 13\r\n\r\n",
            id="no-key",
        ),
        pytest.param(_handshake().replace(b"GET ", b"POST ", 1), id="post"),
        pytest.param(_handshake().replace(b"HTTP/1.1", b"HTTP/1.0", 1), id="http-1.0"),
    ],
)
async def test_a_bad_handshake_is_a_400_and_never_reaches_the_model_server(start_process, ws_upstream, request_bytes):
    p = await start_process()
    reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
    writer.write(request_bytes)
    head = await _read_head(reader)
    assert head.startswith(b"HTTP/1.1 400 "), head
    body = await asyncio.wait_for(reader.read(), 5)
    assert b"bad_websocket_handshake" in body
    writer.close()
    await wait_idle(p.admin_port)
    assert ws_upstream.sessions == 0
    assert (await _outcomes(p)) == {"rejected": 1.0}


async def test_frames_pipelined_before_the_101_are_forwarded_after_it(start_process):
    p = await start_process()
    reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
    writer.write(_handshake() + _masked(1, b"early"))
    head = await _read_head(reader)
    assert head.startswith(b"HTTP/1.1 101 ")
    assert await _read_frame(reader) == (1, b"echo:early")
    writer.close()
    await wait_idle(p.admin_port)


async def test_a_handshake_pipelined_after_a_request_keeps_its_early_frames(start_process):
    """The handshake is the second head of one read: what follows it is found from the start of the
    read, not of the handshake's own chunk."""
    p = await start_process()
    reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
    writer.write(b"GET /nothing HTTP/1.1\r\nHost: model\r\n\r\n" + _handshake() + _masked(1, b"early"))
    first = await _read_head(reader)
    assert first.startswith(b"HTTP/1.1 404 "), first
    length = next(
        int(line.split(b":")[1]) for line in first.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
    await asyncio.wait_for(reader.readexactly(length), 5)
    assert (await _read_head(reader)).startswith(b"HTTP/1.1 101 ")
    assert await _read_frame(reader) == (1, b"echo:early")
    writer.close()
    await wait_idle(p.admin_port)


async def test_a_frame_length_with_its_top_bit_set_closes_the_tunnel(start_process):
    p = await start_process()
    reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
    writer.write(_handshake())
    assert (await _read_head(reader)).startswith(b"HTTP/1.1 101 ")
    writer.write(b"\x82\xff" + struct.pack("!Q", 1 << 63) + b"\x00\x00\x00\x00")
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    await wait_idle(p.admin_port)
    assert (await _outcomes(p)).get("client_aborted") == 1


async def _fake_upstream(answer: bytes) -> tuple[asyncio.Server, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        await reader.read()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.parametrize(
    "accept",
    ["", "Sec-WebSocket-Accept: AAAAAAAAAAAAAAAAAAAAAAAAAAA=\r\n"],
    ids=["no-accept", "wrong-accept"],
)
async def test_a_101_without_the_right_accept_is_a_502(ws_upstream, accept):
    server, port = await _fake_upstream(
        f"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n{accept}\r\n".encode()
    )
    async with server, router_starter(f"http://127.0.0.1:{port}") as start:
        p = await start()
        reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
        writer.write(_handshake())
        assert (await _read_head(reader)).startswith(b"HTTP/1.1 502 ")
        writer.close()
        await wait_idle(p.admin_port)
        assert (await _outcomes(p)).get("upstream_error") == 1


async def test_an_answer_other_than_101_is_relayed_as_a_response(ws_upstream):
    server, port = await _fake_upstream(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 2\r\n\r\nno")
    async with server, router_starter(f"http://127.0.0.1:{port}") as start:
        p = await start()
        reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
        writer.write(_handshake())
        assert (await _read_head(reader)).startswith(b"HTTP/1.1 403 ")
        assert await asyncio.wait_for(reader.read(), 5) == b"no"
        writer.close()
        await wait_idle(p.admin_port)


# -- the drain ---------------------------------------------------------------------------------


async def _session(port: int) -> tuple[aiohttp.ClientSession, Any]:
    s = aiohttp.ClientSession()
    ws = await s.ws_connect(f"http://127.0.0.1:{port}/v1/realtime")
    return s, ws


async def test_at_the_deadline_the_session_gets_1001_both_ways(start_process, ws_upstream):
    p = await start_process(
        "--termination-grace-secs", "4", "--websocket-close-at", "deadline", "--access-log", drain_secs="1"
    )
    s, ws = await _session(p.port)
    try:
        p.signal(signal.SIGTERM)
        await p.wait_event("drain.closing")
        await ws.send_str("still here")
        assert (await ws.receive(timeout=5)).data == "echo:still here"
        msg = await ws.receive(timeout=10)
        assert (msg.type, msg.data) == (WSMsgType.CLOSE, 1001)
        await wait_until(lambda: ws_upstream.closes == [1001], timeout=5, what="the upstream saw a masked 1001")
        assert await p.wait(10) == 1
        deadline = await p.wait_event("drain.deadline")
        assert deadline["aborted"] == 1
        assert [e["outcome"] for e in p.events if e.get("event") == "request"] == ["deadline_aborted"]
    finally:
        await ws.close()
        await s.close()


async def test_with_close_at_closing_the_1001_comes_at_closing(start_process, ws_upstream):
    """The drain window still serves the session; closing sends the 1001 at once, long before the
    deadline, and the router exits 0 as soon as the closing handshakes are done."""
    p = await start_process(
        "--termination-grace-secs", "60", "--websocket-close-at", "closing", "--access-log", drain_secs="1"
    )
    s, ws = await _session(p.port)
    try:
        p.signal(signal.SIGTERM)
        await p.wait_event("drain.start")
        await ws.send_str("in the window")
        assert (await ws.receive(timeout=5)).data == "echo:in the window"
        msg = await ws.receive(timeout=10)
        assert (msg.type, msg.data) == (WSMsgType.CLOSE, 1001)
        assert "drain.closing" in p.names()
        await wait_until(lambda: ws_upstream.closes == [1001], timeout=5, what="the upstream saw a masked 1001")
        assert await p.wait(10) == 0
        assert [e["outcome"] for e in p.events if e.get("event") == "request"] == ["completed"]
    finally:
        await ws.close()
        await s.close()


QUIET = WEBSOCKET_QUIET_SECS
MARGIN = 2.0
"""How late a 1001 may come after the moment it is due (process start-up noise on a busy machine)."""
PACE = 0.5
"""Seconds between the frames of a session kept busy: well within the quiet period."""


async def _talk(ws: Any, direction: str, secs: float) -> None:
    """Keep a session busy for ``secs``, a frame every :data:`PACE` in ``direction`` (``both``: the
    client's and the upstream's echo; ``client``: the client's only; ``upstream``: the upstream's
    only). Fails if anything but the expected frames arrives (a Close)."""
    count = int(secs / PACE)
    if direction == "upstream":
        await ws.send_str(f"tick:{count}:{int(PACE * 1000)}")
        for i in range(count):
            msg = await ws.receive(timeout=PACE + 5)
            assert (msg.type, msg.data) == (WSMsgType.TEXT, f"tick {i}")
        return
    for i in range(count):
        if direction == "both":
            await ws.send_str(f"busy {i}")
            msg = await ws.receive(timeout=5)
            assert (msg.type, msg.data) == (WSMsgType.TEXT, f"echo:busy {i}")
            await asyncio.sleep(PACE)  # the client's pace between frames, not a wait for an event
        else:
            await ws.send_str(f"mute:{i}")
            with contextlib.suppress(TimeoutError):  # nothing may arrive before the next frame is due
                msg = await ws.receive(timeout=PACE)
                raise AssertionError(f"the session got {msg.type} {msg.data!r} while the client was talking")


async def _closed_1001(ws: Any, timeout: float) -> float:
    """Wait for the router's Close 1001; return when it came (``time.monotonic()``)."""
    msg = await ws.receive(timeout=timeout)
    assert (msg.type, msg.data) == (WSMsgType.CLOSE, 1001)
    return time.monotonic()


async def _busy_until_closed(ws: Any, pace: float, timeout: float) -> Any:
    """Messages both ways every ``pace`` until the router's Close (within ``timeout``): the Close."""
    async with asyncio.timeout(timeout):
        for i in itertools.count():
            with contextlib.suppress(aiohttp.ClientConnectionResetError):  # the Close came in meanwhile
                await ws.send_str(f"busy {i}")
            msg = await ws.receive()
            if msg.type == WSMsgType.CLOSE:
                return msg
            assert msg.data == f"echo:busy {i}"
            await asyncio.sleep(pace)  # the client's pace between frames, not a wait for an event
    raise AssertionError("unreachable")


@pytest.mark.parametrize("flag", [("--websocket-close-at", "idle"), ()], ids=["idle", "the-default"])
async def test_idle_a_session_quiet_at_closing_gets_1001_after_the_quiet_period(start_process, ws_upstream, flag):
    """Quiet from the window on: its 1001 comes once it has been quiet for the quiet period, long
    before the deadline (60 s), and the router exits 0 as soon as the closing handshakes are done.
    ``idle`` is the default."""
    p = await start_process("--termination-grace-secs", "60", *flag, "--access-log", drain_secs="1")
    s, ws = await _session(p.port)
    try:
        p.signal(signal.SIGTERM)
        await p.wait_event("drain.start")
        await ws.send_str("in the window")
        assert (await ws.receive(timeout=5)).data == "echo:in the window"
        last_frame = time.monotonic()
        closed = await _closed_1001(ws, QUIET + MARGIN + 1)
        assert "drain.closing" in p.names()
        assert QUIET - 0.3 <= closed - last_frame <= QUIET + MARGIN
        await wait_until(lambda: ws_upstream.closes == [1001], timeout=5, what="the upstream saw a masked 1001")
        assert await p.wait(10) == 0
        assert [e["outcome"] for e in p.events if e.get("event") == "request"] == ["completed"]
    finally:
        await ws.close()
        await s.close()


@pytest.mark.parametrize("direction", ["both", "client", "upstream"])
async def test_idle_a_busy_session_gets_1001_only_once_quiet(start_process, ws_upstream, direction):
    """Frames in either direction through closing and past the quiet period keep the session; once
    they stop, the 1001 comes after the quiet period."""
    p = await start_process("--termination-grace-secs", "60", "--websocket-close-at", "idle", drain_secs="1")
    s, ws = await _session(p.port)
    try:
        p.signal(signal.SIGTERM)
        await p.wait_event("drain.start")
        await _talk(ws, direction, 1 + QUIET + 1.5)  # the window, then more than a quiet period of closing
        assert "drain.closing" in p.names()
        last_frame = time.monotonic()
        closed = await _closed_1001(ws, QUIET + MARGIN + 1)
        assert QUIET - 0.3 - PACE <= closed - last_frame <= QUIET + MARGIN
        assert await p.wait(10) == 0
    finally:
        await ws.close()
        await s.close()


async def test_idle_a_session_never_quiet_gets_1001_at_the_deadline(start_process, ws_upstream):
    p = await start_process(
        "--termination-grace-secs", "7", "--websocket-close-at", "idle", "--access-log", drain_secs="1"
    )
    s, ws = await _session(p.port)
    try:
        p.signal(signal.SIGTERM)
        await p.wait_event("drain.start")
        msg = await _busy_until_closed(ws, PACE, 15)  # the deadline is t0 + 5 s
        assert msg.data == 1001
        await p.wait_event("drain.deadline")
        assert await p.wait(10) == 1
        assert [e["outcome"] for e in p.events if e.get("event") == "request"] == ["deadline_aborted"]
    finally:
        await ws.close()
        await s.close()


async def test_deadline_mode_a_quiet_session_lives_until_the_deadline(start_process, ws_upstream):
    """``deadline`` is unchanged: a session quiet for longer than idle's quiet period keeps going."""
    p = await start_process(
        "--termination-grace-secs", str(int(QUIET) + 6), "--websocket-close-at", "deadline", drain_secs="1"
    )
    s, ws = await _session(p.port)
    try:
        signalled = time.monotonic()
        p.signal(signal.SIGTERM)
        closed = await _closed_1001(ws, QUIET + 10)
        assert closed - signalled >= QUIET + 3
        await p.wait_event("drain.deadline")
        assert await p.wait(10) == 1
    finally:
        await ws.close()
        await s.close()


async def test_closing_mode_a_busy_session_gets_1001_at_closing(start_process, ws_upstream):
    """``closing`` is unchanged: the 1001 comes at the start of closing, busy or not."""
    p = await start_process("--termination-grace-secs", "60", "--websocket-close-at", "closing", drain_secs="1")
    s, ws = await _session(p.port)
    try:
        p.signal(signal.SIGTERM)
        await p.wait_event("drain.start")
        msg = await _busy_until_closed(ws, 0.1, 10)
        assert msg.data == 1001
        closing = await p.wait_event("drain.closing")
        assert time.time() - closing["t0"] < 1 + MARGIN  # at closing (t0 + 1 s), not later
        assert await p.wait(10) == 0
    finally:
        await ws.close()
        await s.close()


async def test_a_handshake_with_a_body_is_a_400(start_process, ws_upstream):
    """Where the frames start would be the upstream's guess: refused, never forwarded."""
    p = await start_process()
    reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
    writer.write(_handshake("Content-Length: 5\r\n") + b"hello")
    assert (await _read_head(reader)).startswith(b"HTTP/1.1 400 ")
    writer.close()
    await wait_idle(p.admin_port)
    assert ws_upstream.sessions == 0


async def test_the_deadline_close_waits_for_the_frame_in_flight_to_end(start_process, ws_upstream):
    """A client frame half sent at the deadline: the client gets its 1001 at once, the upstream
    gets the rest of that frame and then the masked 1001, never a Close inside a frame."""
    p = await start_process("--termination-grace-secs", "3", "--websocket-close-at", "deadline")
    reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
    writer.write(_handshake())
    assert (await _read_head(reader)).startswith(b"HTTP/1.1 101 ")
    frame = _masked(1, b"finished after the deadline")
    writer.write(frame[:9])
    p.signal(signal.SIGTERM)
    assert await _read_frame(reader) == (8, struct.pack("!H", 1001))
    writer.write(frame[9:] + _masked(8, struct.pack("!H", 1001)))
    await wait_until(lambda: ws_upstream.closes == [1001], timeout=5, what="the upstream saw the frame, then 1001")
    assert ws_upstream.received == ["finished after the deadline"]
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    assert await p.wait(10) == 1


async def test_a_client_that_vanishes_is_client_aborted(start_process, ws_upstream):
    p = await start_process()
    reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
    writer.write(_handshake())
    assert (await _read_head(reader)).startswith(b"HTTP/1.1 101 ")
    writer.transport.abort()  # no Close frame
    await wait_until(lambda: len(ws_upstream.closes) == 1, timeout=5, what="the upstream connection closed")
    await wait_idle(p.admin_port)
    assert (await _outcomes(p)).get("client_aborted") == 1


async def test_an_upstream_that_vanishes_is_upstream_error_and_the_client_gets_1014(ws_upstream):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        key = next(
            line.split(b":", 1)[1].strip()
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"sec-websocket-key:")
        )
        accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: "
            + accept
            + b"\r\n\r\n"
        )
        await reader.readexactly(2)  # the client's first frame begins: the model server dies
        writer.transport.abort()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, router_starter(f"http://127.0.0.1:{port}") as start:
        p = await start()
        reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
        writer.write(_handshake())
        assert (await _read_head(reader)).startswith(b"HTTP/1.1 101 ")
        writer.write(_masked(1, b"anyone?"))
        assert await _read_frame(reader) == (8, struct.pack("!H", 1014))  # Close, Bad Gateway
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        await wait_idle(p.admin_port)
        assert (await _outcomes(p)).get("upstream_error") == 1


async def test_the_upstream_gets_a_masked_1001_at_the_deadline(ws_upstream):
    """Read by a raw model server, so the mask bit is checked (aiohttp does not insist on it)."""
    frames: list[tuple[int, bool, bytes]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        key = next(
            v.split(b":", 1)[1].strip() for v in head.split(b"\r\n") if v.lower().startswith(b"sec-websocket-key:")
        )
        accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n")
        writer.write(b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
        while True:
            b0, b1 = await reader.readexactly(2)
            mask = await reader.readexactly(4) if b1 & 0x80 else b"\0\0\0\0"
            payload = await reader.readexactly(b1 & 0x7F)
            frames.append((b0 & 0x0F, bool(b1 & 0x80), bytes(b ^ mask[i % 4] for i, b in enumerate(payload))))
            if b0 & 0x0F == 8:
                writer.write(b"\x88\x02\x03\xe9")
                await writer.drain()
                writer.close()
                return

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, router_starter(f"http://127.0.0.1:{port}") as start:
        p = await start("--termination-grace-secs", "3", "--websocket-close-at", "deadline")
        async with aiohttp.ClientSession() as s, s.ws_connect(f"http://127.0.0.1:{p.port}/v1/realtime") as ws:
            await ws.send_str("before")
            p.signal(signal.SIGTERM)
            msg = await ws.receive(timeout=10)
            assert (msg.type, msg.data) == (WSMsgType.CLOSE, 1001)
        await wait_until(lambda: len(frames) == 2, timeout=5, what="the upstream read a Close")
        assert frames == [(1, True, b"before"), (8, True, struct.pack("!H", 1001))]
        assert await p.wait(10) == 1


async def test_the_duration_histogram_covers_the_whole_session(start_process, ws_upstream):
    p = await start_process()
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(f"http://127.0.0.1:{p.port}/v1/realtime") as ws:
            opened = time.monotonic()
            for i in range(50):
                await ws.send_str(str(i))
                assert (await ws.receive(timeout=5)).data == f"echo:{i}"
            lived = time.monotonic() - opened
        await wait_idle(p.admin_port)
        async with s.get(f"http://127.0.0.1:{p.admin_port}/metrics") as resp:
            text = await resp.text()
    family = next(f for f in text_string_to_metric_families(text) if f.name == "drain_router_request_duration_seconds")
    samples = {sample.name: sample.value for sample in family.samples if not sample.labels}
    assert samples["drain_router_request_duration_seconds_count"] == 1
    assert samples["drain_router_request_duration_seconds_sum"] >= lived


async def test_a_model_server_that_stops_reading_costs_bounded_router_memory(start_process, ws_upstream):
    """The client sends 128 MiB to a model server that reads nothing: the router stops reading the
    client, whose sends block; when the model server reads again, everything arrives. The router's
    peak memory over the whole test stays bounded."""
    p = await start_process()
    peak = _peak_rss(p)
    chunk = os.urandom(64 * 1024)
    sent = 0
    async with (
        aiohttp.ClientSession() as s,
        s.ws_connect(f"http://127.0.0.1:{p.port}/v1/stalled", max_msg_size=0) as ws,
    ):

        async def send_all() -> None:
            nonlocal sent
            for _ in range(FLOOD):
                await ws.send_bytes(chunk)
                sent += 1

        sending = asyncio.ensure_future(send_all())
        protocol = ws._writer.protocol  # the client's connection: paused when the router stops reading it
        await _blocked(p, lambda: sent, lambda: protocol.writing_paused, sending.done)
        assert sent < FLOOD, "the router read all the client sent, for a model server that reads nothing"
        ws_upstream.reading.set()
        await asyncio.wait_for(sending, 60)
        assert (await ws.receive(timeout=30)).data == "got all"
    grown = _peak_rss(p) - peak
    assert grown < MEMORY_BOUND, f"router peak RSS grew {grown} bytes"
    await wait_idle(p.admin_port)


# -- one Close each way: a side that got its peer's Close gets no 1001 --------------------------------


@dataclass
class RawWsUpstream:
    """A model server on raw sockets for one session: it answers the handshake, records every frame
    it reads (opcode, masked, unmasked payload) until the router closes the connection (``ended``),
    and writes each piece put in ``out`` (``None``: it closes the connection)."""

    frames: list[tuple[int, bool, bytes]] = field(default_factory=list)
    out: asyncio.Queue[bytes | None] = field(default_factory=asyncio.Queue)
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        key = next(
            v.split(b":", 1)[1].strip() for v in head.split(b"\r\n") if v.lower().startswith(b"sec-websocket-key:")
        )
        accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n")
        writer.write(b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")

        async def write() -> None:
            while (piece := await self.out.get()) is not None:
                writer.write(piece)
                await writer.drain()
            writer.close()

        writing = asyncio.ensure_future(write())
        try:
            while True:
                b0, b1 = await reader.readexactly(2)
                n = b1 & 0x7F
                if n == 126:
                    n = struct.unpack("!H", await reader.readexactly(2))[0]
                mask = await reader.readexactly(4) if b1 & 0x80 else b"\0\0\0\0"
                payload = await reader.readexactly(n)
                self.frames.append((b0 & 0x0F, bool(b1 & 0x80), bytes(b ^ mask[i % 4] for i, b in enumerate(payload))))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.ended.set()
            writing.cancel()
            writer.close()


@contextlib.asynccontextmanager
async def _raw_ws_router(mode: str) -> AsyncIterator[tuple[RouterProcess, RawWsUpstream]]:
    """A router whose upstream is a :class:`RawWsUpstream`, sending its 1001 under ``mode`` (its
    deadline 3 s after SIGTERM under ``deadline``, out of reach under the others)."""
    upstream = RawWsUpstream()
    server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, router_starter(f"http://127.0.0.1:{port}") as start:
        grace = "3" if mode == "deadline" else "60"
        p = await start("--termination-grace-secs", grace, "--websocket-close-at", mode, "--access-log")
        yield p, upstream


CLOSE_1000 = struct.pack("!H", 1000)
CLOSE_1001 = struct.pack("!H", 1001)
#: How a session ends under each mode: its outcome, and the router's exit code once it is gone.
OUTCOME_AT = {"closing": ("completed", 0), "idle": ("completed", 0), "deadline": ("deadline_aborted", 1)}


@pytest.mark.parametrize("mode", sorted(OUTCOME_AT))
async def test_after_the_clients_close_the_upstream_gets_no_1001(mode):
    """The client sent Close and the model server has not answered yet when the router's 1001 is due:
    the model server already has a Close (the client's), so it gets no second one (RFC 6455 §5.5.1);
    the client gets the router's 1001 as the answer to its Close, and nothing after it."""
    async with _raw_ws_router(mode) as (p, upstream):
        reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
        writer.write(_handshake())
        assert (await _read_head(reader)).startswith(b"HTTP/1.1 101 ")
        writer.write(_masked(8, CLOSE_1000))
        await wait_until(lambda: upstream.frames, timeout=5, what="the upstream read the client's Close")
        p.signal(signal.SIGTERM)
        assert await _read_frame(reader) == (8, CLOSE_1001)
        upstream.out.put_nowait(b"\x88\x02" + CLOSE_1000)  # the model server answers the client's Close
        await asyncio.wait_for(upstream.ended.wait(), 5)  # the router closed it: all it wrote was read
        assert upstream.frames == [(8, True, CLOSE_1000)], "the upstream got a Close after the client's"
        assert await asyncio.wait_for(reader.read(), 5) == b"", "the client got more after its Close's answer"
        writer.close()
        outcome, code = OUTCOME_AT[mode]
        assert await p.wait(10) == code
        assert [e["outcome"] for e in p.events if e.get("event") == "request"] == [outcome]


@pytest.mark.parametrize("mode", sorted(OUTCOME_AT))
async def test_after_the_upstreams_close_the_client_gets_no_1001(mode):
    """The mirror image: the model server sent Close and the client has not answered yet when the
    router's 1001 is due: the client gets no second Close; the model server gets the router's masked
    1001 as the answer to its Close, and closes."""
    async with _raw_ws_router(mode) as (p, upstream):
        reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
        writer.write(_handshake())
        assert (await _read_head(reader)).startswith(b"HTTP/1.1 101 ")
        upstream.out.put_nowait(b"\x88\x02" + CLOSE_1000)
        assert await _read_frame(reader) == (8, CLOSE_1000)
        p.signal(signal.SIGTERM)
        await wait_until(lambda: upstream.frames, timeout=10, what="the upstream read the router's Close")
        assert upstream.frames == [(8, True, CLOSE_1001)]
        upstream.out.put_nowait(None)  # the closing handshake is done: the server closes first
        assert await asyncio.wait_for(reader.read(), 5) == b"", "the client got a Close after the upstream's"
        writer.close()
        await asyncio.wait_for(upstream.ended.wait(), 5)
        assert upstream.frames == [(8, True, CLOSE_1001)]
        outcome, code = OUTCOME_AT[mode]
        assert await p.wait(10) == code
        assert [e["outcome"] for e in p.events if e.get("event") == "request"] == [outcome]
