"""Scale to zero and wake on a request (``--activator-service``) through the real operator, against the
emulator, stand-in routers and a stand-in for the activator's pods (their EndpointSlice and
``/admin/ports``): the orderings of waking on a request (docs/controller.md) as the API server saw
the writes."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from drain_router.decisions import durations, wake_endpoints

from . import fake_routers
from .conftest import NAMESPACE, eventually
from .rules_scenario import condition, deployment, ready_pods
from .scenario import event_messages, events
from .waking_scenario import (
    ACTIVATOR_IPS,
    ACTIVATOR_NAMESPACE,
    CONFIGMAP,
    POLICIES,
    RULES,
    SLICE,
    Recorder,
    StandInActivator,
    activator_slice,
    ask_for_a_wake,
    asleep,
    fast,
    lifecycle,
    service,
    slice_reads,
    stand_in_activator,
    wakes,
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


async def test_sleep_makes_the_activator_an_endpoint_before_the_deployment_goes_to_zero(
    cluster: Any, routers: Any, act: StandInActivator, start_operator: Any
) -> None:
    """1. two idle pods, ScaleToZero after 1 s, the activator enabled. Result: one port per protocol
    in the port map; an EndpointSlice of the Service llama with both listening activator pods as
    ready endpoints on those ports; it was created before the Deployment's scale to 0, which came on
    a later pass; replicasBeforeZero 2, phase ScaledToZero, one LifecycleScaledToZero event, the
    Waking condition False; a NetworkPolicy admitting every source to those ports only."""
    emu, _ = cluster
    recorder = await service(cluster, routers)
    await start_operator(**fast(act))
    await asleep(emu)
    assert act.ports() == {"20000": f"{NAMESPACE}/llama/grpc", "20001": f"{NAMESPACE}/llama/http"}
    slice_ = activator_slice(emu)
    assert slice_ is not None
    assert slice_["metadata"]["labels"] == {
        "kubernetes.io/service-name": "llama",
        "endpointslice.kubernetes.io/managed-by": "drain-router.dev",
        "drainrouter.dev/service": "llama",
    }
    assert [e["addresses"] for e in slice_["endpoints"]] == [[ip] for ip in ACTIVATOR_IPS]
    assert sorted((p["name"], p["port"]) for p in slice_["ports"]) == [("grpc", 20000), ("http", 20001)]
    order = [(w.plural, w.method) for w in recorder.writes]
    assert order == [("endpointslices", "POST"), ("deployments", "PATCH")], order
    assert recorder.scales() == [0]
    policy = emu.get(POLICIES, ACTIVATOR_NAMESPACE, wake_endpoints.policy_name(NAMESPACE, "llama"))
    assert policy is not None and policy["spec"]["ingress"] == [
        {"ports": [{"protocol": "TCP", "port": 20000}, {"protocol": "TCP", "port": 20001}]}
    ]
    record = lifecycle(emu)
    assert record["replicasBeforeZero"] == 2 and record["phase"] == "ScaledToZero" and record["scaledToZeroAt"]
    # (posted after the scale, by the operator's event poster: waited for)
    await eventually(lambda: events(emu).count(("Normal", "LifecycleScaledToZero")) == 1, what="LifecycleScaledToZero")
    cond = condition(emu, "Waking")
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", "ScaledToZero")
    recorder.check_always_an_endpoint()
    assert not recorder.user_writes, recorder.user_writes


async def test_no_activator_pod_listening_keeps_the_service_up(
    cluster: Any, routers: Any, act: StandInActivator, start_operator: Any
) -> None:
    """1. the activator pods answer /admin/ports with nothing (not yet polled) or fail 2. ScaleToZero
    due. Result: the ports are assigned, but over many passes no slice is written and the Deployment
    is not scaled; once a pod listens, the service sleeps."""
    emu, _ = cluster
    act.answers = {ACTIVATOR_IPS[0]: {"ports": {}}, ACTIVATOR_IPS[1]: None}
    recorder = await service(cluster, routers)
    await start_operator(**fast(act))
    await eventually(lambda: act.ports(), what="ports assigned", timeout=15)
    asked = len(act.asked)
    await eventually(lambda: len(act.asked) > asked + 6, what="three more passes", timeout=15)
    assert not recorder.writes and deployment(emu)["spec"]["replicas"] == 2
    act.answers = {ACTIVATOR_IPS[1]: None}  # one pod listens, the other still fails
    await asleep(emu)
    slice_ = activator_slice(emu)
    assert slice_ is not None and [e["addresses"] for e in slice_["endpoints"]] == [[ACTIVATOR_IPS[0]]]
    recorder.check_always_an_endpoint()


async def test_asleep_the_endpoints_follow_the_activator_pods(
    cluster: Any, routers: Any, act: StandInActivator, start_operator: Any
) -> None:
    """1. asleep behind both activator pods 2. an activator rollout: the second pod replaced by a
    new one at another IP. Result: the slice's endpoints are the first pod and the new one."""
    emu, _ = cluster
    await service(cluster, routers)
    await start_operator(**fast(act))
    await asleep(emu)
    await act.set_endpoints((ACTIVATOR_IPS[0], "127.0.0.202"))
    act.answers = {"127.0.0.202": {"ports": act.ports()}}  # (nothing listens on .202: the probe fails)
    await eventually(
        lambda: [e["addresses"] for e in (activator_slice(emu) or {}).get("endpoints", [])] == [[ACTIVATOR_IPS[0]]],
        what="the slice without the pod that left (the new one does not answer)",
        timeout=15,
    )
    assert deployment(emu)["spec"]["replicas"] == 0


async def test_a_wake_scales_back_and_removes_the_activator_once_a_router_serves(
    cluster: Any, routers: Any, act: StandInActivator, start_operator: Any
) -> None:
    """1. asleep as above 2. the activator asks for a wake (status.lifecycle.wakeRequestedAt).
    Result: the Deployment back at 2, phase Waking, a WakeRequested event, the Waking condition True;
    once a new pod is Ready and its router serves, the activator's slice deleted, phase Active,
    awokenAt and coldStartSeconds recorded, an Awoken event. The ports and the NetworkPolicy stay.
    No write removed the activator while no pod was Ready."""
    emu, server = cluster
    recorder = await service(cluster, routers)
    op = await start_operator(**fast(act))
    await asleep(emu)
    ports = act.ports()
    for ip in fake_routers.IPS:  # the woken pods serve requests: the idle rule stays quiet after the wake
        routers.busy(ip)
    emu.ready_after = 1.0  # a woken pod's router answers for a second before the pod is Ready
    asked = await ask_for_a_wake(server, emu)
    await eventually(lambda: deployment(emu)["spec"]["replicas"] == 2, what="scaled back to 2", timeout=10)
    await eventually(lambda: ("Normal", "WakeRequested") in events(emu), what="WakeRequested")
    await eventually(lambda: lifecycle(emu).get("phase") == "Active", what="phase Active", timeout=15)
    await eventually(lambda: activator_slice(emu) is None, what="the activator's slice deleted")
    record = lifecycle(emu)
    awoken = durations.parse_time(record["awokenAt"])
    assert durations.parse_time(record["wakeRequestedAt"]) == pytest.approx(asked, abs=0.001)
    assert record["coldStartSeconds"] == pytest.approx(awoken - asked, abs=0.01) and record["coldStartSeconds"] > 0
    await eventually(lambda: ("Normal", "Awoken") in events(emu), what="Awoken")
    assert events(emu).count(("Normal", "Awoken")) == 1 and events(emu).count(("Normal", "WakeRequested")) == 1
    cond = condition(emu, "Waking")
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", "Awoken")
    assert wakes(op, "awoken") == 1 and wakes(op, "failed") == 0
    waking = [m for m in event_messages(emu) if m[1] == "WakeRequested"]
    assert waking and "a request is held" in waking[0][2]
    scale_up = next(
        i for i, w in enumerate(recorder.writes) if w.plural == "deployments" and w.data["spec"]["replicas"] == 2
    )
    removed = next(i for i, w in enumerate(recorder.writes) if w.plural == "endpointslices" and w.method == "DELETE")
    assert scale_up < removed
    assert act.ports() == ports, "the ports stay while the ModelService exists"
    assert emu.get(POLICIES, ACTIVATOR_NAMESPACE, wake_endpoints.policy_name(NAMESPACE, "llama")) is not None
    recorder.check_always_an_endpoint()


async def test_the_users_routes_services_and_grants_are_never_written(
    cluster: Any, routers: Any, act: StandInActivator, start_operator: Any
) -> None:
    """1. asleep 2. woken 3. asleep again. Result: not one write to an HTTPRoute, a GRPCRoute, a
    Service or a ReferenceGrant; the HTTPRoute's rules as the user wrote them."""
    emu, server = cluster
    recorder = await service(cluster, routers)
    await start_operator(**fast(act))
    await asleep(emu)
    await ask_for_a_wake(server, emu)
    await eventually(lambda: lifecycle(emu).get("phase") == "Active", what="awake", timeout=15)
    await eventually(lambda: activator_slice(emu) is None, what="the activator's slice deleted")
    await asleep(emu)
    assert recorder.scales() == [0, 2, 0]
    assert not recorder.user_writes, recorder.user_writes
    route = emu.get("gateway.networking.k8s.io/v1/httproutes", NAMESPACE, "llama")
    assert route is not None and route["spec"]["rules"] == RULES
    recorder.check_always_an_endpoint()


async def test_the_waking_condition_is_true_while_waking(
    cluster: Any, routers: Any, act: StandInActivator, start_operator: Any
) -> None:
    """1. asleep 2. a wake asked 3. the woken pods' routers still starting. Result: phase Waking, the
    Waking condition True, the activator still an endpoint."""
    emu, server = cluster
    recorder = await service(cluster, routers)
    await start_operator(**fast(act))
    await asleep(emu)
    for ip in fake_routers.IPS:
        routers.answer(ip, 200, {"inflight": 0, "state": "starting", "idle_since": None, "served": 0})
    await ask_for_a_wake(server, emu)
    await eventually(lambda: lifecycle(emu).get("phase") == "Waking", what="phase Waking", timeout=10)
    await eventually(lambda: len(ready_pods(emu)) == 2, what="two Ready pods (routers starting)")
    cond = condition(emu, "Waking")
    assert cond is not None and (cond["status"], cond["reason"]) == ("True", "Waking")
    assert activator_slice(emu) is not None
    recorder.check_always_an_endpoint()


async def test_a_wake_request_runs_a_pass_at_once(
    cluster: Any, routers: Any, act: StandInActivator, start_operator: Any
) -> None:
    """1. asleep 2. the operator restarted with a 60 s requeue and maximum sleep 3. a wake asked.
    Result: the Deployment is scaled back within a few seconds, not after the minute."""
    emu, server = cluster
    await service(cluster, routers)
    op = await start_operator(**fast(act))
    await asleep(emu)
    await op.stop()
    reads = len(slice_reads(emu))
    await start_operator(**fast(act, max_sleep_secs=60.0, requeue_secs=60.0))
    await eventually(lambda: len(slice_reads(emu)) > reads, what="the first pass after the restart")
    await ask_for_a_wake(server, emu)
    await eventually(lambda: deployment(emu)["spec"]["replicas"] == 2, what="scaled back at once", timeout=5)


async def test_a_wake_without_a_ready_router_scales_back_to_zero_after_the_timeout(
    cluster: Any, routers: Any, act: StandInActivator, start_operator: Any
) -> None:
    """1. asleep, activationTimeoutSeconds 2 2. a wake asked 3. the woken pods' routers never serve.
    Result: after 2 s the Deployment back at 0, a Warning WakeFailed, phase ScaledToZero,
    wakeRequestedAt cleared (the next held request asks again); the activator's slice never left."""
    emu, server = cluster
    recorder = await service(cluster, routers, timeout=2)
    op = await start_operator(**fast(act))
    await asleep(emu)
    for ip in fake_routers.IPS:
        routers.answer(ip, 503, "")
    asked = await ask_for_a_wake(server, emu)
    await eventually(lambda: deployment(emu)["spec"]["replicas"] == 2, what="scaled back to 2", timeout=10)
    await eventually(lambda: ("Warning", "WakeFailed") in events(emu), what="WakeFailed", timeout=15)
    assert time.time() >= asked + 2
    assert deployment(emu)["spec"]["replicas"] == 0
    record = lifecycle(emu)
    assert record["phase"] == "ScaledToZero" and "wakeRequestedAt" not in record
    assert recorder.scales() == [0, 2, 0]
    assert [w.method for w in recorder.of("endpointslices")] == ["POST"], "the slice stayed"
    cond = condition(emu, "Waking")
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", "WakeFailed")
    assert wakes(op, "failed") == 1
    recorder.check_always_an_endpoint()


async def test_without_the_flag_nothing_of_the_wake_is_written(
    cluster: Any, routers: Any, act: StandInActivator, start_operator: Any
) -> None:
    emu, _ = cluster
    recorder = await service(cluster, routers)
    await start_operator(**{k: v for k, v in fast(act).items() if k != "activator_service"})
    await eventually(lambda: deployment(emu)["spec"]["replicas"] == 0, what="scaled to zero", timeout=15)
    requests = len(emu._requests)
    await eventually(lambda: len(emu._requests) > requests + 10, what="more passes")
    assert not recorder.of("endpointslices") and not recorder.user_writes
    assert emu.get(CONFIGMAP, ACTIVATOR_NAMESPACE, "activator-ports") is None
    assert "phase" not in lifecycle(emu) and condition(emu, "Waking") is None
    assert activator_slice(emu) is None and SLICE


async def test_the_activators_policy_admits_whom_the_models_own_policies_admit(
    cluster: Any, routers: Any, act: StandInActivator, start_operator: Any
) -> None:
    """1. the ModelService owns a NetworkPolicy admitting, to its pods, pods labelled role=gateway of
    its namespace and 10.0.0.0/8; another policy, not its own, admits everything 2. asleep. Result:
    the activator's policy admits exactly those two peers, the pod peer pinned to the model's
    namespace, on the service's two activator ports."""
    emu, _ = cluster
    ingress = [{"from": [{"podSelector": {"matchLabels": {"role": "gateway"}}}, {"ipBlock": {"cidr": "10.0.0.0/8"}}]}]
    await emu.put(
        POLICIES,
        {
            "metadata": {"name": "llama", "namespace": NAMESPACE, "labels": {"drainrouter.dev/service": "llama"}},
            "spec": {"podSelector": {"matchLabels": {"app.kubernetes.io/instance": "llama"}}, "ingress": ingress},
        },
    )
    await emu.put(
        POLICIES,
        {"metadata": {"name": "theirs", "namespace": NAMESPACE}, "spec": {"podSelector": {}, "ingress": [{}]}},
    )
    await service(cluster, routers)
    await start_operator(**fast(act))
    await asleep(emu)
    policy = emu.get(POLICIES, ACTIVATOR_NAMESPACE, wake_endpoints.policy_name(NAMESPACE, "llama"))
    assert policy is not None
    assert policy["spec"]["ingress"] == [
        {
            "ports": [{"protocol": "TCP", "port": 20000}, {"protocol": "TCP", "port": 20001}],
            "from": [
                {
                    "podSelector": {"matchLabels": {"role": "gateway"}},
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
                },
                {"ipBlock": {"cidr": "10.0.0.0/8"}},
            ],
        }
    ]
    assert policy["spec"]["podSelector"] == {"matchLabels": {"app.kubernetes.io/component": "activator"}}


async def test_while_asleep_the_activators_policy_follows_a_change_of_the_models(
    cluster: Any, routers: Any, act: StandInActivator, start_operator: Any
) -> None:
    """1. asleep, the model's own policy admitting 10.0.0.0/8 2. a person narrows it to 10.1.0.0/16
    (the slices, ports and activator pods unchanged). Result: the activator's policy admits
    10.1.0.0/16 alone, and the service stays asleep."""
    emu, _ = cluster

    def model_policy(cidr: str) -> dict[str, Any]:
        return {
            "metadata": {"name": "llama", "namespace": NAMESPACE, "labels": {"drainrouter.dev/service": "llama"}},
            "spec": {
                "podSelector": {"matchLabels": {"app.kubernetes.io/instance": "llama"}},
                "ingress": [{"from": [{"ipBlock": {"cidr": cidr}}]}],
            },
        }

    def admitted() -> list[Any]:
        policy = emu.get(POLICIES, ACTIVATOR_NAMESPACE, wake_endpoints.policy_name(NAMESPACE, "llama"))
        return [] if policy is None else [p for rule in policy["spec"]["ingress"] for p in rule.get("from", [])]

    await emu.put(POLICIES, model_policy("10.0.0.0/8"))
    await service(cluster, routers)
    await start_operator(**fast(act))
    await asleep(emu)
    assert admitted() == [{"ipBlock": {"cidr": "10.0.0.0/8"}}]
    async with emu._lock:  # a person's edit: the ingress rule replaced (a JSON patch, as kubectl sends)
        key = emu.key(POLICIES, NAMESPACE, "llama")
        emu._write(
            key, [{"op": "replace", "path": "/spec/ingress", "value": model_policy("10.1.0.0/16")["spec"]["ingress"]}]
        )
        await emu._flush()
    await eventually(lambda: admitted() == [{"ipBlock": {"cidr": "10.1.0.0/16"}}], what="the policy followed")
    assert lifecycle(emu)["phase"] == "ScaledToZero" and deployment(emu)["spec"]["replicas"] == 0


def _passes(emu: Any) -> int:
    """The operator's passes over the service so far (each lists the activator's slices once)."""
    return len(slice_reads(emu))


def _status_writes(emu: Any) -> list[Any]:
    return [
        r
        for r in emu._requests
        if r.resource is not None
        and r.resource.plural == "modelservices"
        and r.subresource == "status"
        and str(getattr(r.method, "value", r.method)) == "PATCH"
        and not r.headers.get("User-Agent", "").startswith("kmock/")
    ]


async def test_a_wake_asked_after_the_wake_is_no_second_wake(
    cluster: Any, routers: Any, act: StandInActivator, start_operator: Any
) -> None:
    """1. asleep, woken by a request, Active, the activator's slice gone, the pods busy (no sleep due)
    2. a second activator replica's request lands after awokenAt (wakeRequestedAt later than
    awokenAt, phase Active). Result: no second wake: the Deployment is never scaled again, the
    activator's slice never written again, phase Active, awokenAt and coldStartSeconds unchanged,
    one WakeRequested and one Awoken event; the late request stays recorded, and it does not turn
    into a stream of passes (the wake nudge is for a service asleep)."""
    emu, server = cluster
    recorder, op = await _woken_busy(cluster, routers, act, start_operator)
    woken = lifecycle(emu)
    writes = len(recorder.writes)
    await op.stop()  # (passes only when due or nudged from here: a minute apart)
    before = _passes(emu)
    op = await start_operator(**fast(act, max_sleep_secs=60.0, requeue_secs=60.0))
    await eventually(lambda: _passes(emu) > before, what="the first pass after the restart")
    passes, statuses = _passes(emu), len(_status_writes(emu))
    late = await ask_for_a_wake(server, emu)
    assert late > durations.parse_time(woken["awokenAt"])
    await eventually(lambda: _passes(emu) > passes, what="a pass that saw the late request", timeout=10)
    assert len(_status_writes(emu)) == statuses, "the pass that saw it wrote nothing: no flap"
    record = lifecycle(emu)
    assert record["phase"] == "Active"
    assert (record["awokenAt"], record["coldStartSeconds"]) == (woken["awokenAt"], woken["coldStartSeconds"])
    assert durations.parse_time(record["wakeRequestedAt"]) == pytest.approx(late, abs=0.001)
    assert recorder.scales() == [0, 2] and len(recorder.writes) == writes, recorder.writes[writes:]
    assert events(emu).count(("Normal", "WakeRequested")) == 1 and events(emu).count(("Normal", "Awoken")) == 1
    assert wakes(op, "awoken") == 0, "the restarted operator counted no wake"


async def test_a_wake_asked_after_the_wake_does_not_cancel_the_next_sleep(
    cluster: Any, routers: Any, act: StandInActivator, start_operator: Any
) -> None:
    """1. asleep, woken by a request, Active, the pods busy 2. a held request's last poll lands after
    the wake (wakeRequestedAt later than awokenAt, the activator no endpoint) 3. the pods go idle.
    Result: the next sleep runs straight through, as if nothing had been asked: the activator's
    slice written once, then the scale to 0; never written, removed and written again (the late
    request would have turned the sleep into a wake of pods that never stopped)."""
    emu, server = cluster
    recorder, _ = await _woken_busy(cluster, routers, act, start_operator)
    late = await ask_for_a_wake(server, emu)
    assert late > durations.parse_time(lifecycle(emu)["awokenAt"])
    routers.idle_since = time.time()
    for ip in fake_routers.IPS:
        routers.idle(ip)
    await eventually(
        lambda: deployment(emu)["spec"]["replicas"] == 0 and recorder.scales() == [0, 2, 0],
        what="asleep again",
        timeout=15,
    )
    assert [w.method for w in recorder.of("endpointslices")] == ["POST", "DELETE", "POST"]
    assert lifecycle(emu).get("wakeRequestedAt") is None, "the late request forgotten as the sleep began"
    recorder.check_always_an_endpoint()


async def test_a_cold_start_is_not_idle_time(
    cluster: Any, routers: Any, act: StandInActivator, start_operator: Any
) -> None:
    """1. asleep (ScaleToZero after 1 s idle) 2. a wake whose pods take 2 s to turn Ready, longer
    than that idle time; the routers idle throughout. Result: the next sleep begins (the activator's
    slice written again) no sooner than 1 s after awokenAt: the service's idle clock starts at the
    wake's end, not at its start, so the requests it woke for are not met by a sleep."""
    emu, server = cluster
    recorder = await service(cluster, routers)
    await start_operator(**fast(act))
    await asleep(emu)
    emu.ready_after = 2.0
    await ask_for_a_wake(server, emu)
    await eventually(lambda: lifecycle(emu).get("phase") == "Active", what="phase Active", timeout=15)
    awoken = durations.parse_time(lifecycle(emu)["awokenAt"])
    await eventually(lambda: recorder.scales() == [0, 2, 0], what="asleep again", timeout=15)
    removed, again = recorder.of("endpointslices")[1:3]
    assert (removed.method, again.method) == ("DELETE", "POST")
    # (less the milliseconds between the wake's end and the same pass's reading of the clock)
    assert again.at - awoken >= 0.95, f"slept {again.at - awoken:.2f}s after the wake's end"
    assert lifecycle(emu)["coldStartSeconds"] >= 2.0


async def _woken_busy(cluster: Any, routers: Any, act: StandInActivator, start_operator: Any) -> tuple[Recorder, Any]:
    """Asleep, then woken by a request: phase Active, the activator's slice gone, the pods busy (no
    sleep due). Returns the recorder of the writes and the operator."""
    emu, server = cluster
    recorder = await service(cluster, routers)
    op = await start_operator(**fast(act))
    await asleep(emu)
    for ip in fake_routers.IPS:
        routers.busy(ip)
    await ask_for_a_wake(server, emu)
    await eventually(lambda: lifecycle(emu).get("phase") == "Active", what="phase Active", timeout=15)
    await eventually(lambda: activator_slice(emu) is None, what="the activator's slice deleted")
    return recorder, op
