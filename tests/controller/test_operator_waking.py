"""Scale to zero and wake on a request (``--activator-service``) through the real operator, against the
emulator and stand-in routers: the orderings of waking on a request (docs/controller.md) as the API server saw
the writes."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from drain_router.decisions import durations, route_switch

from . import fake_routers
from .conftest import NAMESPACE, eventually
from .rules_scenario import condition, deployment, ready_pods
from .scenario import event_messages, events
from .waking_scenario import (
    AT_ACTIVATOR,
    FAST,
    ROUTES,
    RULES,
    ask_for_a_wake,
    asleep,
    lifecycle,
    route,
    route_reads,
    service,
    wakes,
)


@pytest.fixture
async def routers() -> AsyncIterator[fake_routers.FakeRouters]:
    async with fake_routers.running() as r:
        r.idle_since = time.time()
        yield r


async def test_sleep_points_the_route_at_the_activator_before_the_deployment_goes_to_zero(
    cluster: Any, routers: Any, start_operator: Any
) -> None:
    """1. two idle pods, ScaleToZero after 1 s, the activator enabled. Result: the route's every rule
    points at the activator with the header naming the ModelService, the originals in the
    annotation; that write came before the Deployment's scale to 0; replicasBeforeZero 2, phase
    ScaledToZero, one LifecycleScaledToZero event, the Waking condition False."""
    emu, _ = cluster
    recorder = await service(cluster, routers)
    await start_operator(**FAST)
    await asleep(emu)
    rules = route(emu)["spec"]["rules"]
    assert [r["backendRefs"] for r in rules] == [AT_ACTIVATOR, AT_ACTIVATOR]
    header = {"name": "x-drain-router-service", "value": f"{NAMESPACE}/llama"}
    assert all(
        header in f["requestHeaderModifier"]["set"]
        for r in rules
        for f in r["filters"]
        if f["type"] == "RequestHeaderModifier"
    )
    saved = json.loads(route(emu)["metadata"]["annotations"][route_switch.ANNOTATION])
    assert saved == [
        {"backendRefs": r["backendRefs"], **({"filters": r["filters"]} if "filters" in r else {})} for r in RULES
    ]
    order = [w.plural for w in recorder.writes]
    assert order == [ROUTES, "deployments"], order
    assert recorder.of("deployments")[0].data["spec"]["replicas"] == 0
    record = lifecycle(emu)
    assert record["replicasBeforeZero"] == 2 and record["phase"] == "ScaledToZero" and record["scaledToZeroAt"]
    assert events(emu).count(("Normal", "LifecycleScaledToZero")) == 1
    cond = condition(emu, "Waking")
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", "ScaledToZero")
    recorder.check_never_at_an_empty_service()


async def test_a_wake_scales_back_and_points_the_route_back_once_a_router_serves(
    cluster: Any, routers: Any, start_operator: Any
) -> None:
    """1. asleep as above 2. the activator asks for a wake (status.lifecycle.wakeRequestedAt).
    Result: the Deployment back at 2, phase Waking, a WakeRequested event, the Waking condition True;
    once a new pod is Ready and its router serves, the route's rules exactly as before the sleep,
    the annotation gone, phase Active, awokenAt and coldStartSeconds recorded, an Awoken event. No
    route write ever pointed at the model Service while no pod was Ready."""
    emu, server = cluster
    recorder = await service(cluster, routers)
    op = await start_operator(**FAST)
    await asleep(emu)
    for ip in fake_routers.IPS:  # the woken pods serve requests: the idle rule stays quiet after the wake
        routers.busy(ip)
    emu.ready_after = 1.0  # a woken pod's router answers for a second before the pod is Ready
    asked = await ask_for_a_wake(server, emu)
    await eventually(lambda: deployment(emu)["spec"]["replicas"] == 2, what="scaled back to 2", timeout=10)
    await eventually(lambda: ("Normal", "WakeRequested") in events(emu), what="WakeRequested")
    await eventually(lambda: lifecycle(emu).get("phase") == "Active", what="phase Active", timeout=15)
    await eventually(lambda: route(emu)["spec"]["rules"] == RULES, what="the route's rules restored")
    assert route_switch.ANNOTATION not in (route(emu)["metadata"].get("annotations") or {})
    record = lifecycle(emu)
    awoken = durations.parse_time(record["awokenAt"])
    assert durations.parse_time(record["wakeRequestedAt"]) == pytest.approx(asked, abs=0.001)
    assert record["coldStartSeconds"] == pytest.approx(awoken - asked, abs=0.01) and record["coldStartSeconds"] > 0
    await eventually(lambda: ("Normal", "Awoken") in events(emu), what="Awoken")
    assert events(emu).count(("Normal", "Awoken")) == 1 and events(emu).count(("Normal", "WakeRequested")) == 1
    cond = condition(emu, "Waking")
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", "Awoken")
    assert wakes(op, "awoken") == 1 and wakes(op, "failed") == 0
    # the status said Waking (the condition True) before the route went back
    waking = [m for m in event_messages(emu) if m[1] == "WakeRequested"]
    assert waking and "a request is held" in waking[0][2]
    scale_up = next(
        i for i, w in enumerate(recorder.writes) if w.plural == "deployments" and w.data["spec"]["replicas"] == 2
    )
    back = next(i for i, w in enumerate(recorder.writes) if w.plural == ROUTES and w.data["spec"]["rules"] == RULES)
    assert scale_up < back
    recorder.check_never_at_an_empty_service()


async def test_the_waking_condition_is_true_while_waking(cluster: Any, routers: Any, start_operator: Any) -> None:
    """1. asleep 2. a wake asked 3. the woken pods' routers still starting. Result: phase Waking, the
    Waking condition True, the route still at the activator."""
    emu, server = cluster
    recorder = await service(cluster, routers)
    await start_operator(**FAST)
    await asleep(emu)
    for ip in fake_routers.IPS:
        routers.answer(ip, 200, {"inflight": 0, "state": "starting", "idle_since": None, "served": 0})
    await ask_for_a_wake(server, emu)
    await eventually(lambda: lifecycle(emu).get("phase") == "Waking", what="phase Waking", timeout=10)
    await eventually(lambda: len(ready_pods(emu)) == 2, what="two Ready pods (routers starting)")
    cond = condition(emu, "Waking")
    assert cond is not None and (cond["status"], cond["reason"]) == ("True", "Waking")
    assert all(r["backendRefs"] == AT_ACTIVATOR for r in route(emu)["spec"]["rules"])
    recorder.check_never_at_an_empty_service()


async def test_a_wake_request_runs_a_pass_at_once(cluster: Any, routers: Any, start_operator: Any) -> None:
    """1. asleep 2. the operator restarted with a 60 s requeue and maximum sleep 3. a wake asked.
    Result: the Deployment is scaled back within a few seconds, not after the minute."""
    emu, server = cluster
    await service(cluster, routers)
    op = await start_operator(**FAST)
    await asleep(emu)
    await op.stop()
    reads = len(route_reads(emu))
    await start_operator(**{**FAST, "max_sleep_secs": 60.0, "requeue_secs": 60.0})
    # the daemon's first pass (it reads the route last) is over: it sleeps for the minute
    await eventually(lambda: len(route_reads(emu)) > reads, what="the first pass after the restart")
    await ask_for_a_wake(server, emu)
    await eventually(lambda: deployment(emu)["spec"]["replicas"] == 2, what="scaled back at once", timeout=5)


async def test_a_wake_without_a_ready_router_scales_back_to_zero_after_the_timeout(
    cluster: Any, routers: Any, start_operator: Any
) -> None:
    """1. asleep, activationTimeoutSeconds 2 2. a wake asked 3. the woken pods' routers never serve.
    Result: after 2 s the Deployment back at 0, a Warning WakeFailed, phase ScaledToZero,
    wakeRequestedAt cleared (the next held request asks again); the route never left the activator."""
    emu, server = cluster
    recorder = await service(cluster, routers, timeout=2)
    op = await start_operator(**FAST)
    await asleep(emu)
    for ip in fake_routers.IPS:
        routers.answer(ip, 503, "")
    asked = await ask_for_a_wake(server, emu)
    await eventually(lambda: deployment(emu)["spec"]["replicas"] == 2, what="scaled back to 2", timeout=10)
    await eventually(lambda: ("Warning", "WakeFailed") in events(emu), what="WakeFailed", timeout=15)
    failed_at = time.time()
    assert failed_at >= asked + 2
    assert deployment(emu)["spec"]["replicas"] == 0
    record = lifecycle(emu)
    assert record["phase"] == "ScaledToZero" and "wakeRequestedAt" not in record
    assert [w.data["spec"]["replicas"] for w in recorder.of("deployments")] == [0, 2, 0]
    assert len(recorder.of(ROUTES)) == 1, "only the sleep's switch: the route stayed at the activator"
    assert all(r["backendRefs"] == AT_ACTIVATOR for r in route(emu)["spec"]["rules"])
    cond = condition(emu, "Waking")
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", "WakeFailed")
    assert wakes(op, "failed") == 1
    recorder.check_never_at_an_empty_service()


async def test_without_the_flag_the_route_is_never_written(cluster: Any, routers: Any, start_operator: Any) -> None:
    emu, _ = cluster
    recorder = await service(cluster, routers)
    await start_operator(**{k: v for k, v in FAST.items() if k != "activator_service"})
    await eventually(lambda: deployment(emu)["spec"]["replicas"] == 0, what="scaled to zero", timeout=15)
    requests = len(emu._requests)
    await eventually(lambda: len(emu._requests) > requests + 10, what="more passes")
    assert not recorder.of(ROUTES) and route(emu)["spec"]["rules"] == RULES
    assert "phase" not in lifecycle(emu) and condition(emu, "Waking") is None
