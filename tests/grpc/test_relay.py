"""Real gRPC clients (grpcio) through the router's gRPC listener to a real gRPC server: every kind
of call, metadata and trailers, statuses, deadlines, large messages, cancellation, the count."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from drain_router_dev.process import wait_until
from tests import grpcupstream
from tests.grpc.conftest import StartGrpcRouter, grpc_requests, inflight


async def test_unary_server_streaming_and_bidi_calls_are_relayed(
    grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    router = await grpc_router()
    async with grpcupstream.channel(router.grpc_port) as ch:
        assert await grpcupstream.method(ch, "Echo")(b"hello", timeout=5) == b"hello"
        tokens = [m async for m in grpcupstream.method(ch, "Stream")(b"50 0", timeout=5)]
        assert tokens == [b"tok%d" % i for i in range(50)]

        async def requests():
            for i in range(3):
                yield b"m%d" % i

        answers = [m async for m in grpcupstream.method(ch, "Bidi")(requests(), timeout=5)]
        assert answers == [b"m0", b"m0", b"m1", b"m1", b"m2", b"m2"]
    assert upstream.calls == ["Echo", "Stream", "Bidi"]
    assert await grpc_requests(router) == {("0", "completed"): 3.0}


async def test_metadata_trailers_and_error_statuses_pass_through(
    grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    router = await grpc_router()
    async with grpcupstream.channel(router.grpc_port) as ch:
        call = grpcupstream.method(ch, "Echo")(b"x", metadata=(("x-echo", "mirrored"),), timeout=5)
        assert await call == b"x"
        assert ("x-echo", "mirrored") in tuple(await call.initial_metadata())
        assert ("x-trailer", "done") in tuple(await call.trailing_metadata())
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await grpcupstream.method(ch, "Echo")(
                b"x", metadata=(("x-status", "RESOURCE_EXHAUSTED"), ("x-details", "kv cache full")), timeout=5
            )
    assert failed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert failed.value.details() == "kv cache full"
    assert ("x-trailer", "done") in tuple(failed.value.trailing_metadata())
    assert await grpc_requests(router) == {("0", "completed"): 1.0, ("8", "completed"): 1.0}


async def test_a_16_mib_message_goes_both_ways(grpc_router: StartGrpcRouter) -> None:
    router = await grpc_router()
    big = bytes(range(256)) * (16 * 1024 * 1024 // 256)
    async with grpcupstream.channel(router.grpc_port) as ch:
        assert await grpcupstream.method(ch, "Echo")(big, timeout=30) == big


async def test_a_cancelled_call_reaches_the_model_server_within_100_ms(
    grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    """A client that cancels mid-stream: the upstream stream is reset at once, so the engine aborts
    the generation; the call is counted client_aborted and leaves the in-flight count."""
    router = await grpc_router()
    async with grpcupstream.channel(router.grpc_port) as ch:
        call = grpcupstream.method(ch, "Stream")(b"100000 10", timeout=30)
        assert await call.read() == b"tok0"
        await upstream.wait_active(1)
        assert await inflight(router) == 1
        cancelled = time.monotonic()
        call.cancel()
        await wait_until(lambda: upstream.cancelled_at, timeout=5, what="the upstream to see the cancel")
    assert upstream.cancelled_at[0] - cancelled < 0.1
    await wait_until(lambda: inflight(router), timeout=5, what="in-flight back to 0", until=lambda n: n == 0)
    assert await grpc_requests(router) == {("none", "client_aborted"): 1.0}


async def test_grpc_timeout_is_passed_on_and_honoured(
    grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    router = await grpc_router()
    async with grpcupstream.channel(router.grpc_port) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await grpcupstream.method(ch, "Echo")(b"x", metadata=(("x-wait", "30"),), timeout=0.3)
    assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await wait_until(lambda: upstream.cancelled_at, timeout=5, what="the upstream's call to end at its deadline")
    await wait_until(lambda: inflight(router), timeout=5, what="in-flight back to 0", until=lambda n: n == 0)


async def test_a_stream_counts_in_flight_until_it_ends(
    grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    router = await grpc_router("--access-log")
    async with grpcupstream.channel(router.grpc_port) as ch:
        call = grpcupstream.method(ch, "Stream")(b"3 200", timeout=10)
        assert await call.read() == b"tok0"
        assert await inflight(router) == 1
        assert [await call.read(), await call.read(), await call.read()] == [b"tok1", b"tok2", grpc.aio.EOF]
    await wait_until(lambda: inflight(router), timeout=5, what="in-flight back to 0", until=lambda n: n == 0)
    event = await router.wait_event("grpc.call")
    assert (event["method"], event["grpc_status"], event["outcome"]) == ("/t.T/Stream", "0", "completed")


async def test_health_is_relayed_while_serving_and_never_counted(
    grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    from grpc_health.v1 import health_pb2

    router = await grpc_router()
    await upstream.health.set("t.T", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert await grpcupstream.check(router.grpc_port, "t.T") == health_pb2.HealthCheckResponse.NOT_SERVING
    await upstream.health.set("t.T", health_pb2.HealthCheckResponse.SERVING)
    assert await grpcupstream.check(router.grpc_port, "t.T") == health_pb2.HealthCheckResponse.SERVING
    assert await grpc_requests(router) == {}
    assert (await inflight(router)) == 0


async def test_a_model_server_that_is_down_is_unavailable_to_the_client(grpc_router: StartGrpcRouter) -> None:
    router = await grpc_router(grpc_upstream="http://127.0.0.1:9")
    async with grpcupstream.channel(router.grpc_port) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await grpcupstream.method(ch, "Echo")(b"x", timeout=10)
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "unreachable" in (failed.value.details() or "")
    assert await grpc_requests(router) == {("14", "upstream_error"): 1.0}


async def test_many_concurrent_streams_share_the_upstream_connections(
    grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    router = await grpc_router()
    async with grpcupstream.channel(router.grpc_port) as ch:
        stream = grpcupstream.method(ch, "Stream")

        async def one() -> int:
            return len([m async for m in stream(b"200 0", timeout=30)])

        counts = await asyncio.gather(*(one() for _ in range(64)))
    assert counts == [200] * 64
    assert await grpc_requests(router) == {("0", "completed"): 64.0}


async def test_a_model_server_on_a_unix_socket(grpc_router: StartGrpcRouter, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "engine.sock")
    async with grpcupstream.running(unix_path=path) as on_socket:
        router = await grpc_router(grpc_upstream=f"unix:{path}")
        async with grpcupstream.channel(router.grpc_port) as ch:
            assert await grpcupstream.method(ch, "Echo")(b"via a socket", timeout=5) == b"via a socket"
    assert on_socket.calls == ["Echo"]
