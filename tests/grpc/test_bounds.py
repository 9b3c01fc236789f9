"""HTTP/2's known attacks against the gRPC listener, from a raw client over a socket: each
gets GOAWAY with the right code, costs bounded memory, and leaves the in-flight count at 0."""

from __future__ import annotations

import aiohttp
import psutil
from hyperframe import frame as hf

from drain_router.h2 import rules
from drain_router_dev.process import wait_until
from tests import grpcupstream
from tests.grpc.conftest import StartGrpcRouter, grpc_requests, inflight
from tests.h2client import PREFACE, RawClient, message, request_headers

PROTOCOL_ERROR = 1
REFUSED_STREAM = 7
COMPRESSION_ERROR = 9
ENHANCE_YOUR_CALM = 11
MAX_CONCURRENT_STREAMS = 0x3
INITIAL_WINDOW_SIZE = 0x4


def rss(router) -> int:  # type: ignore[no-untyped-def]
    return int(psutil.Process(router.proc.pid).memory_info().rss)


async def test_an_invalid_preface_gets_goaway_protocol_error(grpc_router: StartGrpcRouter) -> None:
    router = await grpc_router()
    client = await RawClient.connect(router.grpc_port, preface=False)
    client.send_raw(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    goaway = await client.goaway()
    assert goaway.error_code == PROTOCOL_ERROR
    await client.wait_closed()
    client.close()


async def test_a_preface_not_followed_by_settings_is_refused(grpc_router: StartGrpcRouter) -> None:
    router = await grpc_router()
    client = await RawClient.connect(router.grpc_port, preface=False)
    client.send_raw(PREFACE + hf.PingFrame(0, opaque_data=b"12345678").serialize())
    assert (await client.goaway()).error_code == PROTOCOL_ERROR
    client.close()


async def test_rapid_reset_is_cut_with_enhance_your_calm(
    grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    """CVE-2023-44487: 20,000 HEADERS + RST_STREAM pairs. The connection is cut after the reset
    budget's burst; few streams reach the model server; in-flight is back to 0."""
    router = await grpc_router()
    client = await RawClient.connect(router.grpc_port)
    block = client.encoder.encode(request_headers("/t.T/Stream"))
    burst = bytearray()
    for i in range(20_000):
        sid = 2 * i + 1
        burst += hf.HeadersFrame(sid, data=block, flags=["END_HEADERS"]).serialize()
        burst += hf.RstStreamFrame(sid, error_code=8).serialize()
    client.send_raw(bytes(burst))
    goaway = await client.goaway(timeout=10)
    assert goaway.error_code == ENHANCE_YOUR_CALM
    assert goaway.last_stream_id < 2 * (rules.RESETS[0] + rules.MAX_CONCURRENT_STREAMS) + 1
    await wait_until(lambda: inflight(router), timeout=5, what="in-flight back to 0", until=lambda n: n == 0)
    client.close()


async def test_a_continuation_flood_is_cut_before_it_is_buffered(grpc_router: StartGrpcRouter) -> None:
    """HEADERS without END_HEADERS, then CONTINUATION frames without end (the 2024 family): GOAWAY
    ENHANCE_YOUR_CALM once the block passes the bound; the router's memory does not follow."""
    router = await grpc_router()
    before = rss(router)
    client = await RawClient.connect(router.grpc_port)
    client.send(hf.HeadersFrame(1, data=client.encoder.encode(request_headers())))
    chunk = hf.ContinuationFrame(1, data=b"\x00" * 16_000).serialize()
    try:
        for _ in range(1000):  # up to 16 MB offered, until the GOAWAY is read
            if client.closed or client.of(hf.GoAwayFrame):
                break
            client.send_raw(chunk)
            await client.writer.drain()
    except ConnectionError:
        pass  # cut while still sending
    goaway = await client.goaway()
    assert goaway.error_code == ENHANCE_YOUR_CALM
    assert rss(router) - before < 8 * 1024 * 1024
    client.close()


async def test_an_hpack_bomb_is_cut(grpc_router: StartGrpcRouter) -> None:
    """A small block that decodes to a huge header list (one 4 KB field in the table, referenced
    again and again): GOAWAY ENHANCE_YOUR_CALM, not a decoded megabyte."""
    router = await grpc_router()
    client = await RawClient.connect(router.grpc_port)
    big = ("x-bomb", "b" * 4000)
    first = client.encoder.encode([*request_headers(), big])
    client.send(hf.HeadersFrame(1, data=first, flags=["END_HEADERS"]))
    # The field is now entry 62 of the dynamic table: each reference is one byte (0x80 | 62).
    refs = bytes([0x80 | 62]) * 2000
    block = client.encoder.encode(request_headers()) + refs
    client.send(hf.HeadersFrame(3, data=block, flags=["END_HEADERS"]))
    goaway = await client.goaway()
    assert goaway.error_code == ENHANCE_YOUR_CALM
    client.close()


async def test_settings_and_ping_floods_are_cut(grpc_router: StartGrpcRouter) -> None:
    router = await grpc_router()
    for flood in (hf.SettingsFrame(0, settings={INITIAL_WINDOW_SIZE: 65535}), hf.PingFrame(0, opaque_data=b"flood!!!")):
        client = await RawClient.connect(router.grpc_port)
        client.send_raw(flood.serialize() * 10_000)
        goaway = await client.goaway()
        assert goaway.error_code == ENHANCE_YOUR_CALM, type(flood).__name__
        acks = len(client.of(type(flood)))
        assert acks <= max(rules.SETTINGS_FRAMES[0], rules.PINGS[0]) + 10
        client.close()


async def test_a_reader_that_keeps_its_window_at_zero_costs_bounded_memory(
    grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    """A client that opens a stream with a zero window and never opens it: the router holds at most
    one stream window of the response, the model server is held by flow control, RSS stays flat."""
    router = await grpc_router()
    client = await RawClient.connect(router.grpc_port, settings={INITIAL_WINDOW_SIZE: 0})
    await client.wait_for(lambda c: c.of(hf.SettingsFrame), what="SETTINGS")
    before = rss(router)
    for i in range(8):
        sid = 2 * i + 1
        client.headers(sid, request_headers("/t.T/Stream"))
        client.data(sid, message(b"1000000 0"), end_stream=True)
    await upstream.wait_active(8)
    # The model server blocks once its window to the router is used up: the counts stop moving.
    await wait_until(lambda: rss(router) - before, timeout=10, what="RSS measured", until=lambda d: d >= 0)
    grown = rss(router) - before
    assert grown < 8 * rules.STREAM_WINDOW * 4 + 16 * 1024 * 1024, grown
    assert not client.received_data(1)
    assert await inflight(router) == 8
    client.close()
    await wait_until(lambda: inflight(router), timeout=5, what="in-flight back to 0", until=lambda n: n == 0)
    await upstream.wait_active(0)


async def test_a_client_that_opens_its_windows_but_never_reads_holds_the_model_server(
    grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    """Flow control alone would let the router write whatever the model server sends into a client
    that advertised the largest windows and then stopped reading. The router re-opens the model
    server's window only for bytes its client transport took (not while that transport is paused),
    so the model server is held after a bounded amount (kernel buffers plus one stream window)."""
    import asyncio

    import pytest

    router = await grpc_router()
    reader, writer = await asyncio.open_connection("127.0.0.1", router.grpc_port)
    client = RawClient(reader, writer)  # never started: nothing is ever read
    huge = 2**31 - 1
    writer.write(PREFACE + hf.SettingsFrame(0, settings={INITIAL_WINDOW_SIZE: huge}).serialize())
    client.send(hf.WindowUpdateFrame(0, window_increment=huge - 65_535))
    client.headers(1, request_headers("/t.T/Stream"))
    client.data(1, message(b"4000 0 32768"), end_stream=True)  # 128 MiB offered
    before = rss(router)
    with pytest.raises(TimeoutError):
        await wait_until(lambda: upstream.sent_bytes > 48 * 1024 * 1024, timeout=5, what="the model server held")
    assert rss(router) - before < 32 * 1024 * 1024
    writer.close()
    await wait_until(lambda: inflight(router), timeout=5, what="in-flight back to 0", until=lambda n: n == 0)


async def test_stream_ids_must_rise(grpc_router: StartGrpcRouter) -> None:
    """Stream-id exhaustion and reuse: the largest id is accepted; any id after it (lower, or even)
    is a connection error."""
    router = await grpc_router()
    client = await RawClient.connect(router.grpc_port)
    client.call(2**31 - 1, "/t.T/Echo", b"last")
    await client.wait_for(lambda c: c.received_data(2**31 - 1), what="the last stream's answer")
    client.call(5, "/t.T/Echo", b"again")
    assert (await client.goaway()).error_code == PROTOCOL_ERROR
    client.close()


async def test_a_malformed_request_is_reset_and_never_reaches_the_model_server(
    grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    router = await grpc_router()
    client = await RawClient.connect(router.grpc_port)
    client.headers(1, [*request_headers(), ("connection", "keep-alive")], end_stream=True)
    client.headers(3, [*request_headers(), ("X-Upper", "x")], end_stream=True)
    client.headers(5, [("x-first", "1"), *request_headers()], end_stream=True)
    # The same malformed block again: all indexed now, decoded from what the router remembers, and
    # checked again all the same.
    client.headers(7, [*request_headers(), ("X-Upper", "x")], end_stream=True)
    resets = await client.wait_for(lambda c: len(c.of(hf.RstStreamFrame)) == 4 and c.of(hf.RstStreamFrame))
    assert {f.error_code for f in resets} == {PROTOCOL_ERROR}
    client.call(9, "/t.T/Echo", b"fine")
    client.call(11, "/t.T/Echo", b"fine again")
    await client.wait_for(lambda c: c.received_data(11) and c.received_data(9), what="the good requests' answers")
    assert upstream.calls == ["Echo", "Echo"]
    assert (await grpc_requests(router))[("none", "rejected")] == 4.0
    client.close()


async def test_streams_past_the_advertised_limit_are_refused(grpc_router: StartGrpcRouter) -> None:
    router = await grpc_router()
    client = await RawClient.connect(router.grpc_port)
    settings = await client.wait_for(lambda c: [f for f in c.of(hf.SettingsFrame) if f.settings], what="SETTINGS")
    limit = settings[0].settings[MAX_CONCURRENT_STREAMS]
    assert limit == rules.MAX_CONCURRENT_STREAMS
    for i in range(limit + 1):
        client.headers(2 * i + 1, request_headers("/t.T/Stream"))
        client.data(2 * i + 1, message(b"1000 100"), end_stream=True)
    refused = await client.wait_for(lambda c: c.of(hf.RstStreamFrame), what="the stream past the limit refused")
    assert [(f.stream_id, f.error_code) for f in refused] == [(2 * limit + 1, REFUSED_STREAM)]
    client.close()


async def test_the_advertised_limit_never_exceeds_the_model_servers(grpc_router: StartGrpcRouter) -> None:
    async with grpcupstream.running(max_streams=10) as small:
        router = await grpc_router(grpc_upstream=f"http://127.0.0.1:{small.port}")
        client = await RawClient.connect(router.grpc_port)
        found = await client.wait_for(lambda c: [f for f in c.of(hf.SettingsFrame) if f.settings], what="SETTINGS")
        assert found[0].settings[MAX_CONCURRENT_STREAMS] == 10
        client.close()


async def test_connections_past_the_grpc_share_of_descriptors_get_goaway(upstream: grpcupstream.Upstream) -> None:
    """A router held to 208 descriptors: the traffic budget (48 connections) is split, an eighth (6) to
    the gRPC listener; a 7th h2c connection gets GOAWAY ENHANCE_YOUR_CALM at once, is counted, and the
    six keep working."""
    import resource

    from drain_router.runtime import tuning
    from tests.process import RouterProcess

    def tight() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (208, 208))

    total = tuning.traffic_connection_limit(208)
    share = tuning.grpc_connection_limit(total)
    router = await RouterProcess.start(
        "--upstream", "http://127.0.0.1:9", "--shutdown-drain-secs", "0", "--grpc-port", "0",
        "--grpc-upstream", f"http://127.0.0.1:{upstream.port}", preexec_fn=tight,
    )  # fmt: skip
    try:
        listening = await router.wait_event("startup.listening")
        assert (listening["connection_limit"], listening["grpc_connection_limit"]) == (total - share, share) == (39, 5)
        held = [await RawClient.connect(router.grpc_port) for _ in range(share)]
        for client in held:
            await client.wait_for(lambda c: c.of(hf.SettingsFrame), what="SETTINGS")
        refused = await RawClient.connect(router.grpc_port)
        goaway = await refused.goaway()
        assert (goaway.error_code, goaway.last_stream_id) == (ENHANCE_YOUR_CALM, 0)
        held[0].call(1, "/t.T/Echo", b"still served")
        await held[0].wait_for(lambda c: c.received_data(1), what="an answer on a held connection")
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{router.admin_port}/metrics") as resp:
            assert 'drain_router_connections_refused_total{reason="grpc_connection_limit"} 1.0' in await resp.text()
        for client in [*held, refused]:
            client.close()
    finally:
        await router.kill()


async def test_a_request_still_sending_after_a_complete_response_is_reset_with_no_error(
    grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    """RFC 9113 §8.1: the response ended while the client is still sending (an unknown method is
    answered UNIMPLEMENTED at once): the router resets the request with NO_ERROR, never CANCEL, so the
    client keeps the response, and the call is counted completed."""
    router = await grpc_router()
    client = await RawClient.connect(router.grpc_port)
    client.headers(1, request_headers("/t.T/Nope"))
    await client.wait_for(lambda c: c.of(hf.RstStreamFrame, 1), what="the reset after the response")
    client.decode_all()
    assert dict(client.response_headers(1)[-1])[b"grpc-status"] == b"12"
    assert [f.error_code for f in client.of(hf.RstStreamFrame, 1)] == [0]
    assert await grpc_requests(router) == {("12", "completed"): 1.0}
    client.close()
