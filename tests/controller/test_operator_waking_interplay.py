"""Scale to zero and wake on a request beside everything else the controller does: a service with no
Service of its own, a refused scale-down, a service asleep before the activator was enabled, recycling
while waking, a deletion while asleep."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from . import fake_routers
from .conftest import MSVC, NAMESPACE, eventually
from .rules_scenario import deployment, make_service, ready_pods
from .scenario import delete_msvc, delete_order, events, exists
from .waking_scenario import (
    ACTIVATOR_NAMESPACE,
    CONFIGMAP,
    POLICIES,
    Recorder,
    StandInActivator,
    activator_slice,
    ask_for_a_wake,
    asleep,
    fast,
    lifecycle,
    service,
    stand_in_activator,
)


@pytest.fixture
async def routers() -> AsyncIterator[fake_routers.FakeRouters]:
    async with fake_routers.running() as r:
        r.idle_since = time.time()
        yield r


@pytest.fixture
async def act(cluster: Any) -> AsyncIterator[StandInActivator]:
    async with stand_in_activator(cluster[0]) as a:
        yield a


async def test_a_service_without_a_service_sleeps_and_says_a_request_cannot_wake_it(
    cluster: Any, routers: Any, act: StandInActivator, start_operator: Any
) -> None:
    """1. the workload has no Service (reached through an InferencePool, say) 2. ScaleToZero due.
    Result: scaled to zero at once, no slice, no port; a Warning NoWakeOnRequest says why."""
    emu, _ = cluster
    rules = {"rules": [{"policy": "ScaleToZero", "condition": {"idleSeconds": 1}}]}
    await make_service(emu, admin_port=routers.port, lifecycle=rules)
    await eventually(lambda: len(ready_pods(emu)) == 1, what="a Ready pod")
    recorder = Recorder(emu)
    await start_operator(**fast(act))
    await asleep(emu)
    await eventually(lambda: ("Warning", "NoWakeOnRequest") in events(emu), what="NoWakeOnRequest")
    assert not recorder.of("endpointslices") and not act.ports()


async def test_a_refused_scale_down_is_not_recorded(
    cluster: Any, routers: Any, act: StandInActivator, start_operator: Any
) -> None:
    """1. the activator an endpoint 2. the scale to 0 refused (500) for a while. Result: the record goes back
    to Active after each refusal (no pass mistakes the running pods for a person's wake: no
    WakeRequested); once the API accepts it, the service sleeps."""
    emu, _ = cluster
    recorder = await service(cluster, routers)
    emu.fail("update", "apps/v1/deployments", "llama", 500, "InternalError", "etcd is having a moment")
    await start_operator(**fast(act))
    await eventually(lambda: len(recorder.of("deployments")) >= 3, what="three refused scale-downs", timeout=15)
    await eventually(lambda: lifecycle(emu).get("phase") == "Active", what="the record put back")
    history = emu.objects[emu.key(MSVC, NAMESPACE, "llama")].history
    phases = [((h.get("status") or {}).get("lifecycle") or {}).get("phase") for h in history]
    assert "ScaledToZero" in phases and "Waking" not in phases, phases
    assert ("Normal", "WakeRequested") not in events(emu) and deployment(emu)["spec"]["replicas"] == 2
    emu.heal()
    await asleep(emu)
    assert lifecycle(emu)["replicasBeforeZero"] == 2 and ("Normal", "WakeRequested") not in events(emu)
    recorder.check_always_an_endpoint()


async def test_a_service_asleep_before_the_activator_was_enabled_wakes_on_a_request(
    cluster: Any, routers: Any, act: StandInActivator, start_operator: Any
) -> None:
    """1. scaled to zero by the rule (no activator) 2. the controller restarted with
    --activator-service. Result: the activator becomes an endpoint (the Deployment stays at 0), phase
    ScaledToZero; a wake asked scales it back to 1 (no replicasBeforeZero was recorded) and, once a
    router serves, the activator's slice is removed."""
    emu, server = cluster
    await service(cluster, routers)
    op = await start_operator(**{k: v for k, v in fast(act).items() if k != "activator_service"})
    await eventually(lambda: deployment(emu)["spec"]["replicas"] == 0, what="scaled to zero", timeout=15)
    await op.stop()
    await eventually(lambda: not ready_pods(emu), what="no Ready pod", timeout=10)
    recorder = Recorder(emu)  # from here on, with the activator
    await start_operator(**fast(act))
    await eventually(lambda: lifecycle(emu).get("phase") == "ScaledToZero", what="phase ScaledToZero")
    assert activator_slice(emu) is not None
    assert all(w.data["spec"]["replicas"] == 0 for w in recorder.of("deployments")), "left at 0"
    for ip in fake_routers.IPS:
        routers.busy(ip)
    await ask_for_a_wake(server, emu)
    await eventually(lambda: deployment(emu)["spec"]["replicas"] == 1, what="scaled back to 1", timeout=10)
    await eventually(lambda: activator_slice(emu) is None, what="the activator's slice removed", timeout=15)
    recorder.check_always_an_endpoint()


async def test_recycling_waits_while_the_service_wakes(
    cluster: Any, routers: Any, act: StandInActivator, start_operator: Any
) -> None:
    """1. asleep 2. recycling turned on with a 1 s maximum pod lifetime, no waiting for idle 3. a wake
    asked; the woken pods' routers still starting. Result: while Waking, past their lifetime and
    Ready, no pod is evicted."""
    emu, server = cluster
    await service(cluster, routers)
    await start_operator(**fast(act))
    await asleep(emu)
    response = await server.client.patch(
        f"/apis/{MSVC.rsplit('/', 1)[0]}/namespaces/{NAMESPACE}/modelservices/llama",
        json={"spec": {"recycling": {"maxPodLifetimeSeconds": 1, "waitForIdle": False}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status == 200, await response.text()
    for ip in fake_routers.IPS:
        routers.answer(ip, 200, {"inflight": 0, "state": "starting", "idle_since": None, "served": 0})
    evictions = len(emu.evictions)
    await ask_for_a_wake(server, emu)
    await eventually(lambda: lifecycle(emu).get("phase") == "Waking", what="phase Waking", timeout=10)
    await eventually(lambda: len(ready_pods(emu)) == 2, what="two Ready pods (routers starting)")
    born = time.time()
    asked = len(routers.asked)
    await eventually(
        lambda: time.time() > born + 2 and len(routers.asked) > asked + 10, what="passes past the pods' lifetime"
    )
    assert lifecycle(emu)["phase"] == "Waking" and len(emu.evictions) == evictions


async def test_a_service_deleted_while_asleep_tears_down_and_gives_its_ports_back(
    cluster: Any, routers: Any, act: StandInActivator, start_operator: Any
) -> None:
    """1. asleep (the activator an endpoint) 2. the ModelService deleted. Result: the staged teardown
    removes the route, then the workload, and releases it; its ports leave the port map and its
    NetworkPolicy is deleted; nothing writes a slice or scales the Deployment after the deletion
    started."""
    emu, server = cluster
    recorder = await service(cluster, routers)
    await start_operator(**fast(act))
    await asleep(emu)
    assert act.ports() and emu.get(POLICIES, ACTIVATOR_NAMESPACE, f"drain-router-{NAMESPACE}-llama") is not None
    writes = len(recorder.writes)
    await delete_msvc(emu, server)
    await eventually(lambda: not exists(emu, MSVC), what="the ModelService released", timeout=20)
    order = delete_order(emu)
    assert order.index("httproutes/llama") < order.index("deployments/llama"), order
    late = [w for w in recorder.writes[writes:] if w.method != "DELETE"]  # (the teardown deletes)
    assert not late, late
    assert act.ports() == {} and emu.get(CONFIGMAP, ACTIVATOR_NAMESPACE, "activator-ports") is not None
    assert emu.get(POLICIES, ACTIVATOR_NAMESPACE, f"drain-router-{NAMESPACE}-llama") is None
    # The policy goes before the ports: a port given to another service never keeps this one's peers.
    calls = [
        (str(r.method).upper().rsplit(".", 1)[-1], r.resource.plural)
        for r in emu._requests
        if r.resource is not None and r.resource.plural in ("networkpolicies", "configmaps")
    ]
    assert calls.index(("DELETE", "networkpolicies")) < max(
        i for i, c in enumerate(calls) if c == ("PATCH", "configmaps")
    )


def _ghost_policy(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": f"drain-router-{name}", "namespace": ACTIVATOR_NAMESPACE},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
    }


async def test_the_ports_of_a_service_gone_without_its_last_pass_are_swept(
    cluster: Any, routers: Any, act: StandInActivator, start_operator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The port map holds entries of ModelServices that no longer exist (removed without their
    finalizer's last pass), with their NetworkPolicies. 1. the controller starts. Result: those of the
    watched namespace are given back and their policies deleted, an unwatched namespace's entry kept,
    the sleeping service's ports kept. 2. another entry left behind while it runs. Result: swept at
    the next period."""
    from drain_router.controller.passes import waking

    emu, _ = cluster
    monkeypatch.setattr(waking, "SWEEP_PERIOD_SECS", 0.2)
    await emu.put(
        CONFIGMAP,
        {
            "metadata": {"name": "activator-ports", "namespace": ACTIVATOR_NAMESPACE},
            "data": {
                "20900": f"{NAMESPACE}/ghost/http",
                "20901": f"{NAMESPACE}/ghost/grpc",
                "20902": "elsewhere/x/http",
            },
        },
    )
    await emu.put(POLICIES, _ghost_policy(f"{NAMESPACE}-ghost"))
    await service(cluster, routers)
    await start_operator(**fast(act))
    await asleep(emu)
    await eventually(lambda: "20900" not in act.ports(), what="the ghost's ports swept")
    assert "20901" not in act.ports() and act.ports()["20902"] == "elsewhere/x/http"
    assert emu.get(POLICIES, ACTIVATOR_NAMESPACE, f"drain-router-{NAMESPACE}-ghost") is None
    mine = {p for p, a in act.ports().items() if a.startswith(f"{NAMESPACE}/llama/")}
    assert len(mine) == 2, act.ports()

    # Left behind while the controller runs: swept within a period.
    async with emu._lock:
        key = emu.key(CONFIGMAP, ACTIVATOR_NAMESPACE, "activator-ports")
        emu._write(key, [{"op": "add", "path": "/data/20903", "value": f"{NAMESPACE}/late/http"}])
        await emu._flush()
    await emu.put(POLICIES, _ghost_policy(f"{NAMESPACE}-late"))
    await eventually(lambda: "20903" not in act.ports(), what="the late ghost's port swept")
    assert emu.get(POLICIES, ACTIVATOR_NAMESPACE, f"drain-router-{NAMESPACE}-late") is None
    assert {p for p, a in act.ports().items() if a.startswith(f"{NAMESPACE}/llama/")} == mine
    assert lifecycle(emu)["phase"] == "ScaledToZero"
