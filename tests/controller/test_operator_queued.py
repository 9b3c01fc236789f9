"""A router with requests queued is not idle, end to end through the real operator:
emulated API server, stand-in routers whose ``/admin/inflight`` reports nothing in flight and
requests waiting in the admission queue."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from . import fake_routers
from .conftest import eventually
from .rules_scenario import held, make_service, ready_pods

FAST = {"idle_recheck_secs": 0.2, "recycle_retry_secs": 1.5, "max_sleep_secs": 0.5, "idle_probe_timeout_secs": 0.5}


@pytest.fixture
async def routers() -> AsyncIterator[fake_routers.FakeRouters]:
    async with fake_routers.running() as r:
        yield r


async def test_a_pod_with_requests_queued_is_held_then_recycled_once_its_queue_empties(
    cluster: Any, routers: Any, start_operator: Any
) -> None:
    """1. the only pod expires while its router has 0 in flight and 3 queued 2. several probes
    3. the queue empties. Result: held Busy and never evicted while queued; then evicted."""
    emu, _ = cluster
    await make_service(emu, admin_port=routers.port, recycling={"maxPodLifetimeSeconds": 1})
    (pod,) = await eventually(lambda: (p := ready_pods(emu)) and len(p) == 1 and p, what="a Ready pod", timeout=15)
    ip = pod["status"]["podIP"]
    routers.queued(ip, 3)
    await start_operator(**FAST)
    await eventually(lambda: (held(emu) or {}).get("reason") == "Busy", what="held Busy", timeout=15)
    asked = len(routers.asked)
    await eventually(lambda: len(routers.asked) >= asked + 3, what="three more probes", timeout=10)
    assert not emu.evictions, "evicted a pod with requests queued"
    routers.idle(ip)
    await eventually(
        lambda: [e.pod for e in emu.evictions] == [pod["metadata"]["name"]], what="the eviction", timeout=10
    )
