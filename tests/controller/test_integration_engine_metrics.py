"""The engine's metrics relayed by real routers (``/engine/metrics`` on the admin port) while the
controller recycles: scrapes are not counted, so a pod scraped continuously is still idle to the
controller's probe and still recycled. The machinery is :mod:`test_integration_routers`'s."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from .conftest import eventually
from .rules_scenario import make_service
from .scenario import event_messages
from .test_integration_routers import FAST, _one_ready_pod, kubelet, model

pytestmark = pytest.mark.slow

__all__ = ["kubelet", "model"]  # the fixtures, imported so that pytest finds them here


async def test_a_pod_whose_engine_metrics_are_scraped_continuously_is_still_recycled(
    cluster: Any, kubelet: Any, start_operator: Any
) -> None:
    """1. pod A's engine metrics scraped every 100 ms on its router's admin port (/engine/metrics),
    from before it expires until it is evicted 2. A expires. Result: A is evicted once (the scrapes
    never made it busy: they are not counted), its router exits 0, and the scrapes were answered
    with the model server's metrics all along."""
    emu, _ = cluster
    await make_service(emu, exits_after=None, admin_port=kubelet.admin_port, recycling={"maxPodLifetimeSeconds": 2})
    _pod, a = await _one_ready_pod(emu, kubelet)
    answered: list[int] = []

    async def scrape() -> None:
        async with aiohttp.ClientSession() as session:
            while not emu.evictions:
                async with session.get(f"http://{a.ip}:{kubelet.admin_port}/engine/metrics") as resp:
                    body = await resp.read()
                    answered.append(resp.status if b"vllm:num_requests_running" in body else -resp.status)
                await asyncio.sleep(0.1)

    scraping = asyncio.ensure_future(scrape())
    try:
        await eventually(lambda: len(answered) >= 5, what="the scrapes answered", timeout=10)
        before = len(answered)
        await start_operator(**FAST)
        await eventually(lambda: [e.uid for e in emu.evictions] == [a.uid], what="A evicted", timeout=20)
        await asyncio.wait_for(scraping, 5)
    finally:
        scraping.cancel()
    assert set(answered) == {200}, answered
    # Scraped while the controller ran (its start and its probes, however slow a busy machine makes them).
    assert len(answered) > before, (before, answered)
    await eventually(lambda: a.exit_code is not None, what="A's router drained and exited", timeout=20)
    assert a.exit_code == 0 and [e.code for e in emu.evictions] == [201]
    assert "PodRecycleHeld" not in [m[1] for m in event_messages(emu)], "never held busy"
