"""``drain-router activator`` on a ``grpc`` port, black-box: gRPC (h2c) calls from real grpcio
clients on the port the port map assigns their service (``<ns>/<name>/grpc``), a stand-in
Kubernetes API, and a model pod made of a real ``drain-router serve --grpc-port`` on its own
address (127.0.0.2) in front of a real gRPC server (tests/grpcupstream.py).

1. Calls for a sleeping service are held (in ``activator_held_requests``, beside an HTTP request of
   the same service), a wake is asked for, and once the pod's router answers ready every call
   completes through its gRPC port (``spec.router.grpcPort``), streams whole; none lost.
2. A full queue answers RESOURCE_EXHAUSTED, the activation timeout UNAVAILABLE, both with
   ``grpc-retry-pushback-ms`` from the last cold start; a cancelled held call frees its place.
3. A health check, a call for an unknown service, and one for a service with no grpcPort are
   answered at once, never held; the last one before any wake is asked for (no status patch).
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

NAMED = ()  # (no metadata names a service: its port does)
GRPC, HTTP = f"{SERVICE}/grpc", f"{SERVICE}/http"


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
    grpc_port, http_port = stand_ins.assign(kube, GRPC, HTTP)
    async with stand_ins.listening(kube) as act, grpcupstream.channel(grpc_port) as ch:
        echo, stream = grpcupstream.method(ch, "Echo"), grpcupstream.method(ch, "Stream")
        unary = []
        for i in range(4):
            unary.append(asyncio.ensure_future(echo(b"u%d" % i, metadata=(*NAMED, ("x-id", str(i))), timeout=30)))
            await wait_held(act.admin_port, i + 1)
        streams = [stream(b"20 5", metadata=NAMED, timeout=30) for _ in range(2)]
        await wait_held(act.admin_port, 6)
        http = await Client.send(http_port, "/hold?id=h")
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
    args = ("--queue-size", "2", "--activation-timeout-secs", "2")
    grpc_port, http_port = stand_ins.assign(kube, GRPC, HTTP)
    async with stand_ins.listening(kube, *args) as act, grpcupstream.channel(grpc_port) as ch:
        echo = grpcupstream.method(ch, "Echo")
        first = await Client.send(http_port, "/hold?id=a")
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


async def test_calls_that_cannot_be_served_are_answered_at_once_never_held(kube) -> None:
    """1. a health check: UNIMPLEMENTED, no API call  2. a service that does not exist: NOT_FOUND
    3. a service with no grpcPort: UNAVAILABLE saying so, after one read and with no status patch
    (no wake asked for a call that can never be served), then at once with no read at all.
    Nothing held; no message names an address or a service."""
    ghost_port, grpc_port = stand_ins.assign(kube, f"{NS}/ghost/grpc", GRPC)
    kube.services[(NS, NAME)] = modelservice(1, None)
    async with stand_ins.listening(kube) as act:
        async with grpcupstream.channel(grpc_port) as ch:
            check = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2)
            health = await refused(check)  # (never held, never a wake)
            assert health.code() == grpc.StatusCode.UNIMPLEMENTED
            assert kube.reads == 0

            no_port = await refused(grpcupstream.method(ch, "Echo")(b"x", timeout=3))
            assert no_port.code() == grpc.StatusCode.UNAVAILABLE and "no gRPC port" in (no_port.details() or "")
            assert kube.calls_to("GET", f"/modelservices/{NAME}") == 1
            assert kube.patches == [], "a wake asked for a call that can never be served"
            again = await refused(grpcupstream.method(ch, "Echo")(b"x", timeout=3))  # known now: at once
            assert again.code() == grpc.StatusCode.UNAVAILABLE
            assert kube.calls_to("GET", f"/modelservices/{NAME}") == 1 and kube.patches == []
            assert await held(act.admin_port) == 0
        async with grpcupstream.channel(ghost_port) as ch:
            ghost = await refused(grpcupstream.method(ch, "Echo")(b"x", timeout=3))
            assert ghost.code() == grpc.StatusCode.NOT_FOUND, ghost
            assert "ghost" not in (ghost.details() or "") and "127.0.0.1" not in (ghost.details() or "")
        refusals = await stand_ins.metric(act.admin_port, "drain_router_activator_refused_total")
        assert refusals[(("reason", "no_grpc_port"),)] == 2


async def test_sigterm_answers_held_calls_unavailable_and_exits(kube) -> None:
    """1. one call held  2. SIGTERM (drain window 1 s)  3. closing: UNAVAILABLE with pushback at once
    4. exit 0."""
    kube.services[(NS, NAME)] = modelservice(1, 1)
    [grpc_port] = stand_ins.assign(kube, GRPC)
    async with stand_ins.listening(kube, "--shutdown-drain-secs", "1") as act:
        async with grpcupstream.channel(grpc_port) as ch:
            call = asyncio.ensure_future(grpcupstream.method(ch, "Echo")(b"a", metadata=NAMED, timeout=30))
            await wait_held(act.admin_port, 1)
            act.signal(signal.SIGTERM)
            error = await asyncio.wait_for(refused(call), 5.0)
            assert error.code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in (error.details() or "")
            assert int(trailers(error)["grpc-retry-pushback-ms"]) >= 1000
        assert await act.wait(10.0) == 0
