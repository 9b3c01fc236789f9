"""Lifecycle rules end to end through the real operator, against the emulator and stand-in routers."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from drain_router.decisions import durations

from . import fake_routers
from .conftest import MSVC, NAMESPACE, eventually
from .rules_scenario import condition, deployment, make_service, patch_deployment, patches_to, ready_pods, status
from .scenario import delete_order, event_messages, events, exists

FAST = {"idle_recheck_secs": 0.2, "recycle_retry_secs": 1.0, "max_sleep_secs": 0.5, "lifecycle_buffer_secs": 0.1}


@pytest.fixture
async def routers() -> AsyncIterator[fake_routers.FakeRouters]:
    async with fake_routers.running() as r:
        r.idle_since = time.time()
        yield r


def _rules(*pairs: tuple[str, int]) -> dict[str, Any]:
    return {"rules": [{"policy": p, "condition": {"idleSeconds": s}} for p, s in pairs]}


async def test_scale_to_zero_keeps_the_route_and_records_it(cluster: Any, routers: Any, start_operator: Any) -> None:
    """1. one idle pod (served, idle since now) 2. ScaleToZero after 1 s. Result: spec.replicas 0,
    status.lifecycle.scaledToZeroAt set, the route and the ModelService kept, one
    LifecycleScaledToZero event, the action counted once."""
    emu, _ = cluster
    await make_service(emu, admin_port=routers.port, lifecycle=_rules(("ScaleToZero", 1)))
    await eventually(lambda: len(ready_pods(emu)) == 1, what="a Ready pod")
    op = await start_operator(**FAST)
    await eventually(lambda: deployment(emu)["spec"]["replicas"] == 0, what="scaled to zero", timeout=15)
    lifecycle = status(emu)["lifecycle"]
    assert lifecycle["scaledToZeroAt"] and lifecycle["idleSince"]
    assert durations.parse_time(lifecycle["scaledToZeroAt"]) >= durations.parse_time(lifecycle["idleSince"]) + 1
    assert (condition(emu, "LifecycleRulesValid") or {}).get("status") == "True"
    await eventually(lambda: status(emu)["lifecycle"] and not ready_pods(emu), what="pods gone", timeout=10)
    passes = len(emu._requests)
    await eventually(lambda: len(emu._requests) > passes + 10, what="more passes")
    assert exists(emu, "gateway.networking.k8s.io/v1/httproutes") and exists(emu, MSVC)
    assert events(emu).count(("Normal", "LifecycleScaledToZero")) == 1
    assert len(patches_to(emu, "deployments")) == 1, "scaled once, not on every pass"
    assert (
        op.ctx.metrics.registry.get_sample_value(
            "drain_router_controller_lifecycle_actions_total", {"policy": "ScaleToZero"}
        )
        == 1
    )


async def test_busy_router_keeps_the_clock_null(cluster: Any, routers: Any, start_operator: Any) -> None:
    emu, _ = cluster
    await make_service(emu, admin_port=routers.port, lifecycle=_rules(("ScaleToZero", 1)))
    (pod,) = await eventually(lambda: ready_pods(emu), what="a Ready pod")
    routers.busy(pod["status"]["podIP"])
    await start_operator(**FAST)
    await eventually(lambda: "lifecycle" in status(emu), what="the lifecycle status", timeout=10)
    asked = len(routers.asked)
    await eventually(lambda: len(routers.asked) > asked + 5, what="more probes", timeout=10)
    assert status(emu)["lifecycle"].get("idleSince") is None  # null in a merge patch removes the key
    assert deployment(emu)["spec"]["replicas"] == 1


async def test_only_the_most_impactful_overdue_rule_runs(cluster: Any, routers: Any, start_operator: Any) -> None:
    """The operator was down past every threshold (the stored idle clock is an hour old). Result:
    only DeleteSelf runs: the Deployment is never scaled, the ModelService is deleted and its
    finalizer's staged teardown removes the route before the workload."""
    emu, _ = cluster
    routers.idle_since = time.time() - 3600
    await make_service(
        emu,
        admin_port=routers.port,
        lifecycle=_rules(("ScaleToZero", 1), ("DeleteWorkload", 2), ("DeleteSelf", 3)),
        status={"lifecycle": {"idleSince": durations.format_time(time.time() - 3600)}},
    )
    await eventually(lambda: len(ready_pods(emu)) == 1, what="a Ready pod")
    await start_operator(**FAST)
    await eventually(lambda: not exists(emu, MSVC), what="the ModelService deleted and released", timeout=20)
    assert not patches_to(emu, "deployments"), "ScaleToZero must not run before DeleteSelf"
    reasons = [r for _, r in events(emu)]
    assert "LifecycleDeleteSelf" in reasons and "LifecycleScaledToZero" not in reasons
    assert "LifecycleDeleteWorkload" not in reasons
    order = delete_order(emu)
    assert order.index("httproutes/llama") < order.index("deployments/llama"), order


async def test_delete_workload_runs_the_staged_teardown_and_keeps_the_service(
    cluster: Any, routers: Any, start_operator: Any
) -> None:
    emu, _ = cluster
    await make_service(emu, admin_port=routers.port, lifecycle=_rules(("DeleteWorkload", 1)))
    await eventually(lambda: len(ready_pods(emu)) == 1, what="a Ready pod")
    await start_operator(**FAST)
    await eventually(
        lambda: (status(emu).get("deletion") or {}).get("stage") == "Released", what="the teardown released", timeout=20
    )
    assert exists(emu, MSVC), "DeleteWorkload keeps the ModelService"
    obj = emu.get(MSVC, NAMESPACE, "llama")
    assert obj is not None and "drainrouter.dev/staged-deletion" in obj["metadata"].get("finalizers", [])
    order = delete_order(emu)
    assert order.index("httproutes/llama") < order.index("deployments/llama"), order
    assert [r for _, r in events(emu)].count("LifecycleDeleteWorkload") == 1


async def test_scaling_back_up_wakes_the_service(cluster: Any, routers: Any, start_operator: Any) -> None:
    """1. scaled to zero by the rule 2. a person sets replicas 1. Result: scaledToZeroAt cleared, the
    idle clock restarted at the wake, and the controller does not scale it down again at once."""
    emu, server = cluster
    await make_service(emu, admin_port=routers.port, lifecycle=_rules(("ScaleToZero", 2)))
    await eventually(lambda: len(ready_pods(emu)) == 1, what="a Ready pod")
    await start_operator(**FAST)
    await eventually(lambda: deployment(emu)["spec"]["replicas"] == 0, what="scaled to zero", timeout=15)
    woke_at = time.time()
    await patch_deployment(server, {"spec": {"replicas": 1}})
    await eventually(
        lambda: (status(emu).get("lifecycle") or {}).get("scaledToZeroAt") is None,
        what="scaledToZeroAt cleared",
        timeout=10,
    )
    idle_since = durations.parse_time(status(emu)["lifecycle"]["idleSince"])
    assert idle_since >= woke_at - 0.01
    assert deployment(emu)["spec"]["replicas"] == 1
    assert len(patches_to(emu, "deployments")) == 2  # the rule's one, the person's one


async def test_invalid_rules_act_on_nothing_and_warn_once_per_generation(
    cluster: Any, routers: Any, start_operator: Any
) -> None:
    """Rules the CRD's CEL refuses today, stored before it did: the controller's own validation
    still keeps them from acting."""
    emu, _ = cluster
    await make_service(
        emu, admin_port=routers.port, lifecycle=_rules(("ScaleToZero", 5), ("DeleteSelf", 5)), admit=False
    )
    await start_operator(**FAST)
    await eventually(
        lambda: (condition(emu, "LifecycleRulesValid") or {}).get("reason") == "InvalidRules",
        what="LifecycleRulesValid False",
        timeout=10,
    )
    cond = condition(emu, "LifecycleRulesValid")
    assert cond is not None and cond["status"] == "False" and "strictly after ScaleToZero" in cond["message"]
    requests = len(emu._requests)
    await eventually(lambda: len(emu._requests) > requests + 10, what="more passes")
    warnings = [m for m in event_messages(emu) if m[1] == "InvalidLifecycleRules"]
    assert len(warnings) == 1 and warnings[0][0] == "Warning"
    assert not patches_to(emu, "deployments") and exists(emu, MSVC)


async def test_the_idle_clock_never_moves_back(cluster: Any, routers: Any, start_operator: Any) -> None:
    """While the service stays idle, ``status.lifecycle.idleSince`` never decreases.
    1. two pods: the one that served last went idle just now, the other an hour ago 2. the recent
    one is evicted (its replacement has served nothing) 3. the older one's probe fails 4. the
    controller restarts. Result: idleSince stays at the recent time throughout, and the 30 s
    ScaleToZero rule does not fire (an hour-old clock would fire it at once)."""
    emu, server = cluster
    await make_service(emu, admin_port=routers.port, replicas=2, lifecycle=_rules(("ScaleToZero", 30)))
    first, second = await eventually(lambda: len(ready_pods(emu)) == 2 and ready_pods(emu), what="two Ready pods")
    recent = float(int(time.time()))  # whole seconds: exact through the RFC 3339 round trip
    old = recent - 3600
    taken = {first["status"]["podIP"], second["status"]["podIP"]}
    for ip in fake_routers.IPS:  # replacements: fresh routers that have served nothing
        if ip not in taken:
            routers.answer(ip, 200, _inflight(idle_since=time.time(), served=0))
    routers.answer(first["status"]["podIP"], 200, _inflight(idle_since=recent, served=7))
    routers.answer(second["status"]["podIP"], 200, _inflight(idle_since=old, served=3))
    op = await start_operator(**FAST)

    def clock() -> float | None:
        since = (status(emu).get("lifecycle") or {}).get("idleSince")
        return None if since is None else durations.parse_time(since)

    await eventually(lambda: clock() == recent, what="the clock at the latest report", timeout=10)

    async def passes(n: int = 4) -> None:
        asked = len(routers.asked)
        await eventually(
            lambda: len(routers.asked) >= asked + n or deployment(emu)["spec"]["replicas"] != 2,
            what=f"{n} more probes",
            timeout=10,
        )
        assert deployment(emu)["spec"]["replicas"] == 2, f"scaled to zero on a clock moved back to {clock()}"
        assert clock() == recent

    # 2. the router that served last is recycled
    response = await server.client.post(
        f"/api/v1/namespaces/{NAMESPACE}/pods/{first['metadata']['name']}/eviction",
        json={"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": first["metadata"]["name"]}},
    )
    assert response.status == 201
    replacement = await eventually(
        lambda: [p for p in ready_pods(emu) if p["status"]["podIP"] not in taken], what="a Ready replacement"
    )
    probed = replacement[0]["status"]["podIP"]
    await eventually(lambda: probed in routers.asked, what="the replacement probed", timeout=10)
    await passes()
    # 3. a probe failure keeps the clock
    routers.answer(second["status"]["podIP"], 500, "")
    await passes()
    routers.answer(second["status"]["podIP"], 200, _inflight(idle_since=old, served=3))
    # 4. a controller restart resumes from status
    await op.stop()
    await start_operator(**FAST)
    await passes()
    assert ("Normal", "LifecycleScaledToZero") not in events(emu)


def _inflight(*, idle_since: float, served: int) -> dict[str, Any]:
    return {"inflight": 0, "state": "serving", "idle_since": idle_since, "started_at": 0.0, "served": served}


async def test_a_pending_pod_keeps_the_service_from_scaling_to_zero(
    cluster: Any, routers: Any, start_operator: Any
) -> None:
    """1. one idle pod, ScaleToZero long overdue 2. a person scales to two: the new pod stays Pending
    (no podIP, its router cannot be asked) 3. the operator runs. Result: the idle clock is unknown,
    nothing is scaled over several passes; once the pod runs and its router answers idle, the
    service is scaled to zero. A controller that left podIP-less pods out of the probe would scale to
    zero while a replica was starting."""
    emu, server = cluster
    routers.idle_since = time.time() - 3600
    await make_service(emu, admin_port=routers.port, lifecycle=_rules(("ScaleToZero", 1)))
    await eventually(lambda: len(ready_pods(emu)) == 1, what="a Ready pod")
    emu.pending_for = 1e9
    await patch_deployment(server, {"spec": {"replicas": 2}})

    def pending() -> list[dict[str, Any]]:
        return [
            o.raw
            for k, o in emu.objects.items()
            if k[0].plural == "pods" and not o.deleted and o.raw["status"].get("phase") == "Pending"
        ]

    await eventually(pending, what="a Pending pod")
    scaled_by_the_test = len(patches_to(emu, "deployments"))
    await start_operator(**FAST)
    await eventually(lambda: len(routers.asked) >= 3, what="three passes probing the running pod", timeout=15)
    assert len(patches_to(emu, "deployments")) == scaled_by_the_test and deployment(emu)["spec"]["replicas"] == 2
    emu.pending_for = 0.0
    await eventually(lambda: deployment(emu)["spec"]["replicas"] == 0, what="scaled to zero", timeout=15)
