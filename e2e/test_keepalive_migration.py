"""Keep-alive migration: a pooled client talking straight to a replica is told to reconnect.

While draining, every response carries ``Connection: close``, so a client (or a gateway's pool) does
not keep sending to a pod that is about to close its listener: its next request opens a new
connection, which behind a Service or balancer lands on another replica.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from drain_router_dev import cluster, load, pods, streams
from drain_router_dev.process import Process, wait_until


def _local_port(resp: aiohttp.ClientResponse) -> int:
    assert resp.connection is not None and resp.connection.transport is not None
    return int(resp.connection.transport.get_extra_info("sockname")[1])


@pytest.mark.timeout(60)
async def test_draining_replica_sends_connection_close(
    start_fake_model: Any,
    start_replica: Any,
    session: aiohttp.ClientSession,
) -> None:
    """1. a pooled client (one keep-alive connection) streams twice: same connection 2. SIGTERM
    3. it streams three more times during the drain window. Result: each drain-time response says
    `Connection: close` and completes, and each next request goes over a new connection."""
    model = await start_fake_model()
    replica = await start_replica("replica", model.url, shutdown_drain_secs=3)
    seen: list[tuple[int, str | None]] = []

    def note(resp: aiohttp.ClientResponse) -> None:
        seen.append((_local_port(resp), resp.headers.get("Connection")))

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as pooled:

        async def stream() -> streams.Outcome:
            return streams.classify(
                await load.stream_completion(pooled, replica.url, chunks=3, interval_ms=10, on_response=note)
            )

        assert [await stream(), await stream()] == [streams.Outcome.OK] * 2
        (port_a, conn_a), (port_b, conn_b) = seen
        assert port_a == port_b, "the client did not reuse its keep-alive connection before the drain"
        assert (conn_a or "").lower() != "close" and (conn_b or "").lower() != "close"

        replica.sigterm()

        async def draining() -> bool:
            status, body = await replica.readyz(session)
            return status == 503 and body["status"] == "draining"

        await wait_until(draining, timeout=5, what="/readyz to say draining")
        during = [await stream() for _ in range(3)]
        assert (await replica.readyz(session))[1]["status"] == "draining", "the window ended mid-test"

    assert during == [streams.Outcome.OK] * 3
    drain_time = seen[2:]
    assert [c.lower() if c else c for _, c in drain_time] == ["close"] * 3, seen
    # The first drain-time request may ride the idle pooled connection; after each `close` answer,
    # the next request must come over a connection of its own.
    ports = [port for port, _ in drain_time]
    assert len(set(ports)) == len(ports), f"a connection was reused after Connection: close: {seen}"
    assert await replica.process.wait_exit(timeout=10) == 0


@pytest.mark.timeout(60)
async def test_engine_keeps_pooled_connection_through_the_prestop_sleep(
    processes: list[Process], session: aiohttp.ClientSession, logs: Any
) -> None:
    """The sleep recipe's side of the same case. 1. a pooled client streams twice from an engine pod
    (no router) 2. the pod is deleted: its readiness says 503 and the preStop sleep runs 3. the client
    streams three more times during the sleep. Result: each answer completes and none says
    `Connection: close`: the client keeps its one connection to the dying pod (nothing tells it to
    move) until the engine's SIGTERM closes it."""
    recipe = pods.SleepRecipe(prestop_sleep_secs=3.0, shutdown_timeout_secs=2.0)
    pod = pods.EnginePod("engine", logs, recipe, chunks=3, interval_ms=10)
    processes.append(pod.process)
    seen: list[tuple[int, str | None]] = []

    def note(resp: aiohttp.ClientResponse) -> None:
        seen.append((_local_port(resp), resp.headers.get("Connection")))

    try:
        await pod.start(session)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as pooled:

            async def stream() -> streams.Outcome:
                return streams.classify(
                    await load.stream_completion(pooled, pod.url, chunks=3, interval_ms=10, on_response=note)
                )

            assert [await stream(), await stream()] == [streams.Outcome.OK] * 2
            terminating = asyncio.create_task(pod.terminate())

            async def not_ready() -> bool:
                return (await cluster.get_json(session, pod.probe_url))[0] == 503

            await wait_until(not_ready, timeout=5, what="the pod's readiness to say 503")
            during = [await stream() for _ in range(3)]
            assert pod.phase == "preStop sleep", "the sleep ended mid-test"
        assert await asyncio.wait_for(terminating, 15) == 0
    finally:
        await pod.close()
    assert during == [streams.Outcome.OK] * 3
    assert [c for _, c in seen] == [None] * 5, seen
    assert len({port for port, _ in seen}) == 1, f"the pooled connection was not kept: {seen}"
