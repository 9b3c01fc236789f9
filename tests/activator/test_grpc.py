"""``drain-router activator --grpc-port``, black-box: gRPC (h2c) calls from real grpcio clients, a
stand-in Kubernetes API, and a model pod made of a real ``drain-router serve --grpc-port`` on its own
address (127.0.0.2) in front of a real gRPC server (tests/grpcupstream.py).

1. Calls for a sleeping service are held (in ``activator_held_requests``, beside an HTTP request of
   the same service), a wake is asked for, and once the pod's router answers ready every call
   completes through its gRPC port (``spec.router.grpcPort``), streams whole; none lost.
2. A full queue answers RESOURCE_EXHAUSTED, the activation timeout UNAVAILABLE, both with
   ``grpc-retry-pushback-ms`` from the last cold start; a cancelled held call frees its place.
3. A call naming no valid service, an unknown one, one past --max-services, one for a service with
   no grpcPort, and a health check are answered at once, never held.
4. SIGTERM: a held call gets UNAVAILABLE with pushback (no model server saw it), exit 0.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from drain_router_dev import fake_kube
from drain_router_dev.fake_kube import NAME, NS
from drain_router_dev.process import wait_until
from tests import grpcupstream
from tests.activator import stand_ins
from tests.activator.stand_ins import POD_IP, SERVICE, Client, held, wait_held
from tests.process import RouterProcess

NAMED = (("x-drain-router-service", SERVICE),)


@pytest.fixture
async def upstream() -> AsyncIterator[grpcupstream.Upstream]:
    async with grpcupstream.running() as up:
        yield up


@pytest.fixture
async def pod(upstream: grpcupstream.Upstream) -> AsyncIterator[tuple[RouterProcess, stand_ins.Model]]:
    """The pod's router: HTTP to a model server, gRPC to the gRPC server, both on :data:`POD_IP`."""
    async with stand_ins.model_server() as model:
        args = ("--grpc-port", "0", "--grpc-upstream", f"http://127.0.0.1:{upstream.port}")
        p = await RouterProcess.start(
            "--upstream", model.url, "--host", POD_IP, "--admin-host", POD_IP, "--shutdown-drain-secs", "0", *args
        )
        try:
            await p.wait_event("startup.listening")
            yield p, model
        finally:
            await p.kill()


def modelservice(port: int, grpc_port: int | None, **kwargs: Any) -> dict[str, Any]:
    obj = fake_kube.modelservice(port=port, **kwargs)
    if grpc_port is not None:
        obj["spec"]["router"]["grpcPort"] = grpc_port
    return obj


def trailers(error: grpc.aio.AioRpcError) -> dict[str, str]:
    return {k: v for k, v in error.trailing_metadata() or () if isinstance(v, str)}


async def refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


async def test_held_calls_wake_the_service_and_complete_through_the_pod_router(kube, upstream, pod) -> None:
    """1. four unary calls, two server streams and one HTTP request held: the gauge counts 7  2. the
    wake patch  3. the pod listed: every call completes OK through the pod's router, the unary ones
    reaching the gRPC server in arrival order, each stream whole (20 messages), the HTTP request
    too; none lost, each once  4. a late call goes straight through."""
    router, model = pod
    kube.services[(NS, NAME)] = modelservice(router.port, router.grpc_port)
    async with stand_ins.activator(kube.url, "--grpc-port", "0") as act, grpcupstream.channel(act.grpc_port) as ch:
        echo, stream = grpcupstream.method(ch, "Echo"), grpcupstream.method(ch, "Stream")
        unary = []
        for i in range(4):
            unary.append(asyncio.ensure_future(echo(b"u%d" % i, metadata=(*NAMED, ("x-id", str(i))), timeout=30)))
            await wait_held(act.admin_port, i + 1)
        streams = [stream(b"20 5", metadata=NAMED, timeout=30) for _ in range(2)]
        await wait_held(act.admin_port, 6)
        http = await Client.send(act.port, "/hold?id=h")
        await wait_held(act.admin_port, 7)
        await wait_until(lambda: kube.accepted(), 5.0, "the wake patch")
        await asyncio.sleep(0.3)
        assert upstream.calls == [] and await held(act.admin_port) == 7

        kube.pods = [fake_kube.pod(POD_IP, "llama-0")]
        assert await asyncio.gather(*unary) == [b"u%d" % i for i in range(4)]
        for call in streams:
            assert [m async for m in call] == [b"tok%d" % i for i in range(20)]
            assert await call.code() == grpc.StatusCode.OK
        status, _, body = await http.answer()
        assert (status, stand_ins.body_id(body)) == (200, "h") and model.arrived == ["h"]
        assert sorted(upstream.calls) == ["Echo"] * 4 + ["Stream"] * 2, "each reached the model server once"
        assert all(meta.get("x-drain-router-service") == SERVICE for meta in upstream.metadata)
        assert [meta["x-id"] for meta in upstream.metadata] == ["0", "1", "2", "3"], "in arrival order"
        assert await held(act.admin_port) == 0

        assert await echo(b"late", metadata=NAMED, timeout=10) == b"late"
        assert (await stand_ins.metric(act.admin_port, "drain_router_activations_total"))[()] == 1
        completed = await stand_ins.metric(act.admin_port, "drain_router_grpc_requests_total")
        assert completed[(("grpc_status", "0"), ("outcome", "completed"))] == 7


async def test_queue_full_timeout_and_a_cancelled_call(kube) -> None:
    """1. an HTTP request and a call held (--queue-size 2 counts both): a third RESOURCE_EXHAUSTED
    with pushback  2. the call cancelled: its place is free, a new one held  3. past
    --activation-timeout-secs: the call UNAVAILABLE with pushback, the request 503; every pushback
    the last cold start (7.3 s: 8000 ms)."""
    kube.services[(NS, NAME)] = modelservice(1, 1, cold_start=7.3)
    args = ("--grpc-port", "0", "--queue-size", "2", "--activation-timeout-secs", "2")
    async with stand_ins.activator(kube.url, *args) as act, grpcupstream.channel(act.grpc_port) as ch:
        echo = grpcupstream.method(ch, "Echo")
        first = await Client.send(act.port, "/hold?id=a")
        await wait_held(act.admin_port, 1)
        leaving = echo(b"b", metadata=NAMED, timeout=30)
        await wait_held(act.admin_port, 2)
        await wait_until(lambda: kube.reads, 5.0, "the service read")
        await asyncio.sleep(0.3)  # its cold start read
        full = await refused(echo(b"c", metadata=NAMED, timeout=5))
        assert full.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, full
        assert trailers(full)["grpc-retry-pushback-ms"] == "8000"

        leaving.cancel()
        await wait_held(act.admin_port, 1)
        second = asyncio.ensure_future(echo(b"d", metadata=NAMED, timeout=30))
        await wait_held(act.admin_port, 2)

        timed_out = await refused(second)
        assert timed_out.code() == grpc.StatusCode.UNAVAILABLE, timed_out
        assert trailers(timed_out)["grpc-retry-pushback-ms"] == "8000"
        assert "wake" in (timed_out.details() or "")
        status, headers, _ = await first.answer(timeout=5.0)
        assert status == 503 and headers["retry-after"] == "8"
        assert await held(act.admin_port) == 0
        assert (await stand_ins.metric(act.admin_port, "drain_router_activation_timeouts_total"))[()] == 2


async def test_calls_naming_no_service_are_answered_at_once_never_held(kube) -> None:
    """1. no header, invalid ones, a health check: UNIMPLEMENTED, no API call  2. a service that does
    not exist: NOT_FOUND  3. a service with no grpcPort: UNAVAILABLE saying so  4. --max-services 2,
    both busy: a third service UNAVAILABLE. Nothing held; no message names an address."""
    async with stand_ins.activator(kube.url, "--grpc-port", "0", "--max-services", "2") as act:
        async with grpcupstream.channel(act.grpc_port) as ch:
            echo = grpcupstream.method(ch, "Echo")
            for metadata in (
                (),
                (("x-drain-router-service", "Not A Service"),),
                (("x-drain-router-service", "a/b/c"),),
            ):
                error = await refused(echo(b"x", metadata=metadata, timeout=2))
                assert error.code() == grpc.StatusCode.UNIMPLEMENTED, (metadata, error)
                assert "127.0.0.1" not in (error.details() or "")
            check = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), metadata=NAMED, timeout=2)
            health = await refused(check)  # (naming a service: still never held, never a wake)
            assert health.code() == grpc.StatusCode.UNIMPLEMENTED
            assert kube.reads == 0
            assert await stand_ins.metric(act.admin_port, "drain_router_activator_held_requests") == {}

            ghost = await refused(echo(b"x", metadata=(("x-drain-router-service", "models/ghost"),), timeout=3))
            assert ghost.code() == grpc.StatusCode.NOT_FOUND, ghost

            kube.services[(NS, NAME)] = modelservice(1, None)
            no_port = await refused(echo(b"x", metadata=NAMED, timeout=3))
            assert no_port.code() == grpc.StatusCode.UNAVAILABLE and "no gRPC port" in (no_port.details() or "")
            assert await held(act.admin_port) == 0
            again = await refused(echo(b"x", metadata=NAMED, timeout=3))  # known now: at once
            assert again.code() == grpc.StatusCode.UNAVAILABLE

            holding = []  # two busy services (the idle ones make room for them)
            for other in ("one", "two"):
                kube.services[(NS, other)] = modelservice(1, 1)
                holding.append(echo(b"x", metadata=(("x-drain-router-service", f"{NS}/{other}"),), timeout=30))
                await wait_held(act.admin_port, 1, service=f"{NS}/{other}")
            full = await refused(echo(b"x", metadata=(("x-drain-router-service", f"{NS}/third"),), timeout=3))
            assert full.code() == grpc.StatusCode.UNAVAILABLE and "too many services" in (full.details() or "")
            for call in holding:
                call.cancel()
        refusals = await stand_ins.metric(act.admin_port, "drain_router_activator_refused_total")
        assert refusals[(("reason", "no_grpc_port"),)] == 2


async def test_sigterm_answers_held_calls_unavailable_and_exits(kube) -> None:
    """1. one call held  2. SIGTERM (drain window 1 s)  3. closing: UNAVAILABLE with pushback at once
    4. exit 0."""
    kube.services[(NS, NAME)] = modelservice(1, 1)
    async with stand_ins.activator(kube.url, "--grpc-port", "0", "--shutdown-drain-secs", "1") as act:
        async with grpcupstream.channel(act.grpc_port) as ch:
            call = asyncio.ensure_future(grpcupstream.method(ch, "Echo")(b"a", metadata=NAMED, timeout=30))
            await wait_held(act.admin_port, 1)
            act.signal(signal.SIGTERM)
            error = await asyncio.wait_for(refused(call), 5.0)
            assert error.code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in (error.details() or "")
            assert int(trailers(error)["grpc-retry-pushback-ms"]) >= 1000
        assert await act.wait(10.0) == 0
