"""The ownership rule through the real operator: a ModelService names a route, a Deployment and a
Service it does not own and selects pods it does not own; none of them is written, whatever the
ModelService asks for (its teardown, recycling, a ScaleToZero rule), while what it owns (by label or
by owner reference) is handled as before. The emulator's audit (:mod:`ownership_audit`) also checks
every write of every controller test."""

from __future__ import annotations

from typing import Any

import kmock

from drain_router.controller import crd

from .conftest import MSVC, NAMESPACE, ClusterEmulator, eventually
from .rules_scenario import make_service as make_rules_service
from .rules_scenario import pods, ready_pods
from .scenario import LABELS, OWNED, ROUTE, delete_msvc, event_messages, msvc, replicaset

FAST = {"idle_recheck_secs": 0.2, "recycle_retry_secs": 1.0, "max_sleep_secs": 0.3, "lifecycle_buffer_secs": 0.1}
WRITES = ("DELETE", "PATCH", "PUT", "POST")
OWN = ("modelservices", "events", "leases")


def _writes(emu: ClusterEmulator, *plurals: str) -> list[str]:
    """The controller's writes (not the test's) to objects of these kinds, as ``METHOD plural/name``."""
    out = []
    for r in emu._requests:
        method = str(getattr(r.method, "value", r.method))
        if r.resource is None or r.resource.plural in OWN or method not in WRITES:
            continue
        if r.headers.get("User-Agent", "").startswith("kmock/"):
            continue
        if not plurals or r.resource.plural in plurals:
            out.append(f"{method} {r.resource.plural}/{r.name}")
    return out


def _not_owned(emu: ClusterEmulator) -> list[str]:
    """``status.notOwned`` as last written (the object may be gone by now)."""
    key = emu.key(MSVC, NAMESPACE, "llama")
    if key not in emu.objects:
        return []
    return list((emu.objects[key].last.get("status") or {}).get("notOwned") or [])


def _warned(emu: ClusterEmulator) -> list[str]:
    return [message for _, reason, message in event_messages(emu) if reason == "NotOwned"]


async def _service_of_objects(emu: ClusterEmulator, labels: dict[str, str], *, uid_ref: bool = False) -> None:
    """Node, Deployment (its two pods through a ReplicaSet, selected by ``LABELS``), Service, route
    carrying ``labels``, and the ModelService naming them (a 3 s budget, no settle)."""
    await emu.put(
        "v1/nodes", {"metadata": {"name": "gpu-1"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    )
    deployment = await emu.put(
        "apps/v1/deployments", {"metadata": {"name": "llama", "namespace": NAMESPACE, "labels": labels}}
    )
    refs = await replicaset(emu, deployment)
    for i in range(2):
        await emu.put(
            "v1/pods",
            {
                "metadata": {"name": f"llama-{i}", "namespace": NAMESPACE, "labels": LABELS, "ownerReferences": refs},
                "spec": {"nodeName": "gpu-1", "terminationGracePeriodSeconds": 30},
            },
        )
    await emu.put("v1/services", {"metadata": {"name": "llama", "namespace": NAMESPACE, "labels": labels}})
    await emu.put(
        "gateway.networking.k8s.io/v1/httproutes",
        {"metadata": {"name": "llama", "namespace": NAMESPACE, "labels": labels}},
    )
    await emu.put(
        MSVC,
        {
            "apiVersion": f"{crd.group()}/{crd.version()}",
            "kind": "ModelService",
            "metadata": {"name": "llama", "namespace": NAMESPACE},
            "spec": {
                "podSelector": {"matchLabels": LABELS},
                "route": ROUTE,
                "workload": [
                    {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"},
                    {"apiVersion": "v1", "kind": "Service", "name": "llama"},
                ],
                "deletion": {"routeSettle": "0s", "maxWait": "3s", "forceDeleteAfter": "0s"},
            },
        },
    )


async def test_a_teardown_writes_nothing_the_service_does_not_own(
    cluster: tuple[ClusterEmulator, kmock.Server], start_operator: Any
) -> None:
    """1. A ModelService names a route, a Deployment and a Service, none labelled for it nor owned by
    it; its selector matches the Deployment's two pods (force-delete-after 0 s). 2. Deleted.
    Result: not one write reaches any of them: the route is waited for as one held by a foreign
    finalizer and the teardown goes on at the deadline (RouteStuck), the workload is skipped, the pods
    are neither waited for nor force-deleted; ``status.notOwned`` names all five and a NotOwned
    warning each; the ModelService is released."""
    emu, server = cluster
    await _service_of_objects(emu, {})
    await start_operator(**FAST)
    await delete_msvc(emu, server)
    await eventually(lambda: msvc(emu) is None, what="the release at the deadline", timeout=20)

    assert _writes(emu) == []
    last = emu.objects[emu.key(MSVC, NAMESPACE, "llama")].last["status"]
    assert (last["deletion"]["stage"], last["deletion"]["outcome"]) == ("Released", "RouteStuck")
    reason = "neither labelled for this service nor owned by it"
    through = "not owned through a ReplicaSet by a Deployment this service owns"
    expected = [
        f"HTTPRoute/llama: {reason}",
        f"Deployment/llama: {reason}",
        f"Service/llama: {reason}",
        f"Pod/llama-0: {through}",
        f"Pod/llama-1: {through}",
    ]
    assert sorted(_not_owned(emu)) == sorted(expected)
    await eventually(lambda: len(_warned(emu)) >= len(expected), what="a NotOwned warning each", timeout=10)
    assert sorted(_warned(emu)) == sorted(f"left alone: {item}" for item in expected)
    for kind in ("apps/v1/deployments", "v1/services", "gateway.networking.k8s.io/v1/httproutes"):
        assert emu.get(kind, NAMESPACE, "llama") is not None


async def test_owned_by_label_or_by_reference_is_torn_down_and_a_stranger_pod_is_not(
    cluster: tuple[ClusterEmulator, kmock.Server], start_operator: Any
) -> None:
    """1. The route and the Service say they are the service's by an owner reference to it, the
    Deployment by its label; a pod of another, unlabelled Deployment matches the selector too. 2.
    Deleted. Result: route, Deployment and Service deleted in order, the Deployment in the foreground
    (it stays while its pods terminate, so they can still prove whose they are), its pods waited for
    and gone; the stranger pod is never written and does not hold the teardown (outcome Clean)."""
    emu, server = cluster
    await _service_of_objects(emu, OWNED)
    msvc_uid = msvc(emu)["metadata"]["uid"]  # type: ignore[index]
    owner = [{"apiVersion": f"{crd.group()}/{crd.version()}", "kind": "ModelService", "name": "llama", "uid": msvc_uid}]
    for path in ("v1/services", "gateway.networking.k8s.io/v1/httproutes"):
        key = emu.key(path, NAMESPACE, "llama")
        emu.objects[key].patch({"metadata": {"labels": None, "ownerReferences": owner}})
    for i in range(2):  # these exit 0.2 s after SIGTERM
        emu.objects[emu.key("v1/pods", NAMESPACE, f"llama-{i}")].patch(
            {"metadata": {"annotations": {"emulator.test/exits-after-secs": "0.2"}}}
        )
    other = await emu.put("apps/v1/deployments", {"metadata": {"name": "other", "namespace": NAMESPACE}})
    stranger_refs = await replicaset(emu, other, name="other-7d9f")
    await emu.put(
        "v1/pods",
        {
            "metadata": {
                "name": "stranger",
                "namespace": NAMESPACE,
                "labels": LABELS,
                "ownerReferences": stranger_refs,
            },
            "spec": {"nodeName": "gpu-1"},
        },
    )
    patched = emu.objects[emu.key(MSVC, NAMESPACE, "llama")]
    patched.patch({"spec": {"deletion": {"routeSettle": "0s", "maxWait": "20s", "forceDeleteAfter": None}}})
    await start_operator(**FAST)
    await delete_msvc(emu, server)
    await eventually(lambda: msvc(emu) is None, what="the release", timeout=20)

    deletes = _writes(emu)
    assert deletes[:3] == ["DELETE httproutes/llama", "DELETE deployments/llama", "DELETE services/llama"], deletes
    assert not [w for w in deletes if "stranger" in w or "other" in w]
    foreground = [
        r.data.get("propagationPolicy")
        for r in emu._requests
        if r.resource is not None
        and r.resource.plural == "deployments"
        and r.name == "llama"
        and isinstance(r.data, dict)
    ]
    assert foreground == ["Foreground"]
    last = emu.objects[emu.key(MSVC, NAMESPACE, "llama")].last["status"]
    assert (last["deletion"]["stage"], last["deletion"]["outcome"]) == ("Released", "Clean")
    assert last.get("notOwned") == ["Pod/stranger: not owned through a ReplicaSet by a Deployment this service owns"]
    assert emu.get("v1/pods", NAMESPACE, "stranger") is not None
    assert (
        emu.get("v1/pods", NAMESPACE, "llama-0") is None and emu.get("apps/v1/deployments", NAMESPACE, "llama") is None
    )


async def test_recycling_evicts_only_the_pods_of_the_deployment_it_owns(
    cluster: tuple[ClusterEmulator, kmock.Server], start_operator: Any
) -> None:
    """1. The service's Deployment (labelled) runs one pod; another Deployment, not the service's,
    runs one pod its selector matches too. 2. Both pods outlive the maximum lifetime (no idle wait).
    Result: the service's pod is evicted (and its replacement in turn), the other's never, and the
    other's pod does not hold recycling (it is not counted against the Deployment's replicas)."""
    emu, _ = cluster
    await make_rules_service(
        emu, admin_port=9, replicas=1, recycling={"maxPodLifetimeSeconds": 1, "waitForIdle": False}
    )
    template = {"metadata": {"labels": LABELS}, "spec": {"terminationGracePeriodSeconds": 30}}
    await emu.put(
        "apps/v1/deployments",
        {
            "metadata": {"name": "other", "namespace": NAMESPACE},
            "spec": {"replicas": 1, "selector": {"matchLabels": LABELS}, "template": template},
        },
    )
    await eventually(lambda: len(ready_pods(emu)) == 2, what="two Ready pods", timeout=15)
    stranger = next(p for p in pods(emu) if p["metadata"]["name"].startswith("other-"))
    await start_operator(**FAST)
    await eventually(lambda: len(emu.evictions) >= 2, what="two evictions of the service's pods", timeout=30)
    evicted = [e.pod for e in emu.evictions]
    assert all(name.startswith("llama-") for name in evicted), evicted
    assert stranger["metadata"]["name"] not in evicted
    assert emu.get("v1/pods", NAMESPACE, stranger["metadata"]["name"]) is not None


async def test_a_scale_to_zero_rule_never_scales_a_deployment_it_does_not_own(
    cluster: tuple[ClusterEmulator, kmock.Server], start_operator: Any
) -> None:
    """1. A ModelService with a ScaleToZero rule (1 s idle) names a Deployment that is not labelled
    for it. Result: it is reported (``status.notOwned``, one NotOwned warning) and, over ten more
    passes of the daemon, never written; recycling holds with reason NotOwned rather than evicting."""
    emu, _ = cluster
    await make_rules_service(
        emu,
        admin_port=9,
        replicas=1,
        lifecycle={"rules": [{"policy": "ScaleToZero", "condition": {"idleSeconds": 1}}]},
        recycling={"maxPodLifetimeSeconds": 1, "waitForIdle": False},
    )
    emu.objects[emu.key("apps/v1/deployments", NAMESPACE, "llama")].patch({"metadata": {"labels": None}})
    await eventually(lambda: len(ready_pods(emu)) == 1, what="a Ready pod", timeout=15)
    await start_operator(**FAST)
    reason = "Deployment/llama: neither labelled for this service nor owned by it"
    await eventually(lambda: reason in _not_owned(emu), what="status.notOwned", timeout=15)
    await eventually(lambda: f"left alone: {reason}" in _warned(emu), what="the NotOwned warning", timeout=10)
    passes = _passes(emu)
    await eventually(lambda: _passes(emu) >= passes + 10, what="ten more passes", timeout=30)
    assert _writes(emu, "deployments", "pods") == []
    assert emu.get("apps/v1/deployments", NAMESPACE, "llama")["spec"]["replicas"] == 1  # type: ignore[index]
    assert _warned(emu).count(f"left alone: {reason}") == 1, "warned once, not on every pass"


def _passes(emu: ClusterEmulator) -> int:
    return sum(
        1
        for r in emu._requests
        if r.action == kmock.action.FETCH
        and r.resource is not None
        and r.resource.plural == crd.plural()
        and r.name == "llama"
    )
