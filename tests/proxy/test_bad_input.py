"""Bad input gets a clear answer or a closed connection, and the router keeps serving others."""

from __future__ import annotations

import asyncio

import pytest

from drain_router_dev import streams
from drain_router_dev.process import wait_until


async def _raw(port: int, data: bytes, timeout: float = 3.0) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(65536), timeout)
    finally:
        writer.close()


async def _still_serving(r, http) -> None:
    async with http.get(f"{r.url}/sse?n=2&iv=0") as resp:
        assert resp.status == 200
        assert streams.events_of(await resp.read())[-1] == "[DONE]"
    assert len(r.state.inflight) == 0


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/9.9\r\nHost: x\r\n\r\n",
        b"GET /\x00bad HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
    ],
    ids=["no-method", "bad-version", "nul-in-path", "bad-length", "bad-header", "te-and-cl"],
)
async def test_malformed_requests_get_400(fake_upstream, start_router, http, request_bytes):
    r = await start_router(upstream=fake_upstream.url)
    answer = await _raw(r.router.port, request_bytes)
    assert answer.split(b" ", 2)[1] == b"400" or answer == b"", answer[:80]
    assert fake_upstream.started == 0
    await _still_serving(r, http)


async def test_oversized_headers_are_refused(fake_upstream, start_router, http):
    r = await start_router(upstream=fake_upstream.url)
    answer = await _raw(r.router.port, b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n")
    assert answer == b"" or answer.split(b" ", 2)[1] in (b"400", b"431"), answer[:80]
    await _still_serving(r, http)


async def test_slowloris_does_not_block_others(fake_upstream, start_router, http):
    r = await start_router(upstream=fake_upstream.url)
    _reader, writer = await asyncio.open_connection("127.0.0.1", r.router.port)
    for byte in b"GET /sse?n=1 HT":
        writer.write(bytes([byte]))
        await writer.drain()
        await asyncio.sleep(0.01)
    await _still_serving(r, http)  # while one client dribbles its request line
    writer.close()


async def test_slow_reader_is_back_pressured_and_others_served(fake_upstream, start_router, http):
    """A client that stops reading a large stream: the router does not buffer it all, and serves others."""
    r = await start_router(upstream=fake_upstream.url)
    reader, writer = await asyncio.open_connection("127.0.0.1", r.router.port, limit=1024)
    writer.transport.set_write_buffer_limits(0)
    writer.write(b"GET /sse?n=4000&iv=0&pad=16384 HTTP/1.1\r\nHost: x\r\n\r\n")  # 64 MiB of events
    await writer.drain()
    await reader.readuntil(b"data: 0")
    writer.transport.pause_reading()  # stop reading
    await wait_until(lambda: len(r.state.inflight) == 1, 5, "1 in flight")
    await _still_serving_with_one_held(r, http)
    assert fake_upstream.started - fake_upstream.finished == 1, "the held stream is back-pressured, not buffered"
    writer.close()
    await wait_until(lambda: len(r.state.inflight) == 0, 5, "abandoned slow stream released")


async def _still_serving_with_one_held(r, http) -> None:
    for _ in range(3):
        async with http.get(f"{r.url}/sse?n=2&iv=0") as resp:
            assert streams.events_of(await resp.read())[-1] == "[DONE]"
