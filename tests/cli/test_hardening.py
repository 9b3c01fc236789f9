"""The traffic listener against hostile and broken clients, black-box: a real ``drain-router serve``
process, raw sockets, and what the router reports about itself (metrics, logs).

No request can make the router connect anywhere but its upstream; a client's mistake is never
counted as the model server's failure; error bodies leak nothing internal; slow and idle clients are
bounded; the router keeps serving through all of it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import aiohttp
import psutil
import pytest

from drain_router_dev.process import free_port, wait_until
from tests.blackbox import (
    Canary,
    by_outcome,
    canary,
    closed_within,
    inflight,
    raw_exchange,
    requests_total,
    reset,
    settled_rss,
    status_of,
)
from tests.process import Start, router_starter


@pytest.fixture
async def start_process(fake_upstream) -> AsyncIterator[Start]:
    async with router_starter(fake_upstream.url) as start:
        yield start


@pytest.fixture
async def spy() -> AsyncIterator[Canary]:
    async with canary() as c:
        yield c


def _body(answer: bytes) -> dict[str, object]:
    return json.loads(answer.split(b"\r\n\r\n", 1)[1])


def _targets(port: int) -> list[bytes]:
    """Request lines that name another host or port than the upstream's."""
    return [
        f"CONNECT @127.0.0.1:{port} HTTP/1.1".encode(),
        f"CONNECT 127.0.0.1:{port} HTTP/1.1".encode(),
        f"GET http://127.0.0.1:{port}/ HTTP/1.1".encode(),
        f"GET http://user@127.0.0.1:{port}/v1/models HTTP/1.1".encode(),
        f"POST HTTP://127.0.0.1:{port}/v1/completions HTTP/1.1".encode(),
        b"OPTIONS * HTTP/1.1",
        b"GET http://x/ HTTP/1.1",
    ]


async def test_no_request_target_reaches_anything_but_the_upstream(start_process, fake_upstream, spy):
    """CONNECT, absolute-form and ``*`` targets are refused 400 ``rejected`` with nothing sent anywhere;
    an origin-form path that looks like an authority (``/@host:port``) stays a path on the upstream."""
    p = await start_process()
    for line in _targets(spy.port):
        answer, _ = await raw_exchange(p.port, line + b"\r\nHost: x\r\nContent-Length: 0\r\n\r\n", whole=True)
        assert status_of(answer) == 400, (line, answer[:120])
        assert _body(answer)["error"]["type"] in ("bad_request_target", "bad_request"), answer
    answer, _ = await raw_exchange(
        p.port, f"GET /@127.0.0.1:{spy.port}/echo HTTP/1.1\r\nHost: x\r\n\r\n".encode(), whole=True
    )
    assert status_of(answer) == 404, answer[:200]  # the upstream's own answer for that path
    assert spy.connections == 0
    assert fake_upstream.started == 0
    outcomes = by_outcome(await requests_total(p.admin_port))
    assert outcomes.get("rejected") == len(_targets(spy.port)), outcomes
    assert outcomes.get("upstream_error", 0) == 0, outcomes


async def test_error_bodies_and_headers_leak_nothing_internal(start_process):
    """The upstream refuses connections: 502 with a static message; the address, the errno and the
    exception live only in the log. Router-made answers carry ``Server: drain-router``, no version."""
    port = free_port()  # nothing listens there
    p = await start_process(upstream=f"http://127.0.0.1:{port}")
    answer, _ = await raw_exchange(p.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", whole=True)
    head, body = answer.split(b"\r\n\r\n", 1)
    assert status_of(answer) == 502
    for secret in (b"127.0.0.1", str(port).encode(), b"Errno", b"refused", b"Cannot connect"):
        assert secret not in body, body
    assert b"\r\nServer: drain-router\r\n" in head + b"\r\n", head
    assert b"aiohttp" not in head and b"Python" not in head
    logged = [e for e in p.events if e.get("event") == "proxy.upstream_error"]
    assert logged and str(port) in json.dumps(logged[0]), "the detail goes to the log"
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{p.admin_port}/livez") as resp:
        assert resp.headers["Server"] == "drain-router"


async def test_clients_that_reset_mid_stream_are_client_aborted(start_process, fake_upstream):
    """50 clients reset their connection during a fast stream: 50 ``client_aborted``, no
    ``upstream_error`` (a write to a gone client is the client's failure), in-flight back to 0,
    nothing logged as an error."""
    p = await start_process()

    async def one(i: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
        writer.write(f"GET /sse?n=100000&iv=0&pad=512&id={i} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await reader.readuntil(b"data: 3")
        reset(writer)

    await asyncio.gather(*(one(i) for i in range(50)))
    await wait_until(lambda: fake_upstream.cancelled + fake_upstream.finished == 50, 10, "every stream ended")

    async def outcomes_now() -> dict[str, float]:
        return by_outcome(await requests_total(p.admin_port))

    outcomes = await wait_until(
        outcomes_now, 10, "50 client_aborted", until=lambda now: now.get("client_aborted", 0) >= 50
    )
    assert outcomes == {"client_aborted": 50}, outcomes
    assert (await inflight(p.admin_port))["inflight"] == 0
    assert not [e for e in p.events if e.get("level") == "error"], "a client leaving is not an error"


async def test_malformed_requests_are_rejected_and_logged_once(start_process, fake_upstream):
    """40 malformed requests: each a JSON 400 counted ``rejected`` (never ``upstream_error``); the log
    gets one rate-limited info line per kind, never an error or a traceback."""
    p = await start_process()
    garbage = [
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/1.1\r\nBad Header\r\n\r\n",
        b"GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"GET /echo\r\n\r\n",
    ]  # no version: llhttp says HTTP/0.9; answered in HTTP/1.1
    assert 40 % len(garbage) == 0
    for i in range(40):
        answer, _ = await raw_exchange(p.port, garbage[i % len(garbage)], whole=True)
        assert status_of(answer) == 400, answer[:100]
        assert answer.startswith(b"HTTP/1."), answer[:100]
        assert _body(answer)["error"]["code"] == 400
    outcomes = by_outcome(await requests_total(p.admin_port))
    assert outcomes == {"rejected": 40}, outcomes
    assert fake_upstream.started == 0
    lines = [e for e in p.events if e.get("event") in ("proxy.bad_request", "proxy.bad_target")]
    assert 1 <= len(lines) <= 2, lines
    assert not [e for e in p.events if e.get("level") == "error" or "exc_info" in e], p.events


async def test_oversized_head_is_431(start_process, fake_upstream):
    p = await start_process()
    answer, closed = await raw_exchange(p.port, b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")
    assert status_of(answer) == 431, answer[:100]
    assert closed
    assert by_outcome(await requests_total(p.admin_port)) == {"rejected": 1}


async def test_slow_and_idle_clients_are_closed_streams_are_not(start_process, fake_upstream):
    """Header timeout 1 s, keep-alive timeout 2 s: 50 slowloris connections (a byte every 0.2 s) are
    closed by the router within the header timeout; an idle keep-alive connection is closed after
    its timeout; a stream that lasts longer than both timeouts completes."""
    p = await start_process("--client-header-timeout-secs", "1", "--client-keepalive-timeout-secs", "2")

    async def slowloris() -> float:
        reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
        opened = time.monotonic()
        try:
            for byte in b"GET /sse?n=1 HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:
                writer.write(bytes([byte]))
                await writer.drain()
                if await closed_within(reader, 0.2):
                    return time.monotonic() - opened
            return float("inf")
        except ConnectionError:
            return time.monotonic() - opened
        finally:
            writer.close()

    async def stream() -> bytes:
        answer, _ = await raw_exchange(p.port, b"GET /sse?n=30&iv=0.1 HTTP/1.1\r\nHost: x\r\n\r\n", timeout=3.5)
        return answer

    streaming = asyncio.ensure_future(stream())
    lifetimes = await asyncio.gather(*(slowloris() for _ in range(50)))
    assert max(lifetimes) < 3.0, f"slowloris connections must be closed at the 1 s header timeout: {max(lifetimes)}"
    assert min(lifetimes) >= 0.9, min(lifetimes)
    assert b"data: [DONE]" in await streaming, "a stream longer than both timeouts completes"

    reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
    writer.write(b"GET /status/204 HTTP/1.1\r\nHost: x\r\n\r\n")
    await reader.readuntil(b"\r\n\r\n")
    idle_from = time.monotonic()
    assert await closed_within(reader, 6.0), "an idle keep-alive connection is closed"
    assert 1.8 <= time.monotonic() - idle_from < 6.0
    writer.close()
    refused = [e for e in p.events if e.get("event") == "proxy.header_timeout"]
    assert refused, "header timeouts are logged (rate-limited)"


async def test_a_stalled_reader_costs_bounded_memory(start_process, fake_upstream):
    """40 clients stop reading a fast stream (16 KiB events): the router holds back the upstream
    instead of buffering, so its RSS grows by well under 256 KiB per stalled stream (measured about
    85 KiB, against 1.8 MiB before back-pressure was bounded)."""
    p = await start_process()
    proc = psutil.Process(p.proc.pid)
    before = proc.memory_info().rss
    held = []
    for i in range(40):
        reader, writer = await asyncio.open_connection("127.0.0.1", p.port, limit=1024)
        writer.transport.set_write_buffer_limits(0)
        writer.write(f"GET /sse?n=4000&iv=0&pad=16384&id={i} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await reader.readuntil(b"data: 0")
        writer.transport.pause_reading()
        held.append(writer)
    await wait_until(lambda: fake_upstream.started == 40, 10, "40 stalled streams")
    # Let each relay fill every buffer it is allowed to: until the RSS stops growing.
    per_stream = (await settled_rss(proc.pid) - before) / 40
    print(f"stalled reader: {per_stream / 1024:.0f} KiB per stream")
    assert per_stream < 256 * 1024, f"{per_stream / 1024:.0f} KiB per stalled stream"
    assert fake_upstream.finished == 0, "the streams are held back, not buffered whole"
    for writer in held:
        writer.transport.abort()
    await wait_until(lambda: fake_upstream.cancelled == 40, 10, "abandoned streams cancelled upstream")


async def test_upgrade_with_a_pipelined_request_closes_the_connection(start_process, fake_upstream):
    """A WebSocket Upgrade on POST with a body, then a pipelined request: 400 (not a handshake), and the
    connection closes; the pipelined request is not answered, not read as a request, and never reaches the upstream."""
    p = await start_process()
    answer, closed = await raw_exchange(
        p.port,
        b"POST /echo HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nContent-Length: 3\r\n\r\nabc"
        b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    assert status_of(answer) == 400
    assert answer.count(b"HTTP/1.1 ") == 1, answer
    assert closed
    assert b"\r\nConnection: close\r\n" in answer


async def test_connection_cannot_nominate_host_and_forwarded_headers_follow_the_trust_model(
    start_process, fake_upstream
):
    """``Connection: Host`` is refused with 400 (Host is never removed); a header ``Connection``
    names is dropped; the router appends its own hop to ``Forwarded`` and ``X-Forwarded-For`` after
    what the client claimed, and drops ``X-Real-IP``."""
    p = await start_process()
    refused, closed = await raw_exchange(
        p.port, b"GET /echo HTTP/1.1\r\nHost: model.example\r\nConnection: Host\r\n\r\n"
    )
    assert status_of(refused) == 400 and closed
    answer, _ = await raw_exchange(
        p.port,
        b"GET /echo HTTP/1.1\r\nHost: model.example\r\nConnection: X-Hop\r\n"
        b"X-Hop: 1\r\nForwarded: for=203.0.113.9\r\nX-Forwarded-For: 203.0.113.9\r\n"
        b"X-Real-IP: 203.0.113.9\r\n\r\n",
        whole=True,
    )
    seen = {k.lower(): v for k, v in _body(answer)["headers"].items()}
    assert seen["host"] == "model.example"
    assert "x-hop" not in seen
    assert seen["forwarded"] == "for=203.0.113.9, for=127.0.0.1;proto=http;host=model.example"
    assert seen["x-forwarded-for"] == "203.0.113.9, 127.0.0.1"
    assert "x-real-ip" not in seen


async def test_drain_wait_timeout_and_waiters_are_capped(start_process):
    """``timeout=1e308`` is capped at the declared grace (3 s here); past 16 waiters the next is 503."""
    p = await start_process("--termination-grace-secs", "3")
    admin = f"http://127.0.0.1:{p.admin_port}/admin/drain-wait"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True)) as s:

        async def wait(timeout: str) -> tuple[int, dict[str, object], float]:
            t0 = time.monotonic()
            async with s.get(admin, params={"timeout": timeout}, timeout=aiohttp.ClientTimeout(total=30)) as resp:
                return resp.status, await resp.json(), time.monotonic() - t0

        results = await asyncio.gather(*(wait("1e308") for _ in range(17)))
    refused = [body for status, body, _ in results if status == 503]
    assert len(refused) == 1 and refused[0]["error"]["type"] == "too_many_waiters", results
    results = [r for r in results if r[0] != 503]
    assert all(status == 200 and body["drained"] is False for status, body, _ in results), results
    assert all(2.5 <= took < 10 for _, _, took in results), [took for _, _, took in results]
