"""Rules of pod recycling and lifecycle actions that the code kept with no operator-level test to
catch a break (the mutation audit: each of these had a surviving mutant).

Each test runs the real operator against the emulator and stand-in routers and fails with its
mutant applied (``tests/mutants.yaml``): ``maxPodLifetimeIdleTimeoutSeconds: 0`` skips the probe; a
forbidden eviction is not retried before the retry wait; a route already being deleted is not
deleted again; the lifecycle status is written before the scale-down it records.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest

from drain_router.controller import crd
from drain_router.decisions import durations, recycling

from . import fake_routers
from .conftest import NAMESPACE, eventually
from .rules_scenario import deployment, held, make_service, patches_to, ready_pods
from .scenario import OWNED, delete_msvc, event_messages, msvc, passes

_ROUTE = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute"}
FAST = {"idle_recheck_secs": 0.2, "max_sleep_secs": 0.3, "idle_probe_timeout_secs": 0.5, "lifecycle_buffer_secs": 0.1}


@pytest.fixture
async def routers() -> AsyncIterator[fake_routers.FakeRouters]:
    async with fake_routers.running() as r:
        yield r


def _eviction_posts(emu: Any) -> list[str]:
    """Every eviction the API server was asked for (allowed or not), by pod name, in order."""
    return [
        r.name
        for r in emu._requests
        if r.resource == kmock.resource("v1/pods") and r.subresource == "eviction" and r.method == "POST"
    ]


async def test_idle_timeout_zero_evicts_without_probing(cluster: Any, routers: Any, start_operator: Any) -> None:
    """1. ``maxPodLifetimeIdleTimeoutSeconds: 0`` 2. the only pod expires while its router is busy.
    Result: evicted, and its router was never asked (0 skips the probe; it is not "omitted", which
    would wait for idle forever and hold this busy pod)."""
    emu, _ = cluster
    await make_service(
        emu, admin_port=routers.port, recycling={"maxPodLifetimeSeconds": 1, "maxPodLifetimeIdleTimeoutSeconds": 0}
    )
    (pod,) = await eventually(lambda: ready_pods(emu), what="a Ready pod", timeout=15)
    routers.busy(pod["status"]["podIP"])
    await start_operator(**FAST)
    name = pod["metadata"]["name"]
    await eventually(
        lambda: [e.pod for e in emu.evictions if e.code == 201][:1] == [name], what="the eviction", timeout=15
    )
    assert routers.asked == [], "the idle probe ran with maxPodLifetimeIdleTimeoutSeconds: 0"
    assert held(emu) is None


async def test_forbidden_eviction_is_retried_no_sooner_than_the_retry_wait(
    cluster: Any, routers: Any, start_operator: Any
) -> None:
    """1. create pods/eviction is forbidden 2. the only pod expires, idle. Result: one refused
    eviction, held Forbidden with ``retryAt`` one retry wait (the default 30 s) after it, and no
    second attempt over the next passes of the daemon (every 0.3 s), though they keep running."""
    emu, _ = cluster
    emu.forbid("create", "pods/eviction")
    await make_service(emu, admin_port=routers.port, recycling={"maxPodLifetimeSeconds": 1})
    await eventually(lambda: len(ready_pods(emu)) == 1, what="a Ready pod", timeout=15)
    await start_operator(**FAST)
    await eventually(lambda: _eviction_posts(emu), what="the first eviction", timeout=15)
    refused_by = time.time()
    await eventually(lambda: (held(emu) or {}).get("reason") == "Forbidden", what="held Forbidden", timeout=10)
    record = held(emu)
    assert record is not None and record["retryAt"], record
    # The event follows the status write, and kopf posts it in the background: wait for it.
    (warning,) = await eventually(
        lambda: [m for m in event_messages(emu) if m[1] == "PodRecycleForbidden"], what="the warning", timeout=10
    )
    assert warning[0] == "Warning"
    seen = passes(emu)
    await eventually(lambda: passes(emu) >= seen + 6, what="six more passes of the daemon", timeout=15)
    assert len(_eviction_posts(emu)) == 1, "retried before the retry wait"
    # The retry recorded is one retry wait after the refusal (which came just before refused_by).
    retry_in = durations.parse_time(record["retryAt"]) - refused_by
    assert recycling.RECYCLE_RETRY_SECS - 5 < retry_in <= recycling.RECYCLE_RETRY_SECS + 1, retry_in


async def test_a_route_already_being_deleted_is_not_deleted_again(
    cluster: Any, routers: Any, start_operator: Any
) -> None:
    """1. The route holds a finalizer of its own 2. the ModelService is deleted with maxWait 3s.
    Result: the route is deleted once (it then has a deletionTimestamp); the passes that wait for it
    (every 0.2 s) never delete it again, and at the deadline RouteStuck lets the teardown go on."""
    emu, server = cluster
    await make_service(emu, admin_port=routers.port)
    await emu.put(
        "gateway.networking.k8s.io/v1/httproutes",
        {"metadata": {"name": "held", "namespace": NAMESPACE, "finalizers": ["example.com/keep"], "labels": OWNED}},
    )
    response = await server.client.patch(
        f"/apis/{crd.group()}/{crd.version()}/namespaces/{NAMESPACE}/{crd.plural()}/llama",
        json={"spec": {"route": {**_ROUTE, "name": "held"}, "deletion": {"routeSettle": "0s", "maxWait": "3s"}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status == 200, await response.text()
    await start_operator(**FAST)
    await delete_msvc(emu, server)
    await eventually(lambda: msvc(emu) is None, what="the release after RouteStuck", timeout=20)
    route_deletes = [
        r for r in emu._requests if r.action == kmock.action.DELETE and r.resource is not None and r.name == "held"
    ]
    assert len(route_deletes) == 1, f"the route was deleted {len(route_deletes)} times"
    assert emu.get("gateway.networking.k8s.io/v1/httproutes", NAMESPACE, "held") is not None


async def test_lifecycle_status_is_written_before_the_scale_down(
    cluster: Any, routers: Any, start_operator: Any
) -> None:
    """1. one idle pod 2. ScaleToZero after 1 s. Result: in the API server's request log, the
    Deployment's scale-down comes after a status write recording ``scaledToZeroAt``."""
    emu, _ = cluster
    await make_service(
        emu,
        admin_port=routers.port,
        lifecycle={"rules": [{"policy": "ScaleToZero", "condition": {"idleSeconds": 1}}]},
    )
    await eventually(lambda: len(ready_pods(emu)) == 1, what="a Ready pod", timeout=15)
    await start_operator(**FAST)
    await eventually(lambda: deployment(emu)["spec"]["replicas"] == 0, what="scaled to zero", timeout=15)
    (scale,) = patches_to(emu, "deployments")
    before = emu._requests[: emu._requests.index(scale)]
    recorded = [
        r
        for r in before
        if r.resource is not None
        and r.resource.plural == crd.plural()
        and r.subresource == "status"
        and ((r.data or {}).get("status", {}).get("lifecycle") or {}).get("scaledToZeroAt")
    ]
    assert recorded, "the Deployment was scaled before scaledToZeroAt was written"
