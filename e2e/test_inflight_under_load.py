"""The controller-facing endpoints under load: /admin/inflight counts exactly the open streams."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from drain_router_dev import load, streams
from drain_router_dev.process import wait_until

STREAMS = 40
LEAVING = 15


@pytest.mark.timeout(60)
async def test_admin_inflight_matches_open_streams(
    start_fake_model: Any,
    start_replica: Any,
    session: aiohttp.ClientSession,
) -> None:
    """1. forty streams open through a replica 2. fifteen clients leave mid-stream 3. the rest end.
    Result: /admin/inflight (and /readyz's inflight) say 40, then 25, then 0 with idle_since set;
    the model server saw the fifteen cancelled; probes never count themselves."""
    model = await start_fake_model()
    replica = await start_replica("replica", model.url, shutdown_drain_secs=1)

    async def inflight_is(n: int) -> bool:
        return (await replica.inflight(session))["inflight"] == n

    before = await replica.inflight(session)
    assert before["inflight"] == 0 and before["state"] == "serving", before

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as clients:
        staying = [
            asyncio.create_task(load.stream_completion(clients, replica.url, chunks=60, interval_ms=50))
            for _ in range(STREAMS - LEAVING)
        ]
        leaving = [
            await clients.post(
                replica.url + "/v1/completions", json={"stream": True, "chunks": 1000, "interval_ms": 50}
            )
            for _ in range(LEAVING)
        ]
        await wait_until(lambda: inflight_is(STREAMS), timeout=10, what=f"/admin/inflight == {STREAMS}")
        body = await replica.inflight(session)
        assert body["inflight"] == STREAMS and body["idle_since"] is None and body["state"] == "serving", body
        assert (await replica.readyz(session))[1]["inflight"] == STREAMS
        assert (await model.stats(session))["active"] == STREAMS

        for resp in leaving:
            await resp.content.readuntil(b"\n\n")
            resp.close()
        await wait_until(
            lambda: inflight_is(STREAMS - LEAVING),
            timeout=5,
            what=f"/admin/inflight == {STREAMS - LEAVING} after {LEAVING} clients left",
        )

        async def model_cancelled() -> bool:
            return (await model.stats(session))["cancelled"] == LEAVING

        await wait_until(model_cancelled, timeout=5, what="the model server to see the disconnects")
        results = await asyncio.gather(*staying)

    assert [streams.classify(r) for r in results] == [streams.Outcome.OK] * (STREAMS - LEAVING)
    await wait_until(lambda: inflight_is(0), timeout=5, what="/admin/inflight == 0")
    after = await replica.inflight(session)
    assert after["idle_since"] is not None and after["state"] == "serving", after
