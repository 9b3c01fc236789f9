"""The chart's rendered RBAC grants every call recycling and lifecycle rules make: the emulator
allows only the Role's and ClusterRole's rules here. (``CONTROLLER_TEST_RBAC=1`` runs the whole
controller suite this way.)"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from . import fake_routers
from .conftest import MSVC, eventually
from .emulator import Rule
from .rules_scenario import deployment, make_service, ready_pods
from .scenario import delete_order, event_messages, exists

FAST = {"idle_recheck_secs": 0.2, "recycle_retry_secs": 1.0, "max_sleep_secs": 0.5, "lifecycle_buffer_secs": 0.1}


@pytest.fixture
async def routers() -> AsyncIterator[fake_routers.FakeRouters]:
    async with fake_routers.running() as r:
        r.idle_since = time.time()
        yield r


async def test_recycle_then_scale_to_zero_then_delete_self_under_the_charts_rbac(
    cluster: Any, routers: Any, start_operator: Any, chart_rules: list[Rule]
) -> None:
    emu, _ = cluster
    emu.rbac = chart_rules
    await make_service(
        emu,
        admin_port=routers.port,
        recycling={"maxPodLifetimeSeconds": 1},
        lifecycle={
            "rules": [
                {"policy": "ScaleToZero", "condition": {"idleSeconds": 3}},
                {"policy": "DeleteSelf", "condition": {"idleSeconds": 5}},
            ]
        },
    )
    await eventually(lambda: len(ready_pods(emu)) == 1, what="a Ready pod")
    await start_operator(**FAST)
    await eventually(lambda: any(e.code == 201 for e in emu.evictions), what="a pod recycled", timeout=15)
    await eventually(
        lambda: exists(emu, "apps/v1/deployments") and deployment(emu)["spec"]["replicas"] == 0,
        what="scaled to zero",
        timeout=15,
    )
    await eventually(lambda: not exists(emu, MSVC), what="deleted by DeleteSelf and released", timeout=20)
    assert "httproutes/llama" in delete_order(emu)
    refused = [
        m
        for m in event_messages(emu)
        if m[1] in ("PodRecycleForbidden", "PodRecycleFailed") or "forbidden" in m[2].lower()
    ]
    assert not refused, refused


async def test_a_chart_without_pods_eviction_is_forbidden_visibly(
    cluster: Any, routers: Any, start_operator: Any, chart_rules: list[Rule]
) -> None:
    emu, _ = cluster
    emu.rbac = [r for r in chart_rules if r[1] != ("pods/eviction",)]
    assert len(emu.rbac) == len(chart_rules) - 1, "the chart grants pods/eviction in a rule of its own"
    await make_service(emu, admin_port=routers.port, recycling={"maxPodLifetimeSeconds": 1})
    await eventually(lambda: len(ready_pods(emu)) == 1, what="a Ready pod")
    await start_operator(**FAST)
    await eventually(
        lambda: any(r == "PodRecycleForbidden" and "create pods/eviction" in m for _, r, m in event_messages(emu)),
        what="PodRecycleForbidden",
        timeout=15,
    )
    assert emu.evictions == [], "RBAC refuses before the eviction is even considered"


async def test_sleep_and_wake_through_the_activator_under_the_charts_rbac(
    cluster: Any, routers: Any, start_operator: Any, chart_rules: list[Rule]
) -> None:
    """The activator enabled, only the chart's rules granted (the controller's, its activator-namespace
    Role's and the activator's): the port map, the activator's EndpointSlice and NetworkPolicy, the
    scale to 0, the wake and the removal of the slice all pass, and nothing is refused."""
    from .waking_scenario import activator_slice, ask_for_a_wake, asleep, fast, lifecycle, service, stand_in_activator

    emu, server = cluster
    async with stand_in_activator(emu) as act:
        recorder = await service(cluster, routers)
        emu.rbac = chart_rules
        await start_operator(**fast(act))
        await asleep(emu)
        assert activator_slice(emu) is not None and act.ports()
        await ask_for_a_wake(server, emu)
        await eventually(lambda: lifecycle(emu).get("phase") == "Active", what="awake", timeout=15)
        await eventually(lambda: activator_slice(emu) is None, what="the activator's slice deleted")
    refused = [m for m in event_messages(emu) if "forbidden" in m[2].lower()]
    assert not refused, refused
    recorder.check_always_an_endpoint()
