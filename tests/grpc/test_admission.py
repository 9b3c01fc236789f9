"""Admission control on the gRPC listener, on real router processes with grpcio clients:
streams count against ``--max-concurrent-requests``; a refusal for capacity is RESOURCE_EXHAUSTED
and at closing UNAVAILABLE, both with ``grpc-retry-pushback-ms`` and ``x-drain-router-refused``, and never reaches the model
server; a client's RST_STREAM frees its place in the queue at once; health calls never wait."""

from __future__ import annotations

import asyncio
import json
import signal

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from drain_router_dev.process import wait_until
from tests import grpcupstream
from tests.grpc.conftest import StartGrpcRouter, admin_json, grpc_requests
from tests.process import RouterProcess


def limits(n: int, q: int, t: int = 30) -> tuple[str, ...]:
    return ("--max-concurrent-requests", str(n), "--queue-size", str(q), "--queue-timeout-secs", str(t))


async def wait_counts(router: RouterProcess, inflight: int, queued: int) -> None:
    async def now() -> tuple[object, object]:
        report = await admin_json(router, "/admin/inflight")
        return report["inflight"], report["queued"]

    await wait_until(now, 5, f"inflight {inflight}, queued {queued}", until=lambda v: v == (inflight, queued))


def pushback_ms(error: grpc.aio.AioRpcError) -> int:
    return int(dict(error.trailing_metadata() or ())["grpc-retry-pushback-ms"])


def marker(error: grpc.aio.AioRpcError) -> str:
    """The marker of a call the model server never saw (trailers-only: grpcio reads it as trailing
    metadata)."""
    return str(dict(error.trailing_metadata() or ())["x-drain-router-refused"])


async def test_capacity_refusals_are_resource_exhausted_with_pushback(
    grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    router = await grpc_router(*limits(1, 1, t=1))
    async with grpcupstream.channel(router.grpc_port) as ch:
        stream = grpcupstream.method(ch, "Stream")
        running = stream(b"1000 20", timeout=30)
        assert await running.read() == b"tok0"
        waiting = asyncio.ensure_future(grpcupstream.method(ch, "Echo")(b"waits", timeout=10))
        await wait_counts(router, 1, 1)
        with pytest.raises(grpc.aio.AioRpcError) as full:
            await grpcupstream.method(ch, "Echo")(b"full", timeout=5)
        assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert pushback_ms(full.value) >= 1000
        assert marker(full.value) == "queue_full"
        with pytest.raises(grpc.aio.AioRpcError) as timed_out:
            await waiting  # --queue-timeout-secs 1
        assert timed_out.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert pushback_ms(timed_out.value) >= 1000
        assert marker(timed_out.value) == "queue_timeout"
        assert upstream.calls == ["Stream"]  # neither refused call reached the model server
        assert upstream.max_active == 1
        running.cancel()
    assert (await grpc_requests(router))[("8", "rejected")] == 2
    await wait_counts(router, 0, 0)


async def test_at_closing_a_queued_call_gets_unavailable_and_the_running_one_finishes(
    grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    router = await grpc_router(*limits(1, 5), drain_secs="1")
    async with grpcupstream.channel(router.grpc_port) as ch:
        running = grpcupstream.method(ch, "Stream")(b"40 50", timeout=30)
        assert await running.read() == b"tok0"
        waiting = asyncio.ensure_future(grpcupstream.method(ch, "Echo")(b"waits", timeout=30))
        await wait_counts(router, 1, 1)
        router.signal(signal.SIGTERM)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await waiting
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert pushback_ms(refused.value) >= 1000
        assert marker(refused.value) == "closing"
        last = b""
        while (message := await running.read()) != grpc.aio.EOF:
            last = message
        assert last == b"tok39"  # in flight at closing: finished whole
        assert await running.code() == grpc.StatusCode.OK
    assert upstream.calls == ["Stream"]
    assert await router.wait(10) == 0


async def test_a_cancelled_queued_call_frees_its_place_at_once(
    grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    router = await grpc_router(*limits(1, 1))
    async with grpcupstream.channel(router.grpc_port) as ch:
        running = grpcupstream.method(ch, "Stream")(b"1000 20", timeout=30)
        assert await running.read() == b"tok0"
        waiting = grpcupstream.method(ch, "Echo")(b"waits", timeout=30)
        await wait_counts(router, 1, 1)
        waiting.cancel()  # RST_STREAM CANCEL
        await wait_counts(router, 1, 0)
        again = asyncio.ensure_future(grpcupstream.method(ch, "Echo")(b"again", timeout=30))
        await wait_counts(router, 1, 1)  # the place is free: it waits, not refused
        running.cancel()
        assert await again == b"again"
    assert upstream.calls == ["Stream", "Echo"]
    assert (await grpc_requests(router))[("none", "client_aborted")] >= 1


async def test_health_calls_never_wait(grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream) -> None:
    router = await grpc_router(*limits(1, 0))
    async with grpcupstream.channel(router.grpc_port) as ch:
        running = grpcupstream.method(ch, "Stream")(b"1000 20", timeout=30)
        assert await running.read() == b"tok0"
        answer = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        running.cancel()


def retrying_channel(port: int) -> grpc.aio.Channel:
    """A grpcio channel whose retry policy retries RESOURCE_EXHAUSTED, as gRPC's retry design has a
    client do: it waits the server's ``grpc-retry-pushback-ms`` before its next attempt."""
    policy = {
        "methodConfig": [
            {
                "name": [{"service": grpcupstream.SERVICE}],
                "retryPolicy": {
                    "maxAttempts": 5,
                    "initialBackoff": "0.1s",
                    "maxBackoff": "1s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["RESOURCE_EXHAUSTED"],
                },
            }
        ]
    }
    options = (*grpcupstream.OPTIONS, ("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(policy)))
    return grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options)


async def test_a_grpc_client_with_a_retry_policy_waits_the_pushback_and_succeeds(
    grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    """No queue, one slot held by a short stream: a call from a channel with a retry policy is
    refused RESOURCE_EXHAUSTED with a pushback of at least 1 s; grpcio waits it out, retries, and
    the call succeeds once the slot is free; the model server saw it once."""
    router = await grpc_router(*limits(1, 0))
    async with grpcupstream.channel(router.grpc_port) as ch, retrying_channel(router.grpc_port) as retrying:
        running = grpcupstream.method(ch, "Stream")(b"3 100", timeout=30)
        assert await running.read() == b"tok0"
        started = asyncio.get_running_loop().time()
        assert await grpcupstream.method(retrying, "Echo")(b"retried", timeout=20) == b"retried"
        assert asyncio.get_running_loop().time() - started >= 1.0  # it waited the pushback
        assert [m async for m in _rest(running)] == [b"tok1", b"tok2"]
    assert upstream.calls.count("Echo") == 1
    counts = await grpc_requests(router)
    assert counts[("8", "rejected")] >= 1 and counts[("0", "completed")] == 2


async def _rest(call):  # type: ignore[no-untyped-def]
    while (message := await call.read()) != grpc.aio.EOF:
        yield message
