"""The preStop hold: a model server that dies at once on SIGTERM loses nothing when it is signalled
the way the kubelet does it with the chart's hook, and loses every open stream without it.

Kubernetes signals all containers of a pod at once. The router gets SIGTERM immediately; the model
server container's preStop hook (``GET /admin/drain-wait`` on the router's admin port) runs first,
and only when it returns does the kubelet send that container SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import aiohttp
import pytest

from drain_router_dev import cluster, load, streams
from drain_router_dev.process import wait_until

STREAMS = 8
CHUNKS = 20
INTERVAL_MS = 75  # 1.5 s streams: SIGTERM lands in their middle


async def _open_streams(
    session: aiohttp.ClientSession, replica: cluster.Replica, model: cluster.FakeModel
) -> list[asyncio.Task[streams.StreamResult]]:
    tasks = [
        asyncio.create_task(load.stream_completion(session, replica.url, chunks=CHUNKS, interval_ms=INTERVAL_MS))
        for _ in range(STREAMS)
    ]

    async def all_running() -> bool:
        return (await model.stats(session))["active"] == STREAMS

    await wait_until(all_running, timeout=10, what=f"{STREAMS} streams running in the model server")
    return tasks


@pytest.mark.timeout(60)
async def test_kubelet_order_with_prestop_hold_loses_nothing(
    start_fake_model: Any,
    start_replica: Any,
    session: aiohttp.ClientSession,
    report: list[str],
) -> None:
    """1. eight streams run through the router 2. the kubelet calls /admin/drain-wait (the model
    server's preStop) and SIGTERMs the router 3. the hook returns 4. the kubelet SIGTERMs the model
    server, which dies at once. Result: every stream complete; the hook returned only after the
    last one ended; the router exits 0."""
    model = await start_fake_model(exit_on_sigterm=True)
    replica = await start_replica("replica", model.url, shutdown_drain_secs=1)
    async with aiohttp.ClientSession() as clients:
        tasks = await _open_streams(clients, replica, model)
        hook = asyncio.create_task(
            cluster.get_json(session, f"{replica.admin_url}/admin/drain-wait?timeout=20", timeout=30)
        )
        replica.sigterm()
        status, body = await hook
        stats_when_hook_returned = await model.stats(session)
        model.process.signal(signal.SIGTERM)
        results = await asyncio.gather(*tasks)
    outcomes = [streams.classify(r) for r in results]
    lost = sum(o.lost for o in outcomes)
    report.append(f"with the preStop hold: {lost} of {STREAMS} streams lost")
    assert status == 200 and body["drained"] is True, (status, body)
    assert outcomes == [streams.Outcome.OK] * STREAMS
    assert stats_when_hook_returned["finished"] == STREAMS, stats_when_hook_returned
    assert await replica.process.wait_exit(timeout=10) == 0
    assert await model.process.wait_exit(timeout=10) == -signal.SIGTERM


@pytest.mark.timeout(60)
async def test_signalled_together_without_hold_cuts_streams(
    start_fake_model: Any,
    start_replica: Any,
    session: aiohttp.ClientSession,
    report: list[str],
) -> None:
    """1. eight streams run through the router 2. both containers get SIGTERM at once (no preStop
    hook). Result: the model server dies, every open stream is cut despite the router's drain."""
    model = await start_fake_model(exit_on_sigterm=True)
    replica = await start_replica("replica", model.url, shutdown_drain_secs=1)
    async with aiohttp.ClientSession() as clients:
        tasks = await _open_streams(clients, replica, model)
        replica.sigterm()
        model.process.signal(signal.SIGTERM)
        results = await asyncio.gather(*tasks)
    outcomes = [streams.classify(r) for r in results]
    lost = sum(o.lost for o in outcomes)
    report.append(f"without the hold: {lost} of {STREAMS} streams lost ({sorted({o.value for o in outcomes})})")
    assert all(o.lost for o in outcomes), outcomes
    assert await model.process.wait_exit(timeout=10) == -signal.SIGTERM
    await wait_until(lambda: not replica.process.alive, 10, "the router to exit after its streams were cut")
