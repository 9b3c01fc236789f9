"""Proxying: streaming both ways, headers, errors, Unix sockets, disconnects."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import socket
import time
from pathlib import Path

import aiohttp
import h11
import pytest

from drain_router_dev import streams
from drain_router_dev.fake_model import testing as fake_model_testing
from drain_router_dev.process import free_port, wait_until
from tests import rawupstream
from tests.blackbox import outcomes_in


async def test_sse_reaches_client_chunk_by_chunk(fake_upstream, start_router, http):
    """1. upstream writes an event every 150 ms  2. the client reads as they come.
    Result: the first event arrives long before the stream ends (nothing is buffered whole)."""
    r = await start_router(upstream=fake_upstream.url)
    t0 = time.monotonic()
    async with http.get(f"{r.url}/sse?n=4&iv=0.15") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/event-stream"
        first = await resp.content.readuntil(b"\n\n")
        first_at = time.monotonic() - t0
        rest = await resp.read()
    total = time.monotonic() - t0
    assert first == b"data: 0\n\n"
    assert streams.events_of(first + rest) == ["0", "1", "2", "3", "[DONE]"]
    assert total >= 0.45
    assert first_at < total - 0.3, f"first event at {first_at:.3f}s of {total:.3f}s: buffered"


async def test_chunks_that_arrive_in_one_read_reach_the_client_as_one_chunk(start_router):
    """1. the model server writes a head and 32 chunks in one write  2. the router reads them together.
    Result (parsed by h11): the client gets the same bytes, in fewer chunks than the model server
    framed (the read's, not one per upstream chunk), and the stream ends cleanly."""
    async with rawupstream.running() as raw:
        r = await start_router(upstream=raw.url)
        reader, writer = await asyncio.open_connection("127.0.0.1", r.router.port)
        writer.write(b"GET /burst?n=32 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        wire = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/burst?n=32", headers=[("Host", "t")]))
    conn.receive_data(wire)
    conn.receive_data(b"")
    body, chunks, events = b"", 0, []
    while (not events or events[-1] != "ConnectionClosed") and len(events) < 100:
        event = conn.next_event()
        events.append(type(event).__name__)
        if isinstance(event, h11.Data):
            body += event.data
            chunks += event.chunk_start
    assert events[0] == "Response" and events[-2:] == ["EndOfMessage", "ConnectionClosed"], events
    assert body == b"".join(rawupstream.burst_events(32))
    assert 1 <= chunks < 32, f"{chunks} chunks: framed one per upstream chunk, not one per read"


async def test_request_body_streams_and_arrives_intact(fake_upstream, start_router, http):
    r = await start_router(upstream=fake_upstream.url)
    payload = os.urandom(3 * 1024 * 1024)

    async def chunks():
        for i in range(0, len(payload), 65536):
            yield payload[i : i + 65536]

    async with http.post(f"{r.url}/echo?x=1&y=%20", data=chunks()) as resp:  # chunked upload
        body = await resp.json()
    assert body["size"] == len(payload)
    assert body["sha256"] == hashlib.sha256(payload).hexdigest()
    assert body["path_qs"] == "/echo?x=1&y=%20"
    async with http.put(f"{r.url}/echo", data=io.BytesIO(payload)) as resp:  # Content-Length upload
        assert (await resp.json())["size"] == len(payload)


async def test_hop_by_hop_dropped_both_ways_and_forwarded_headers_set(fake_upstream, start_router):
    r = await start_router(upstream=fake_upstream.url)
    async with aiohttp.ClientSession(skip_auto_headers=["User-Agent"]) as s:
        async with s.get(
            f"{r.url}/echo",
            headers={
                "Host": "api.example.com",
                "Connection": "keep-alive, X-Secret-Hop",
                "X-Secret-Hop": "1",
                "Keep-Alive": "timeout=5",
                "TE": "trailers",
                "Proxy-Authorization": "Basic x",
                "X-Forwarded-For": "203.0.113.7",
                "X-Custom": "kept",
            },
        ) as resp:
            seen = (await resp.json())["headers"]
            assert "Keep-Alive" not in resp.headers
            assert "X-Drop-Me" not in resp.headers, "a header named in the upstream's Connection is hop-by-hop"
            assert resp.headers["X-Upstream"] == "yes"
    assert seen["Host"] == "api.example.com"
    assert seen["X-Custom"] == "kept"
    for hop in ("X-Secret-Hop", "Keep-Alive", "TE", "Proxy-Authorization"):
        assert hop not in seen
    assert seen["X-Forwarded-For"] == "203.0.113.7, 127.0.0.1"
    assert seen["X-Forwarded-Proto"] == "http"
    assert seen["X-Forwarded-Host"] == "api.example.com"
    assert "User-Agent" not in seen, "the router adds no headers the client did not send"


async def test_hop_by_hop_names_match_in_any_case(fake_upstream, start_router):
    """Gateways speaking HTTP/2 upstream send every header name lowercase, while a Connection
    header may name them in any case; hop-by-hop still means hop-by-hop."""
    r = await start_router(upstream=fake_upstream.url)
    reader, writer = await asyncio.open_connection("127.0.0.1", r.router.port)
    writer.write(
        b"GET /echo HTTP/1.1\r\nhost: api.example.com\r\nconnection: keep-alive, X-Secret-Hop\r\n"
        b"x-secret-hop: 1\r\nkeep-alive: timeout=5\r\nte: trailers\r\nproxy-authorization: Basic x\r\n"
        b"x-forwarded-for: 203.0.113.7\r\nx-custom: kept\r\n\r\n"
    )
    await writer.drain()
    _head, _, rest = (await reader.readuntil(b"}}")).partition(b"\r\n\r\n")
    writer.close()
    seen = {k.lower(): v for k, v in json.loads(rest)["headers"].items()}
    for hop in ("x-secret-hop", "keep-alive", "te", "proxy-authorization"):
        assert hop not in seen, hop
    assert seen["x-custom"] == "kept"
    assert seen["x-forwarded-for"] == "203.0.113.7, 127.0.0.1", "one X-Forwarded-For, appended"
    async with aiohttp.ClientSession() as s, s.get(f"{r.url}/lowercase-hops") as resp:
        names = {k.lower() for k in resp.headers}
    assert "keep-alive" not in names and "x-drop-lower" not in names
    assert resp.headers["x-kept"] == "yes"


async def test_expect_100_continue_is_answered_and_the_body_forwarded(fake_upstream, start_router, http):
    r = await start_router(upstream=fake_upstream.url)
    async with http.post(f"{r.url}/echo", data=b"x" * 5000, expect100=True) as resp:
        assert resp.status == 200
        assert (await resp.json())["size"] == 5000


async def test_unix_socket_upstream(tmp_path: Path, start_router, http):
    async with fake_model_testing.running(unix_path=tmp_path / "model.sock") as fake:
        r = await start_router(upstream=fake.url)
        async with http.get(f"{r.url}/sse?n=3&iv=0") as resp:
            assert streams.events_of(await resp.read()) == ["0", "1", "2", "[DONE]"]


async def test_upstream_status_passes_through(fake_upstream, start_router, http):
    r = await start_router(upstream=fake_upstream.url)
    for code in (201, 404, 429, 500):
        async with http.get(f"{r.url}/status/{code}") as resp:
            assert resp.status == code


async def test_upstream_refused_is_502_json(start_router, http):
    r = await start_router(upstream=f"http://127.0.0.1:{free_port()}")
    async with http.get(f"{r.url}/v1/models") as resp:
        assert resp.status == 502
        body = await resp.json()
    assert body["error"]["type"] == "upstream_unavailable"
    assert len(r.state.inflight) == 0


async def test_upstream_connect_timeout_is_504(start_router, http):
    """A listener whose accept queue is full never completes the handshake: a connect timeout."""
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen(0)
    fillers = []
    try:
        for _ in range(8):  # fill the SYN/accept queue so the next connect hangs
            c = socket.socket()
            c.setblocking(False)
            try:
                c.connect(blocker.getsockname())
            except BlockingIOError:
                pass
            fillers.append(c)
        r = await start_router(upstream=f"http://127.0.0.1:{blocker.getsockname()[1]}", upstream_connect_timeout_secs=1)
        t0 = time.monotonic()
        async with http.get(f"{r.url}/x") as resp:
            assert resp.status == 504
            assert (await resp.json())["error"]["type"] == "upstream_timeout"
            assert resp.headers["x-drain-router-refused"] == "upstream_timeout"  # no connection made
        assert time.monotonic() - t0 < 5
    finally:
        for c in fillers:
            c.close()
        blocker.close()


async def test_oversized_body_is_413(fake_upstream, start_router, http):
    r = await start_router(upstream=fake_upstream.url, max_request_body_bytes=1000)
    async with http.post(f"{r.url}/echo", data=b"x" * 1001) as resp:
        assert resp.status == 413
        assert (await resp.json())["error"]["type"] == "request_too_large"

    async def chunks():
        for _ in range(20):
            yield b"y" * 100

    async with http.post(f"{r.url}/echo", data=chunks()) as resp:  # no Content-Length
        assert resp.status == 413
    async with http.post(f"{r.url}/echo", data=b"z" * 1000) as resp:
        assert resp.status == 200
    await wait_until(lambda: len(r.state.inflight) == 0, 5, "0 in flight")


@pytest.mark.parametrize(
    ("headers", "status", "kind"),
    [
        ({"Connection": "Upgrade", "Upgrade": "h2c"}, 501, "upgrade_not_supported"),
        ({"Connection": "Upgrade", "Upgrade": "websocket"}, 400, "bad_websocket_handshake"),
        (
            {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Key": "AAECAwQFBgcICQoLDA0ODw=="},
            400,
            "bad_websocket_handshake",
        ),
    ],
)
async def test_upgrade_refusals(fake_upstream, start_router, http, headers, status, kind):
    """Other Upgrade tokens: 501; a WebSocket Upgrade that is not a valid handshake (no key, no
    version 13): 400. Neither reaches the upstream, and nothing stays in flight."""
    r = await start_router(upstream=fake_upstream.url)
    async with http.get(f"{r.url}/ws", headers=headers) as resp:
        assert resp.status == status
        assert (await resp.json())["error"]["type"] == kind
    await wait_until(lambda: len(r.state.inflight) == 0, 5, "0 in flight")


async def test_upstream_dies_after_headers_closes_client_connection(fake_upstream, start_router, http):
    r = await start_router(upstream=fake_upstream.url)
    async with http.get(f"{r.url}/cut?n=2") as resp:
        assert resp.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()
    await wait_until(lambda: len(r.state.inflight) == 0, 5, "0 in flight")
    # and the router keeps serving others
    async with http.get(f"{r.url}/sse?n=2&iv=0") as resp:
        assert streams.events_of(await resp.read())[-1] == "[DONE]"


async def test_upstream_dies_inside_a_small_body_is_502(fake_upstream, start_router, http):
    r = await start_router(upstream=fake_upstream.url)
    async with http.get(f"{r.url}/short") as resp:
        assert resp.status == 502
        assert (await resp.json())["error"]["type"] == "upstream_unavailable"
    await wait_until(lambda: len(r.state.inflight) == 0, 5, "0 in flight")


@pytest.mark.parametrize("first", [0.0, 30.0], ids=["mid-stream", "silent-prefill"])
async def test_client_disconnect_cancels_upstream_within_1s(fake_upstream, start_router, first):
    """1. a client starts a long stream (or one still in a 30 s silent prefill)  2. the client
    goes away. Result: the model server sees its request cancelled within 1 s, in-flight is 0."""
    r = await start_router(upstream=fake_upstream.url)
    reader, writer = await asyncio.open_connection("127.0.0.1", r.router.port)
    writer.write(f"GET /sse?n=1000&iv=0.05&first={first} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    await writer.drain()
    await asyncio.wait_for(fake_upstream.request_seen.wait(), 5)
    if not first:
        await reader.readuntil(b"data: 0")
    assert len(r.state.inflight) == 1
    writer.close()
    t0 = time.monotonic()
    await asyncio.wait_for(fake_upstream.cancel_seen.wait(), 1.0)
    assert time.monotonic() - t0 < 1.0
    await wait_until(lambda: len(r.state.inflight) == 0, 1.0, "in-flight back to 0")
    outcomes = outcomes_in(r.router.metrics.registry)
    assert outcomes.get("client_aborted") == 1


async def test_upstream_pool_is_not_capped_at_100(fake_upstream, start_router, http):
    """aiohttp's default connector limit is 100; 150 concurrent streams must all be open at once."""
    r = await start_router(upstream=fake_upstream.url)

    async def one():
        async with http.get(f"{r.url}/sse?n=1&first=0.6") as resp:
            return await resp.read()

    tasks = [asyncio.ensure_future(one()) for _ in range(150)]
    await wait_until(lambda: fake_upstream.started == 150, 5, "150 upstream requests in flight together")
    results = await asyncio.gather(*tasks)
    assert all(streams.events_of(b)[-1] == "[DONE]" for b in results)


async def test_upstream_max_connections_bounds_the_pool(fake_upstream, start_router, http):
    """--upstream-max-connections 3: at most 3 requests reach the model server at once; the rest
    queue for a pooled connection (not refused) and all complete."""
    r = await start_router(upstream=fake_upstream.url, upstream_max_connections=3)
    peak = 0

    async def one():
        async with http.get(f"{r.url}/sse?n=1&first=0.3") as resp:
            return await resp.read()

    tasks = [asyncio.ensure_future(one()) for _ in range(8)]
    while not all(t.done() for t in tasks):
        peak = max(peak, fake_upstream.started - fake_upstream.finished - fake_upstream.cancelled)
        await asyncio.sleep(0.01)
    results = await asyncio.gather(*tasks)
    assert all(streams.events_of(b)[-1] == "[DONE]" for b in results)
    assert peak == 3
    assert fake_upstream.finished == 8


async def test_emfile_is_a_clean_503(fake_upstream, start_router, http, monkeypatch):
    """Out of descriptors while connecting upstream: 503 with a JSON body and a log event, no 500."""
    import errno

    from structlog.testing import capture_logs

    r = await start_router(upstream=fake_upstream.url)

    async def no_fds(*args, **kwargs):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(r.router.pool, "open_connection", no_fds)
    with capture_logs() as logs:
        async with http.get(f"{r.url}/sse") as resp:
            assert resp.status == 503
            assert (await resp.json())["error"]["type"] == "out_of_file_descriptors"
    assert any(e["event"] == "proxy.emfile" for e in logs)
    monkeypatch.undo()
    async with http.get(f"{r.url}/sse?n=1") as resp:
        assert resp.status == 200


async def test_a_failed_write_to_the_client_is_client_aborted(fake_upstream, start_router):
    """The client's connection breaks under the relay (it resets it: the router's next write fails
    with ECONNRESET/EPIPE): that is the client's failure (``client_aborted``), never
    ``upstream_error``; the model server sees its request cancelled."""
    import socket
    import struct

    r = await start_router(upstream=fake_upstream.url)
    reader, writer = await asyncio.open_connection("127.0.0.1", r.router.port)
    writer.write(b"GET /sse?n=1000&iv=0.01 HTTP/1.1\r\nHost: t\r\n\r\n")
    assert b"data: 0" in await asyncio.wait_for(reader.readuntil(b"data: 0"), 5)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = reset
    writer.transport.abort()
    await asyncio.wait_for(fake_upstream.cancel_seen.wait(), 5)
    await wait_until(lambda: len(r.state.inflight) == 0, 2, "in-flight back to 0")
    outcomes = outcomes_in(r.router.metrics.registry)
    assert outcomes == {"client_aborted": 1}, outcomes
