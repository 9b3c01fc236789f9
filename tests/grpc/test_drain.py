"""The gRPC listener through the drain, on real router processes and real signals: the
RFC 9113 §6.8 GOAWAY sequence, streams running on, health NOT_SERVING at once, refused streams,
grpc-status 14 at the deadline."""

from __future__ import annotations

import signal
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hyperframe import frame as hf

from drain_router_dev.process import wait_until
from tests import grpcupstream, rawh2upstream
from tests.grpc.conftest import StartGrpcRouter, inflight
from tests.h2client import RawClient, message, request_headers

MAX_STREAM_ID = 2**31 - 1
NO_ERROR = 0
REFUSED_STREAM = 7


async def test_closing_sends_goaway_ping_goaway_then_refuses_new_streams(
    grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    """GOAWAY(2^31-1), a PING, and once it is acknowledged GOAWAY(last stream id), in that order; the
    stream in flight streams on to its end; a stream opened after the final GOAWAY is refused with
    REFUSED_STREAM (a transparent retry for gRPC) and never reaches the model server."""
    router = await grpc_router()
    client = await RawClient.connect(router.grpc_port)
    client.headers(1, [*grpcupstream_request("/t.T/Stream")])
    client.data(1, _message(b"6 100"), end_stream=True)
    await client.wait_for(lambda c: c.received_data(1), what="the first message")
    router.signal(signal.SIGTERM)
    await client.wait_for(lambda c: len(c.of(hf.GoAwayFrame)) == 2, what="two GOAWAYs")
    control = [s.frame for s in client.frames if isinstance(s.frame, (hf.GoAwayFrame, hf.PingFrame))]
    first, ping, final = control[0], control[1], control[2]
    assert (type(first), first.last_stream_id, first.error_code) == (hf.GoAwayFrame, MAX_STREAM_ID, NO_ERROR)
    assert isinstance(ping, hf.PingFrame) and "ACK" not in ping.flags
    assert (type(final), final.last_stream_id, final.error_code) == (hf.GoAwayFrame, 1, NO_ERROR)
    calls_before = len(upstream.calls)
    client.headers(3, grpcupstream_request("/t.T/Echo"), end_stream=False)
    client.data(3, _message(b"late"), end_stream=True)
    refused = await client.wait_for(lambda c: c.of(hf.RstStreamFrame, 3), what="stream 3 refused")
    assert refused[0].error_code == REFUSED_STREAM
    # Stream 1 runs to its end: six messages, then the trailers with grpc-status 0.
    await client.wait_for(lambda c: any("END_STREAM" in f.flags for f in c.of(hf.HeadersFrame, 1)), what="trailers")
    assert client.received_data(1).count(b"tok") == 6
    assert await router.wait(10) == 0
    assert len(upstream.calls) == calls_before
    client.close()


async def test_a_client_that_never_answers_the_ping_still_gets_the_final_goaway(
    grpc_router: StartGrpcRouter,
) -> None:
    router = await grpc_router()
    client = await RawClient.connect(router.grpc_port)
    client.auto_ping_ack = False
    client.headers(1, grpcupstream_request("/t.T/Stream"))
    client.data(1, _message(b"1000 50"), end_stream=True)
    await client.wait_for(lambda c: c.received_data(1), what="the first message")
    router.signal(signal.SIGTERM)
    await client.wait_for(lambda c: len(c.of(hf.GoAwayFrame)) == 2, what="the final GOAWAY after the PING timeout")
    assert [f.last_stream_id for f in client.of(hf.GoAwayFrame)] == [MAX_STREAM_ID, 1]
    client.send(hf.RstStreamFrame(1, error_code=8))
    await client.wait_closed()
    client.close()
    assert await router.wait(10) == 0


async def test_a_watch_gets_not_serving_within_100_ms_of_sigterm(
    grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    """While serving, Watch is relayed (the model server says SERVING); SIGTERM: the router pushes
    NOT_SERVING at once, without waiting for a probe period; a Check in the drain window is answered
    NOT_SERVING by the router."""
    router = await grpc_router(drain_secs="30")
    async with grpcupstream.channel(router.grpc_port) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=""))
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        sent = time.monotonic()
        router.signal(signal.SIGTERM)
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert time.monotonic() - sent < 0.1
        answer = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()
    assert await inflight(router) == 0
    router.signal(signal.SIGTERM)  # a second SIGTERM skips the rest of the window
    assert await router.wait(10) == 0


async def test_streams_open_at_sigterm_run_through_the_window_and_closing(
    grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    """A server-streaming call open at SIGTERM streams on through the drain window (new calls are
    still served there) and through closing, and ends OK; then the router exits 0."""
    router = await grpc_router(drain_secs="1")
    async with grpcupstream.channel(router.grpc_port) as ch:
        stream = grpcupstream.method(ch, "Stream")(b"30 100", timeout=20)
        assert await stream.read() == b"tok0"
        router.signal(signal.SIGTERM)
        await router.wait_event("drain.start")
        assert await grpcupstream.method(ch, "Echo")(b"in the window", timeout=5) == b"in the window"
        await router.wait_event("drain.closing")
        rest = []
        while (m := await stream.read()) != grpc.aio.EOF:
            rest.append(m)
        assert await stream.code() == grpc.StatusCode.OK
    assert rest == [b"tok%d" % i for i in range(1, 30)]
    assert await router.wait(10) == 0


async def test_after_closing_new_calls_fail_unavailable_with_a_single_router(grpc_router: StartGrpcRouter) -> None:
    router = await grpc_router(drain_secs="30")
    async with grpcupstream.channel(router.grpc_port) as ch:
        assert await grpcupstream.method(ch, "Stream")(b"1 0", timeout=5).read() == b"tok0"
        holder = grpcupstream.method(ch, "Stream")(b"1000 50", timeout=30)
        assert await holder.read() == b"tok0"
        router.signal(signal.SIGTERM)
        await router.wait_event("drain.start")  # (two signals sent at once would merge into one)
        router.signal(signal.SIGTERM)  # the second one goes straight to closing
        await router.wait_event("drain.closing")
        # A call the client sent before it read the GOAWAY is served (RFC 9113 §6.8): wait until its
        # channel has read it (it leaves READY), so the next call needs a connection no one accepts.
        while ch.get_state() is grpc.ChannelConnectivity.READY:
            await ch.wait_for_state_change(grpc.ChannelConnectivity.READY)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await grpcupstream.method(ch, "Echo")(b"x", timeout=5)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        holder.cancel()
    assert await router.wait(10) == 0


async def test_at_the_deadline_open_calls_end_unavailable_and_the_router_exits_1(
    grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    """Grace 3 s: the deadline is 1 s after SIGTERM. The open call ends with grpc-status 14 and a
    message naming the drain deadline (retryable), its upstream stream is reset, it is counted
    deadline_aborted, and the router exits 1."""
    router = await grpc_router("--termination-grace-secs", "3")
    async with grpcupstream.channel(router.grpc_port) as ch:
        stream = grpcupstream.method(ch, "Stream")(b"100000 50", timeout=30)
        assert await stream.read() == b"tok0"
        router.signal(signal.SIGTERM)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            while await stream.read() != grpc.aio.EOF:
                pass
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "drain deadline" in (failed.value.details() or "")
    await wait_until(lambda: upstream.cancelled_at, timeout=5, what="the upstream stream reset")
    assert await router.wait(10) == 1
    deadline = await router.wait_event("drain.deadline")
    assert deadline["aborted"] == 1


def grpcupstream_request(path: str) -> list[tuple[str, str]]:
    return request_headers(path)


def _message(body: bytes) -> bytes:
    return message(body)


def _plain_open(stream_id, encoder):  # type: ignore[no-untyped-def]
    block = encoder.encode([(":status", "200"), ("content-type", "text/event-stream")])
    return [hf.HeadersFrame(stream_id, data=block, flags=["END_HEADERS"]), hf.DataFrame(stream_id, data=b"data: 1\n\n")]


async def test_at_the_deadline_a_plain_h2c_stream_is_reset_cancel(grpc_router: StartGrpcRouter) -> None:
    """A non-gRPC stream has no trailers to carry a status: at the deadline it gets RST_STREAM CANCEL."""
    async with rawh2upstream.serving(_plain_open) as port:
        router = await grpc_router("--termination-grace-secs", "3", grpc_upstream=f"http://127.0.0.1:{port}")
        client = await RawClient.connect(router.grpc_port)
        client.headers(
            1, [(":method", "GET"), (":scheme", "http"), (":path", "/events"), (":authority", "x")], end_stream=True
        )
        await client.wait_for(lambda c: c.received_data(1), what="the first event")
        router.signal(signal.SIGTERM)
        reset = await client.wait_for(lambda c: c.of(hf.RstStreamFrame, 1), timeout=10, what="the deadline's reset")
        assert reset[0].error_code == 8  # CANCEL
        assert await router.wait(10) == 1
        client.close()
