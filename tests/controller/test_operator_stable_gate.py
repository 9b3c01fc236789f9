"""Recycling's stable-Deployment gate through the real operator, against the emulator's
Deployment controller: rollouts through ReplicaSets and a status that lags what it describes.

Each test builds a state in which exactly one of the gate's inputs says "not stable" while every
other one looks stable, with the pods already past their lifetime: the operator must hold
(``WorkloadUnstable``) and evict nothing, then evict once that input catches up. A gate that reads
``metadata.generation`` for ``status.observedGeneration``, ``status.replicas`` for
``status.updatedReplicas``, or a pod's phase for its Ready condition evicts in one of them."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest

from . import fake_routers
from .conftest import NAMESPACE, eventually
from .rules_scenario import held, make_service, patch_deployment, pods, ready_pods

FAST = {"idle_recheck_secs": 0.2, "recycle_retry_secs": 1.5, "max_sleep_secs": 0.5, "idle_probe_timeout_secs": 0.5}
LAG = 1e9
"""A ``status_delay`` the test outlasts: the Deployment controller has not caught up."""


@pytest.fixture
async def routers() -> AsyncIterator[fake_routers.FakeRouters]:
    async with fake_routers.running() as r:
        yield r


def _deployment(emu: Any) -> dict[str, Any]:
    obj = emu.get("apps/v1/deployments", NAMESPACE, "llama")
    assert obj is not None
    return obj


def _stable(emu: Any, replicas: int) -> bool:
    obj = _deployment(emu)
    status = obj.get("status") or {}
    counts = [status.get(k) for k in ("replicas", "updatedReplicas", "readyReplicas", "availableReplicas")]
    return status.get("observedGeneration") == obj["metadata"]["generation"] and counts == [replicas] * 4


async def _expired_and_stable(emu: Any, routers: Any, replicas: int = 2) -> list[dict[str, Any]]:
    """A ModelService over ``replicas`` Ready pods, its Deployment's status stable, every pod past
    its one-second lifetime."""
    await make_service(emu, admin_port=routers.port, replicas=replicas, recycling={"maxPodLifetimeSeconds": 1})
    await eventually(lambda: _stable(emu, replicas) and len(ready_pods(emu)) == replicas, what="stable", timeout=15)
    ready = ready_pods(emu)
    await eventually(lambda: time.time() > max(_start(p) for p in ready) + 1.0, what="every pod past its lifetime")
    return ready


def _start(pod: dict[str, Any]) -> float:
    from drain_router.decisions import durations

    return durations.parse_time(pod["status"]["startTime"])


async def _held_unstable_and_nothing_evicted(emu: Any) -> None:
    """The operator holds the overdue pod as WorkloadUnstable, and three more of its reads of the
    Deployment later it still has evicted nothing."""
    await eventually(
        lambda: (held(emu) or {}).get("reason") == "WorkloadUnstable" or emu.evictions,
        what="the pod held WorkloadUnstable",
        timeout=15,
    )
    reads = _deployment_reads(emu)
    await eventually(lambda: _deployment_reads(emu) >= reads + 3, what="three more passes", timeout=15)
    assert not emu.evictions, f"evicted while the Deployment was not stable: {emu.evictions}"
    assert (held(emu) or {}).get("reason") == "WorkloadUnstable"


def _deployment_reads(emu: Any) -> int:
    return sum(
        1
        for r in emu._requests
        if r.action == kmock.action.FETCH and r.resource is not None and r.resource.plural == "deployments"
    )


async def test_a_spec_change_not_yet_observed_holds(cluster: Any, routers: Any, start_operator: Any) -> None:
    """1. stable, every pod overdue 2. the Deployment controller lags (its status frozen) 3. a spec
    change that touches no pod (``paused``): ``generation`` 2, ``observedGeneration`` still 1, every
    count and every pod as stable as before. Result: held, nothing evicted; once the controller
    catches up (observedGeneration 2), the eviction."""
    emu, server = cluster
    await _expired_and_stable(emu, routers)
    emu.status_delay = LAG
    await patch_deployment(server, {"spec": {"paused": True}})
    assert _deployment(emu)["metadata"]["generation"] == 2 and _deployment(emu)["status"]["observedGeneration"] == 1
    await start_operator(**FAST)
    await _held_unstable_and_nothing_evicted(emu)
    emu.status_delay = 0.0
    await eventually(lambda: any(e.code == 201 for e in emu.evictions), what="the eviction", timeout=15)


async def test_a_paused_rollout_holds(cluster: Any, routers: Any, start_operator: Any) -> None:
    """1. stable, every pod overdue 2. ``kubectl rollout pause`` then a new template: observed
    (``observedGeneration`` = ``generation``), ``replicas``, ``readyReplicas``,
    ``availableReplicas`` all 2, every pod Ready, but ``updatedReplicas`` 0 (no pod of the new
    template). Result: held, nothing evicted; resumed, the rollout replaces both pods and then the
    (new, again overdue) pods are evicted, each with the rollout complete."""
    emu, server = cluster
    await _expired_and_stable(emu, routers)
    await patch_deployment(server, {"spec": {"paused": True}})
    await patch_deployment(server, {"spec": {"template": {"metadata": {"annotations": {"version": "2"}}}}})

    def paused_and_observed() -> bool:
        obj = _deployment(emu)
        status = obj.get("status") or {}
        return status.get("observedGeneration") == obj["metadata"]["generation"] and "updatedReplicas" not in status

    await eventually(paused_and_observed, what="the paused rollout observed", timeout=10)
    assert [_deployment(emu)["status"].get(k) for k in ("replicas", "readyReplicas", "availableReplicas")] == [2, 2, 2]
    await start_operator(**FAST)
    await _held_unstable_and_nothing_evicted(emu)
    await patch_deployment(server, {"spec": {"paused": False}})
    await eventually(
        lambda: any(e.code == 201 for e in emu.evictions), what="an eviction after the rollout", timeout=30
    )
    for eviction in emu.evictions:
        assert eviction.rolling_out == () and eviction.unsettled == (), eviction
    assert all(p["metadata"]["annotations"]["version"] == "2" for p in pods(emu, alive_only=False))


async def test_a_running_pod_that_is_not_ready_holds(cluster: Any, routers: Any, start_operator: Any) -> None:
    """1. stable, every pod overdue 2. the Deployment controller lags (status frozen: 2 Ready)
    3. one pod's readiness probe fails: Running, Ready False. Result: held, nothing evicted; Ready
    again, the eviction."""
    emu, _ = cluster
    first, _second = await _expired_and_stable(emu, routers)
    emu.status_delay = LAG
    unready = first["metadata"]["name"]
    emu.pod_may_be_ready = lambda pod: pod["metadata"]["name"] != unready
    await emu.set_pod_ready(unready, False)
    pod = emu.get("v1/pods", NAMESPACE, unready)
    assert pod is not None and pod["status"]["phase"] == "Running"
    assert _deployment(emu)["status"]["readyReplicas"] == 2, "the status has not seen it"
    await start_operator(**FAST)
    await _held_unstable_and_nothing_evicted(emu)
    emu.pod_may_be_ready = None
    await eventually(lambda: any(e.code == 201 for e in emu.evictions), what="the eviction", timeout=15)


async def test_no_eviction_while_a_rollout_is_under_way(cluster: Any, routers: Any, start_operator: Any) -> None:
    """1. stable, every pod overdue 2. a new template, its pods slow to turn Ready 3. the operator
    starts mid-rollout. Result: no eviction before the rollout is complete (as the emulated controller
    knows it, not as its late status says) nor while a pod is unsettled; the new pods, overdue in
    turn, are evicted after it."""
    emu, server = cluster
    await _expired_and_stable(emu, routers)
    emu.ready_after = 0.8
    await patch_deployment(server, {"spec": {"template": {"metadata": {"annotations": {"version": "2"}}}}})
    await start_operator(**FAST)
    await eventually(lambda: any(e.code == 201 for e in emu.evictions), what="an eviction", timeout=30)
    for eviction in emu.evictions:
        assert eviction.rolling_out == () and eviction.unsettled == (), eviction
