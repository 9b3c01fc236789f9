"""Scale to zero and wake on a request (``--activator-service``) through the real operator, against the
emulator and stand-in routers: the orderings of SPEC 6 "Waking on a request" as the API server saw
the writes."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest

from drain_router.decisions import activator, durations, route_switch

from . import fake_routers
from .conftest import MSVC, NAMESPACE, eventually
from .rules_scenario import condition, deployment, make_service, ready_pods, status
from .scenario import event_messages, events

ACTIVATOR = route_switch.ActivatorService(namespace="gw", name="activator", port=8012)
AT_ACTIVATOR = [{"group": "", "kind": "Service", "name": "activator", "namespace": "gw", "port": 8012}]
RULES = [
    {
        "matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
        "backendRefs": [{"name": "llama", "port": 8080}],
        "filters": [
            {"type": "RequestHeaderModifier", "requestHeaderModifier": {"add": [{"name": "x-a", "value": "1"}]}}
        ],
    },
    {"backendRefs": [{"name": "llama", "port": 8080, "weight": 1}]},
]
FAST = {"idle_recheck_secs": 0.2, "max_sleep_secs": 0.5, "lifecycle_buffer_secs": 0.1, "activator_service": ACTIVATOR}
ROUTES = "httproutes"


@dataclasses.dataclass
class Write:
    """One write of the route or the Deployment as the emulator received it, with the cluster then."""

    plural: str
    data: Any
    ready_pods: int
    route_rules: list[Any]


class Recorder:
    def __init__(self, emu: Any) -> None:
        self.emu = emu
        self.writes: list[Write] = []
        emu.on_request = self.seen

    def seen(self, request: Any) -> None:
        plural = request.resource.plural if request.resource is not None else None
        if plural in (ROUTES, "deployments") and request.method == "PATCH" and request.subresource is None:
            self.writes.append(
                Write(
                    plural,
                    request.data,
                    len(ready_pods(self.emu)),
                    (route(self.emu).get("spec") or {}).get("rules") or [],
                )
            )

    def of(self, plural: str) -> list[Write]:
        return [w for w in self.writes if w.plural == plural]

    def check_never_at_an_empty_service(self) -> None:
        """Every route write that points a rule at the model Service came while a pod was Ready, and
        every scale to 0 came while the route pointed at the activator."""
        for write in self.writes:
            if write.plural == ROUTES:
                rules = write.data["spec"]["rules"]
                if any(r.get("backendRefs") != AT_ACTIVATOR for r in rules):
                    assert write.ready_pods > 0, f"the route pointed at the Service with no Ready pod: {write.data}"
            elif write.data.get("spec", {}).get("replicas") == 0:
                assert all(r.get("backendRefs") == AT_ACTIVATOR for r in write.route_rules), (
                    "scaled to 0 with the route at the Service"
                )


def route(emu: Any) -> dict[str, Any]:
    obj = emu.get(f"gateway.networking.k8s.io/v1/{ROUTES}", NAMESPACE, "llama")
    assert obj is not None
    return obj


def lifecycle(emu: Any) -> dict[str, Any]:
    return dict(status(emu).get("lifecycle") or {})


@pytest.fixture
async def routers() -> AsyncIterator[fake_routers.FakeRouters]:
    async with fake_routers.running() as r:
        r.idle_since = time.time()
        yield r


async def _service(cluster: Any, routers: Any, *, timeout: int = 600) -> Recorder:
    """Two Ready pods, idle; ScaleToZero after 1 s; the route with :data:`RULES`."""
    emu, server = cluster
    rules = {"rules": [{"policy": "ScaleToZero", "condition": {"idleSeconds": 1}}], "activationTimeoutSeconds": timeout}
    await make_service(emu, admin_port=routers.port, replicas=2, lifecycle=rules)
    response = await server.client.patch(
        f"/apis/gateway.networking.k8s.io/v1/namespaces/{NAMESPACE}/{ROUTES}/llama",
        json={"spec": {"rules": RULES}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status == 200, await response.text()
    await eventually(lambda: len(ready_pods(emu)) == 2, what="two Ready pods")
    return Recorder(emu)


async def _asleep(emu: Any) -> None:
    await eventually(lambda: deployment(emu)["spec"]["replicas"] == 0, what="scaled to zero", timeout=15)
    await eventually(lambda: lifecycle(emu).get("phase") == "ScaledToZero", what="phase ScaledToZero")
    await eventually(lambda: not ready_pods(emu), what="no Ready pod", timeout=10)


async def _ask_for_a_wake(server: kmock.Server, emu: Any) -> float:
    """As the activator does: a merge patch of the status subresource with the resourceVersion read."""
    obj = emu.get(MSVC, NAMESPACE, "llama")
    now = time.time()
    patch = activator.wake_patch(now, obj["metadata"]["resourceVersion"])
    response = await server.client.patch(
        f"/apis/{MSVC.rsplit('/', 1)[0]}/namespaces/{NAMESPACE}/modelservices/llama/status",
        json=patch,
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status == 200, await response.text()
    return now


def _route_reads(emu: Any) -> list[Any]:
    return [
        r
        for r in emu._requests
        if r.action == kmock.action.FETCH and r.resource is not None and r.resource.plural == ROUTES
    ]


def _wakes(op: Any, outcome: str) -> float:
    return float(
        op.ctx.metrics.registry.get_sample_value("drain_router_controller_wakes_total", {"outcome": outcome}) or 0
    )


async def test_sleep_points_the_route_at_the_activator_before_the_deployment_goes_to_zero(
    cluster: Any, routers: Any, start_operator: Any
) -> None:
    """1. two idle pods, ScaleToZero after 1 s, the activator enabled. Result: the route's every rule
    points at the activator with the header naming the ModelService, the originals in the
    annotation; that write came before the Deployment's scale to 0; replicasBeforeZero 2, phase
    ScaledToZero, one LifecycleScaledToZero event, the Waking condition False."""
    emu, _ = cluster
    recorder = await _service(cluster, routers)
    await start_operator(**FAST)
    await _asleep(emu)
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
    recorder = await _service(cluster, routers)
    op = await start_operator(**FAST)
    await _asleep(emu)
    for ip in fake_routers.IPS:  # the woken pods serve requests: the idle rule stays quiet after the wake
        routers.busy(ip)
    emu.ready_after = 1.0  # a woken pod's router answers for a second before the pod is Ready
    asked = await _ask_for_a_wake(server, emu)
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
    assert _wakes(op, "awoken") == 1 and _wakes(op, "failed") == 0
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
    recorder = await _service(cluster, routers)
    await start_operator(**FAST)
    await _asleep(emu)
    for ip in fake_routers.IPS:
        routers.answer(ip, 200, {"inflight": 0, "state": "starting", "idle_since": None, "served": 0})
    await _ask_for_a_wake(server, emu)
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
    await _service(cluster, routers)
    op = await start_operator(**FAST)
    await _asleep(emu)
    await op.stop()
    reads = len(_route_reads(emu))
    await start_operator(**{**FAST, "max_sleep_secs": 60.0, "requeue_secs": 60.0})
    # the daemon's first pass (it reads the route last) is over: it sleeps for the minute
    await eventually(lambda: len(_route_reads(emu)) > reads, what="the first pass after the restart")
    await _ask_for_a_wake(server, emu)
    await eventually(lambda: deployment(emu)["spec"]["replicas"] == 2, what="scaled back at once", timeout=5)


async def test_a_wake_without_a_ready_router_scales_back_to_zero_after_the_timeout(
    cluster: Any, routers: Any, start_operator: Any
) -> None:
    """1. asleep, activationTimeoutSeconds 2 2. a wake asked 3. the woken pods' routers never serve.
    Result: after 2 s the Deployment back at 0, a Warning WakeFailed, phase ScaledToZero,
    wakeRequestedAt cleared (the next held request asks again); the route never left the activator."""
    emu, server = cluster
    recorder = await _service(cluster, routers, timeout=2)
    op = await start_operator(**FAST)
    await _asleep(emu)
    for ip in fake_routers.IPS:
        routers.answer(ip, 503, "")
    asked = await _ask_for_a_wake(server, emu)
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
    assert _wakes(op, "failed") == 1
    recorder.check_never_at_an_empty_service()


async def test_without_the_flag_the_route_is_never_written(cluster: Any, routers: Any, start_operator: Any) -> None:
    emu, _ = cluster
    recorder = await _service(cluster, routers)
    await start_operator(**{k: v for k, v in FAST.items() if k != "activator_service"})
    await eventually(lambda: deployment(emu)["spec"]["replicas"] == 0, what="scaled to zero", timeout=15)
    requests = len(emu._requests)
    await eventually(lambda: len(emu._requests) > requests + 10, what="more passes")
    assert not recorder.of(ROUTES) and route(emu)["spec"]["rules"] == RULES
    assert "phase" not in lifecycle(emu) and condition(emu, "Waking") is None


async def test_a_route_it_cannot_switch_keeps_the_service_up(cluster: Any, routers: Any, start_operator: Any) -> None:
    """1. the route has no rules (nothing to point at the activator) 2. ScaleToZero due. Result: over
    many passes, neither the route nor the Deployment is written: a service is never put to sleep
    behind a route that still points at it."""
    emu, _ = cluster
    rules = {"rules": [{"policy": "ScaleToZero", "condition": {"idleSeconds": 1}}]}
    await make_service(emu, admin_port=routers.port, lifecycle=rules)
    await eventually(lambda: len(ready_pods(emu)) == 1, what="a Ready pod")
    recorder = Recorder(emu)
    await start_operator(**FAST)
    asked = len(routers.asked)
    await eventually(lambda: len(routers.asked) > asked + 10, what="ten passes", timeout=15)
    assert not recorder.writes and deployment(emu)["spec"]["replicas"] == 1


async def test_a_refused_scale_down_is_not_recorded(cluster: Any, routers: Any, start_operator: Any) -> None:
    """1. the route switched 2. the scale to 0 refused (500) for a while. Result: the record goes back
    to Active after each refusal (no pass mistakes the running pods for a person's wake: no
    WakeRequested); once the API accepts it, the service sleeps."""
    emu, _ = cluster
    recorder = await _service(cluster, routers)
    emu.fail("update", "apps/v1/deployments", "llama", 500, "InternalError", "etcd is having a moment")
    await start_operator(**FAST)
    await eventually(lambda: len(recorder.of("deployments")) >= 3, what="three refused scale-downs", timeout=15)
    await eventually(lambda: lifecycle(emu).get("phase") == "Active", what="the record put back")
    history = emu.objects[emu.key(MSVC, NAMESPACE, "llama")].history
    phases = [((h.get("status") or {}).get("lifecycle") or {}).get("phase") for h in history]
    assert "ScaledToZero" in phases and "Waking" not in phases, phases
    assert ("Normal", "WakeRequested") not in events(emu) and deployment(emu)["spec"]["replicas"] == 2
    emu.heal()
    await _asleep(emu)
    assert lifecycle(emu)["replicasBeforeZero"] == 2 and ("Normal", "WakeRequested") not in events(emu)
    recorder.check_never_at_an_empty_service()


async def test_a_service_asleep_before_the_activator_was_enabled_wakes_on_a_request(
    cluster: Any, routers: Any, start_operator: Any
) -> None:
    """1. scaled to zero by the rule with the route kept (no activator) 2. the controller restarted with
    --activator-service. Result: the route goes to the activator (the Deployment stays at 0), phase
    ScaledToZero; a wake asked scales it back to 1 (no replicasBeforeZero was recorded) and, once a
    router serves, the route's rules are restored."""
    emu, server = cluster
    await _service(cluster, routers)
    op = await start_operator(**{k: v for k, v in FAST.items() if k != "activator_service"})
    await eventually(lambda: deployment(emu)["spec"]["replicas"] == 0, what="scaled to zero", timeout=15)
    await op.stop()
    await eventually(lambda: not ready_pods(emu), what="no Ready pod", timeout=10)
    recorder = Recorder(emu)  # from here on, with the activator
    await start_operator(**FAST)
    await eventually(lambda: lifecycle(emu).get("phase") == "ScaledToZero", what="phase ScaledToZero")
    assert all(r["backendRefs"] == AT_ACTIVATOR for r in route(emu)["spec"]["rules"])
    assert all(w.data["spec"]["replicas"] == 0 for w in recorder.of("deployments")), "left at 0"
    for ip in fake_routers.IPS:
        routers.busy(ip)
    await _ask_for_a_wake(server, emu)
    await eventually(lambda: deployment(emu)["spec"]["replicas"] == 1, what="scaled back to 1", timeout=10)
    await eventually(lambda: route(emu)["spec"]["rules"] == RULES, what="the route's rules restored", timeout=15)
    recorder.check_never_at_an_empty_service()


async def test_recycling_waits_while_the_service_wakes(cluster: Any, routers: Any, start_operator: Any) -> None:
    """1. asleep 2. recycling turned on with a 1 s maximum pod lifetime, no waiting for idle 3. a wake
    asked; the woken pods' routers still starting. Result: while Waking, past their lifetime and
    Ready, no pod is evicted."""
    emu, server = cluster
    await _service(cluster, routers)
    await start_operator(**FAST)
    await _asleep(emu)
    response = await server.client.patch(
        f"/apis/{MSVC.rsplit('/', 1)[0]}/namespaces/{NAMESPACE}/modelservices/llama",
        json={"spec": {"recycling": {"maxPodLifetimeSeconds": 1, "waitForIdle": False}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status == 200, await response.text()
    for ip in fake_routers.IPS:
        routers.answer(ip, 200, {"inflight": 0, "state": "starting", "idle_since": None, "served": 0})
    evictions = len(emu.evictions)
    await _ask_for_a_wake(server, emu)
    await eventually(lambda: lifecycle(emu).get("phase") == "Waking", what="phase Waking", timeout=10)
    await eventually(lambda: len(ready_pods(emu)) == 2, what="two Ready pods (routers starting)")
    born = time.time()
    asked = len(routers.asked)
    await eventually(
        lambda: time.time() > born + 2 and len(routers.asked) > asked + 10, what="passes past the pods' lifetime"
    )
    assert lifecycle(emu)["phase"] == "Waking" and len(emu.evictions) == evictions
