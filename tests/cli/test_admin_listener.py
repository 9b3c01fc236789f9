"""The admin listener is bounded and plain, black-box: a real ``drain-router serve`` process and
raw sockets.

- A ``/admin/drain-wait`` caller that leaves frees its slot at once: callers that disconnect can never
  lock the kubelet's preStop hook out with ``too_many_waiters``.
- Protocol errors get a static JSON body with ``Server: drain-router``: no framework, no version, no
  parser text; they are logged as one rate-limited line, never as an error with a traceback.
- At most ``ADMIN_CONNECTION_LIMIT`` admin connections are held; past the cap a connection is answered
  503 and closed, and the traffic listener keeps its descriptors: proxied requests and ``/readyz`` on
  the traffic port still answer while the admin port is flooded.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import json
import resource
import select
import signal
import socket
import struct
import termios
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from drain_router.runtime import admin_listener, engine_metrics, tuning
from drain_router.runtime.endpoints import MAX_DRAIN_WAITERS
from drain_router_dev import streams
from drain_router_dev.process import wait_until
from tests.blackbox import Response, raw_exchange, read_response, reset, status_of
from tests.process import RouterProcess, Start, router_starter

#: A caller that left must free its slot well within this (before the fix: only at its timeout).
SLOT_FREED_WITHIN_SECS = 2.0


@pytest.fixture
async def start_process(fake_upstream) -> AsyncIterator[Start]:
    async with router_starter(fake_upstream.url) as start:
        yield start


def _get(path: str, *, close: bool = False) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n{'Connection: close' + chr(13) + chr(10) if close else ''}\r\n".encode()


async def _status(port: int, path: str) -> int:
    answer, _ = await raw_exchange(port, _get(path, close=True), whole=True)
    return status_of(answer)


async def _hold(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A preStop-like caller: one ``/admin/drain-wait`` request (no timeout of its own), left waiting."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_get("/admin/drain-wait"))
    await writer.drain()
    return reader, writer


async def _wait_full(admin_port: int, full: bool, timeout: float = 10.0) -> None:
    """Until every drain-wait slot is taken (``full``) or one is free: a ``timeout=0`` call is answered
    at once, 503 ``too_many_waiters`` when no slot is free, else 200 ``drained: false``."""

    async def status() -> int:
        answer = await _status(admin_port, "/admin/drain-wait?timeout=0")
        assert answer in (200, 503), answer
        return answer

    want = 503 if full else 200
    await wait_until(status, timeout, f"drain-wait slots {'full' if full else 'free'}", until=lambda s: s == want)


async def test_a_drain_wait_caller_that_leaves_frees_its_slot_at_once(start_process):
    """1. 16 callers hold every /admin/drain-wait slot (a 17th is refused 503 too_many_waiters)
    2. they all disconnect (half with FIN, half with RST), long before any timeout.
    Result: within 2 s a caller is held again (before the fix: the slots stayed taken until each
    caller's timeout, 1800 s with no declared grace, and a kubelet preStop got the 503 and had the model
    server signalled at once); 16 fresh callers are all held, and each is answered drained at SIGTERM."""
    p = await start_process("--termination-grace-secs", "1800")
    admin = p.admin_port
    leavers = [await _hold(admin) for _ in range(MAX_DRAIN_WAITERS)]
    await _wait_full(admin, True)
    left = time.monotonic()
    for n, (_, writer) in enumerate(leavers):
        if n % 2:
            reset(writer)
        else:
            writer.close()
    await _wait_full(admin, False, SLOT_FREED_WITHIN_SECS)
    freed_after = time.monotonic() - left
    assert freed_after < SLOT_FREED_WITHIN_SECS, freed_after
    print(f"drain-wait slot free again {freed_after * 1000:.0f} ms after its callers left")

    fresh = [await _hold(admin) for _ in range(MAX_DRAIN_WAITERS)]
    await _wait_full(admin, True)  # the 16 fresh callers (and nothing left over) hold every slot
    p.signal(signal.SIGTERM)
    for reader, writer in fresh:
        response = await read_response(reader, timeout=10)
        assert response.status == 200, response  # held, not refused with too_many_waiters
        assert json.loads(response.body)["drained"] is True, response.body
        writer.close()
    assert await p.wait() == 0


#: Requests aiohttp's parser refuses, and the status each gets.
MALFORMED = [
    (b"GARBAGE\r\n\r\n", 400),
    (b"GET /livez HTTP/1.1\r\nBad Header\r\n\r\n", 400),
    (b"GET /livez HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n", 400),
    (b"GET /livez HTTP/9.9\r\nHost: x\r\n\r\n", 400),
    (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 431),
    (b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 9000 + b"\r\n\r\n", 431),
]
#: What a scanner or a curious client must never read from the admin port.
LEAKS = (b"aiohttp", b"python", b"traceback", b"garbage", b"bad header", b"nope", b"aaaa", b"bbbb", b"invalid")


async def test_protocol_errors_get_a_static_body_and_one_rate_limited_log_line(start_process):
    """Malformed request lines, bad headers, bad framing and heads too large, sent raw to the admin
    port, each get 400 (431 for a line too large) with a static JSON body, ``Server: drain-router`` and
    the connection closed: nothing names aiohttp or Python and no parser text (which echoes the
    client's bytes) reaches the client. The router logs them as one rate-limited ``admin.bad_request``
    line, never at error level with a traceback. Every regular admin answer (200, 404, 405) also says
    ``Server: drain-router``."""
    p = await start_process()
    for request, status in MALFORMED:
        answer, closed = await raw_exchange(p.admin_port, request)
        assert status_of(answer) == status, (request[:40], answer[:300])
        head, _, body = answer.partition(b"\r\n\r\n")
        assert b"\r\nServer: drain-router\r\n" in head, head
        for leak in LEAKS:
            assert leak not in answer.lower(), (leak, answer[:300])
        error = json.loads(body)["error"]
        assert error["type"] == ("request_header_too_large" if status == 431 else "bad_request"), error
        assert closed, request[:40]
    for request in (_get("/livez", close=True), _get("/metrics", close=True), _get("/nowhere", close=True)):
        answer, _ = await raw_exchange(p.admin_port, request, whole=True)
        head = answer.partition(b"\r\n\r\n")[0]
        assert b"\r\nServer: drain-router\r\n" in head, head
        assert b"aiohttp" not in answer.lower() and b"python" not in head.lower(), head
    answer, _ = await raw_exchange(
        p.admin_port, b"POST /livez HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", whole=True
    )
    assert status_of(answer) == 405 and b"\r\nServer: drain-router\r\n" in answer, answer[:300]
    assert await _status(p.admin_port, "/livez") == 200  # still serving
    p.signal(signal.SIGTERM)
    assert await p.wait() == 0
    events = p.events
    logged = [e for e in events if e.get("event") == "admin.bad_request"]
    assert len(logged) == 1, logged  # the other five within the interval are counted, not logged
    assert not [e for e in events if e.get("level") == "error" or "exc_info" in e or "exception" in e], events
    assert not [e for e in events if "Error handling request" in str(e.get("event"))], events


async def _wait_status(port: int, path: str, status: int, timeout: float = 10.0) -> None:
    await wait_until(lambda: _status(port, path), timeout, f"{path} to answer {status}", until=lambda s: s == status)


def _tight_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


NOFILE = 256  # soft = hard, so the router's own raise to the hard limit cannot lift it
ADMIN_FLOOD = 260  # more admin connections than the process has descriptors


STREAM_EVENTS = 60  # 3 s at the fake model's 0.05 s pace: far longer than opening every stream


async def _stream(port: int, events: int) -> object:
    """One streamed completion over a raw socket: ``"done"`` when every event and ``[DONE]`` arrived."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_get(f"/sse?n={events}&iv=0.05", close=True))
        response = await read_response(reader, timeout=30)
    finally:
        writer.close()
    if response.status != 200:
        return response.status, response.body[:120]
    got = streams.events_of(response.body)
    return "done" if got[-1:] == ["[DONE]"] and len(got) == events + 1 else got[-3:]


async def _admin_answer(port: int) -> tuple[asyncio.StreamWriter, Response | None]:
    """Open a keep-alive admin connection and ask /admin/inflight on it: its answer, or None when the
    router closed the connection without one (a refused connection it did not linger on)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_get("/admin/inflight"))
        return writer, await read_response(reader, timeout=10)
    except (ConnectionError, asyncio.IncompleteReadError):
        return writer, None


async def test_admin_connections_past_the_cap_are_refused_and_traffic_keeps_its_descriptors(fake_upstream):
    """1. a router limited to 256 descriptors  2. 260 keep-alive connections to its admin port, each
    asking /admin/inflight and then left open. Result: exactly ADMIN_CONNECTION_LIMIT of them are
    served; every other one is refused (a static 503 with ``Server: drain-router``, then closed) and
    none is left hanging; meanwhile the traffic port answers /readyz and proxies requests (before the
    fix: the admin connections took every descriptor and the traffic port stopped answering), and the
    admin port still answers its probes (the probes' reserve); refusals are counted and logged
    (rate-limited); once the hoarders leave, the admin port answers again."""
    p = await RouterProcess.start(
        "--upstream",
        fake_upstream.url,
        "--port",
        "0",
        "--admin-port",
        "0",
        "--shutdown-drain-secs",
        "0",
        preexec_fn=_tight_nofile,
    )
    try:
        listening = await p.wait_event("startup.listening")
        assert listening["connection_limit"] == tuning.traffic_connection_limit(NOFILE)
        assert listening["admin_connection_limit"] == tuning.ADMIN_CONNECTION_LIMIT
        opened = [await _admin_answer(p.admin_port) for _ in range(ADMIN_FLOOD)]
        answers = [answer for _, answer in opened]
        served = [a for a in answers if a is not None and a.status == 200]
        refused = [a for a in answers if a is not None and a.status == 503]
        assert len(served) == tuning.ADMIN_CONNECTION_LIMIT, [a and a.status for a in answers]
        assert len(served) + len(refused) + answers.count(None) == ADMIN_FLOOD, [a and a.status for a in answers]
        assert refused, "past the cap, connections are answered 503"
        for answer in refused:
            assert answer.header(b"server") == b"drain-router", answer.headers
            assert answer.closes(), answer.headers
            assert json.loads(answer.body)["error"]["type"] == "too_many_connections", answer.body

        # The traffic listener still has its descriptors while the admin port is full.
        for _ in range(3):
            assert await _status(p.port, "/readyz") == 200
        proxied = await asyncio.gather(*(_status(p.port, "/v1/models") for _ in range(20)))
        assert proxied == [200] * 20, proxied
        for path in ("/livez", "/readyz"):  # the admin port at its cap still answers the probes
            assert await _status(p.admin_port, path) == 200
        assert await _status(p.admin_port, "/admin/inflight") == 503  # and nothing else

        # Both listeners full at once fit in the descriptors: the admin share is in the reserve, so
        # every stream up to the traffic listener's own limit is served, none runs out of descriptors.
        limit = tuning.traffic_connection_limit(NOFILE)
        before = fake_upstream.started
        streams_ = [asyncio.ensure_future(_stream(p.port, STREAM_EVENTS)) for _ in range(limit)]
        await wait_until(lambda: fake_upstream.started - before == limit, 10, f"{limit} streams held at once")
        assert await _status(p.port, "/readyz") == 503  # the traffic listener at its own cap refuses
        held = await asyncio.gather(*streams_)
        assert held == ["done"] * limit, collections.Counter(map(str, held))

        for writer, _ in opened:
            writer.close()
        await _wait_status(p.admin_port, "/livez", 200)
        metrics, _ = await raw_exchange(p.admin_port, _get("/metrics", close=True), timeout=10)
        counted = [
            line
            for line in metrics.decode().splitlines()
            if line.startswith('drain_router_connections_refused_total{reason="admin_connection_limit"}')
        ]
        assert counted and float(counted[0].split()[-1]) >= ADMIN_FLOOD - tuning.ADMIN_CONNECTION_LIMIT, counted
        p.signal(signal.SIGTERM)
        assert await p.wait() == 0
        logged = [e for e in p.events if e.get("event") == "admin.connection_refused"]
        assert len(logged) == 1, logged  # one line per interval, the rest counted as suppressed
        assert logged[0]["limit"] == tuning.ADMIN_CONNECTION_LIMIT, logged
        assert not [e for e in p.events if e.get("level") == "error"], p.events  # no proxy.emfile
    finally:
        await p.kill()


async def test_an_idle_admin_keepalive_connection_is_closed_soon(start_process):
    """An admin connection left idle after its answer is closed by the router within
    ADMIN_KEEPALIVE_SECS (plus slack), so idle connections cannot hold the cap for long."""
    from drain_router.runtime.admin_listener import ADMIN_KEEPALIVE_SECS
    from tests.blackbox import closed_within

    p = await start_process()
    reader, writer = await asyncio.open_connection("127.0.0.1", p.admin_port)
    try:
        writer.write(_get("/livez"))
        assert (await read_response(reader)).status == 200
        assert await closed_within(reader, ADMIN_KEEPALIVE_SECS + 5.0)
    finally:
        writer.close()


# -- clients that never read -----------------------------------------------------------------------

#: The engine's metrics body: several MiB (below MAX_ENGINE_METRICS_BYTES), far more than a socket's
#: kernel buffers take, so a client that does not read leaves most of it with the router.
ENGINE_BODY = b"".join(b'engine_big_metric{n="%07d"} 1\n' % n for n in range(200_000))  # 6.2 MB
#: Clients of /engine/metrics that never read: every slot under the admin listener's cap.
NON_READERS = tuning.ADMIN_CONNECTION_LIMIT
#: Their receive buffer (the kernel doubles it, and rounds it up to its minimum).
SMALL_RCVBUF = 4096
#: A probe at the router's cap answers well within the kubelet's default timeoutSeconds (1 s).
PROBE_WITHIN_SECS = 1.0


@contextlib.asynccontextmanager
async def big_metrics_upstream() -> AsyncIterator[str]:
    """A model server whose ``/metrics`` is :data:`ENGINE_BODY` (keep-alive); anything else is 404."""

    held: set[asyncio.StreamWriter] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.add(writer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if head.startswith(b"GET /metrics "):
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                        b"Content-Length: %d\r\n\r\n" % len(ENGINE_BODY) + ENGINE_BODY
                    )
                else:
                    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        for writer in held:
            writer.close()
        server.close()


def _non_reader(port: int) -> socket.socket:
    """A blocking socket with a small receive buffer that asks /engine/metrics and never reads."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_RCVBUF)
    sock.connect(("127.0.0.1", port))
    sock.sendall(_get("/engine/metrics"))
    return sock


def _received(sock: socket.socket) -> int:
    """Bytes waiting in ``sock``'s receive queue, without reading them."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]


def _cut(sock: socket.socket) -> bool:
    """The router closed or reset ``sock`` (seen without reading what it holds)."""
    poller = select.poll()
    poller.register(sock, select.POLLERR | select.POLLHUP | select.POLLRDHUP)
    return bool(poller.poll(0))


def _vm_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


async def _timed_status(port: int, path: str) -> tuple[int, float]:
    started = time.monotonic()
    status = await _status(port, path)
    return status, time.monotonic() - started


async def test_clients_that_never_read_are_cut_and_cannot_starve_the_probes():
    """1. a model server whose /metrics is 6.2 MB 2. one scrape read whole (the baseline RSS)
    3. 64 clients (every slot under the cap) ask /engine/metrics with a 4 KiB receive buffer and never
    read. Result: while they hang, /livez and /readyz on the admin port answer 200 within 1 s (the
    probes' reserve) and a scrape that reads still gets the whole body; each non-reader is cut by the
    router within ADMIN_SEND_TIMEOUT_SECS (plus slack) of being stalled (their sockets see the reset
    without reading), logged as admin.send_timeout; the router's peak RSS grows by no more than the
    bodies the relay may hold (ENGINE_METRICS_HELD_BYTES) plus, per non-reader, the write high-water
    mark and one chunk, plus 16 MiB for the 64 connections' own objects and the allocator.
    Before the fix each non-reader held its own 8.5 MB copy until it went away, and 68 of them took
    the cap and answered /livez 503. Measured (2 cores, loopback): peak RSS grew by 19-20 MiB (one or
    two bodies of 6.2 MB, the rest the connections); with the body written whole rather than in
    chunks, by 227 MiB although the send timeout cut the non-readers at 5 s; the bound is 40 MiB.
    Without the send timeout the non-readers are never cut; without the probes' reserve /livez is
    503 at once."""
    async with big_metrics_upstream() as url, router_starter(url) as start:
        p = await start()
        pid = p.proc.pid
        answer, _ = await raw_exchange(p.admin_port, _get("/engine/metrics", close=True), whole=True, timeout=10)
        assert status_of(answer) == 200 and answer.endswith(ENGINE_BODY)
        baseline_kib = _vm_kib(pid, "VmRSS")

        loop = asyncio.get_running_loop()
        socks = [await loop.run_in_executor(None, _non_reader, p.admin_port) for _ in range(NON_READERS)]
        try:
            # Every non-reader has its answer under way (some of it in its receive buffer).
            await wait_until(lambda: all(_received(s) > 0 for s in socks), 10, "every non-reader answered")
            stalled = time.monotonic()
            for path in ("/livez", "/readyz", "/livez"):
                status, took = await _timed_status(p.admin_port, path)
                assert (status, path) == (200, path) and took < PROBE_WITHIN_SECS, (path, status, took)
            # Every non-reader is cut: their sockets see the reset without reading.
            await wait_until(
                lambda: all(_cut(s) for s in socks),
                admin_listener.ADMIN_SEND_TIMEOUT_SECS + 5,
                "every non-reader cut",
            )
            cut_after = time.monotonic() - stalled
            peak_kib = _vm_kib(pid, "VmHWM")
        finally:
            for s in socks:
                s.close()
        assert cut_after <= admin_listener.ADMIN_SEND_TIMEOUT_SECS + 5, cut_after
        grown = (peak_kib - baseline_kib) * 1024
        per_connection = admin_listener.ADMIN_WRITE_HIGH_WATER + engine_metrics.CHUNK_BYTES
        bound = engine_metrics.ENGINE_METRICS_HELD_BYTES + NON_READERS * per_connection + 16 * 1024 * 1024
        print(
            f"non-readers cut {cut_after:.1f} s after stalling; peak RSS grew {grown / 2**20:.1f} MiB (bound {bound / 2**20:.0f})"
        )
        assert grown <= bound, (grown, bound)

        # The listener serves as before: a scrape that reads gets the whole body.
        answer, _ = await raw_exchange(p.admin_port, _get("/engine/metrics", close=True), whole=True, timeout=10)
        assert status_of(answer) == 200 and answer.endswith(ENGINE_BODY)
        p.signal(signal.SIGTERM)
        assert await p.wait() == 0
        timed_out = [e for e in p.events if e.get("event") == "admin.send_timeout"]
        assert timed_out and timed_out[0]["timeout_secs"] == admin_listener.ADMIN_SEND_TIMEOUT_SECS, timed_out


async def test_bodies_held_for_slow_readers_are_bounded():
    """1. a model server whose /metrics is 6.2 MB 2. a client of /engine/metrics that never reads,
    then a second (each its own fetch, the first answer still being sent) 3. a third scrape.
    Result: the third is 503 ``engine_metrics_busy`` at once, without a fetch (a third body would pass
    ENGINE_METRICS_HELD_BYTES); once the send timeout has cut the two, a scrape gets the body."""
    assert 2 * len(ENGINE_BODY) + engine_metrics.MAX_ENGINE_METRICS_BYTES > engine_metrics.ENGINE_METRICS_HELD_BYTES
    async with big_metrics_upstream() as url, router_starter(url) as start:
        p = await start()
        loop = asyncio.get_running_loop()
        socks = []
        try:
            for _ in range(2):
                sock = await loop.run_in_executor(None, _non_reader, p.admin_port)
                socks.append(sock)
                await wait_until(lambda s=sock: _received(s) > 0, 10, "the non-reader's answer under way")
            answer, _ = await raw_exchange(p.admin_port, _get("/engine/metrics", close=True), whole=True)
            assert status_of(answer) == 503 and b"engine_metrics_busy" in answer, answer[:300]
            await wait_until(lambda: all(_cut(s) for s in socks), admin_listener.ADMIN_SEND_TIMEOUT_SECS + 5, "cut")
        finally:
            for s in socks:
                s.close()
        answer, _ = await raw_exchange(p.admin_port, _get("/engine/metrics", close=True), whole=True, timeout=10)
        assert status_of(answer) == 200 and answer.endswith(ENGINE_BODY)
