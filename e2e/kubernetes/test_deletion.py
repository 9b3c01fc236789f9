"""The staged deletion of a ModelService on the real control plane, under OpenAI SDK streaming clients
through a gateway fed from the API server.

The controller chart (two replicas, leader election) watches every namespace. A model release
installed with ``modelService.enabled`` renders a ModelService naming its HTTPRoute, Deployment and
Service, which the chart keeps on ``helm uninstall`` (``helm.sh/resource-policy: keep``), so the
uninstall deletes the ModelService and the controller's finalizer tears the rest down in stages: the
route first, a settle, the workload (the Deployment in the foreground), the pods, then the release.
The real garbage collector removes the ReplicaSets and their pods, the EndpointSlices of the
Service. What the controller sent is read back from the API server's audit log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from drain_router.decisions import durations
from drain_router_dev.kube.control_plane import NODE, Cluster
from e2e.kubernetes import models
from e2e.kubernetes.audit import AuditLog, Call, service_account
from e2e.kubernetes.conftest import CONTROLLER_USER
from e2e.kubernetes.gateway import Gateway
from e2e.kubernetes.kube import MODEL_CHART, Helm, Json, Kube
from e2e.kubernetes.teardown import (
    FINALIZER,
    SERVICE_LABEL,
    DeletionWatch,
    StampedLoad,
    Stream,
    drain_complete,
    has_finalizer,
    release_leftovers,
    routes,
)
from e2e.real_engine import Outcome

NAMESPACE = "team-a"
OTHER_NAMESPACE = "team-b"
CLIENTS = 4
MAX_TOKENS = models.CHUNKS
#: The gateway's propagation delay, and the settle the ModelService waits after its route went:
#: longer, as the docs ask, so the gateway has stopped sending before the workload goes.
GATEWAY_DELAY_SECS = 1.0
SETTLE_SECS = 3
#: The routers' drain after SIGTERM: longer than the controller's requeue (5 s), as the chart's
#: default (30 s) is, so the pods are still terminating on the pass after the workload's delete and
#: PodsTerminating is a stage the status shows rather than one passed through within a pass.
DRAIN_SECS = 8
GARBAGE_COLLECTOR = service_account("kube-system", "generic-garbage-collector")
KUBELET = f"system:node:{NODE}"
#: The controller's own objects: its ModelServices (status, finalizer, kopf's annotations), events,
#: its Lease.
CONTROLLER_OWN = frozenset({"modelservices", "events", "leases"})
STAGES = ["RouteRemoving", "RouteSettling", "Uninstalling", "PodsTerminating", "Released"]
pytestmark = pytest.mark.timeout(600, func_only=True)


def staged_values(namespace: str, release: str) -> dict[str, Any]:
    """A model release with its ModelService: a short settle, no force delete."""
    deletion = {"routeSettle": f"{SETTLE_SECS}s", "maxWait": "5m", "forceDeleteAfter": None}
    values = {"modelService": {"enabled": True, "deletion": deletion}}
    return models.fake_model_values(namespace, release, drain_secs=DRAIN_SECS, extra=values)


def selector(release: str) -> str:
    return f"app.kubernetes.io/instance={release}"


async def _async(value: Any) -> Any:
    return value


async def _gone(kube: Kube, kind: str, namespace: str, release: str) -> bool:
    return not await kube.list(kind, namespace, selector(release))


async def _deleting(kube: Kube, kind: str, namespace: str, name: str) -> Json | None:
    """The object, once it is marked for deletion."""
    found = await kube.get(kind, namespace, name)
    return found if found is not None and found["metadata"].get("deletionTimestamp") else None


async def serving(kube: Kube, gateway: Gateway, host: str, namespace: str, release: str) -> bool:
    """The gateway sends ``host`` to every Ready pod of the release."""
    pods = await kube.ready_pods(namespace, selector(release))
    return len(pods) == 2 and {a for a, _ in gateway.servers(host)} == {p["status"]["podIP"] for p in pods}


def snapshot(obj: Json | None) -> tuple[str, str, str] | None:
    """What proves an object untouched: the same uid and resourceVersion, and not being deleted."""
    if obj is None:
        return None
    meta = obj["metadata"]
    return meta["uid"], meta["resourceVersion"], meta.get("deletionTimestamp", "")


def deletes_of(calls: list[Call], resource: str, name: str) -> list[Call]:
    """The accepted deletes of one object among ``calls``, at least one."""
    found = [c for c in calls if c.verb == "delete" and c.resource == resource and c.name == name and c.code < 300]
    assert found, f"no delete of {resource}/{name} in {[str(c) for c in calls]}"
    return found


def delete_of(calls: list[Call], resource: str, name: str) -> Call:
    """The one accepted delete of an object among ``calls``."""
    found = deletes_of(calls, resource, name)
    assert len(found) == 1, [str(c) for c in found]
    return found[0]


def foreign_writes(calls: list[Call]) -> list[str]:
    """The controller's writes to anything but its own objects."""
    return [str(c) for c in calls if c.resource not in CONTROLLER_OWN]


def lost(streams: list[Stream]) -> list[Stream]:
    return [s for s in streams if s.outcome is Outcome.TRUNCATED]


async def start_load(gateway: Gateway, host: str) -> StampedLoad:
    load = StampedLoad(gateway.url, CLIENTS, MAX_TOKENS, headers={"Host": host})
    await load.start()
    return load


async def objects(kube: Kube, namespace: str, release: str, name: str) -> dict[str, tuple[str, str, str] | None]:
    """``Kind/name`` -> :func:`snapshot` of a release's route, Deployment, Service, ModelService,
    ReplicaSets and pods."""
    found = {
        f"{k}/{name}": snapshot(await kube.get(k, namespace, name)) for k in ("HTTPRoute", "Deployment", "Service")
    }
    found[f"ModelService/{name}"] = snapshot(await kube.get("ModelService", namespace, name))
    for kind in ("ReplicaSet", "Pod"):
        for obj in await kube.list(kind, namespace, selector(release)):
            found[f"{kind}/{obj['metadata']['name']}"] = snapshot(obj)
    return found


def model_service(name: str, *, route: str, workload: list[tuple[str, str, str]], pod_selector: Json) -> Json:
    """A ModelService written by hand: ``route`` an HTTPRoute, ``workload`` (apiVersion, kind, name)
    triples; no settle, a 15 s budget, and any pod it waits for force-deleted at once."""
    return {
        "apiVersion": "drainrouter.dev/v1alpha1",
        "kind": "ModelService",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "podSelector": pod_selector,
            "route": {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "name": route},
            "workload": [{"apiVersion": a, "kind": k, "name": n} for a, k, n in workload],
            "deletion": {"routeSettle": "0s", "maxWait": "15s", "forceDeleteAfter": "0s"},
        },
    }


async def events_for(kube: Kube, namespace: str, name: str) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the events about the object ``name``."""
    _, found = await kube.api.request(
        "GET", f"/api/v1/namespaces/{namespace}/events?fieldSelector=involvedObject.name%3D{name}"
    )
    return [(e.get("type", ""), e.get("reason", ""), e.get("message", "")) for e in found.get("items", [])]


async def test_helm_uninstall_removes_the_route_first_and_loses_no_stream(
    kube: Kube, helm: Helm, installed: Cluster, tmp_path: Path, haproxy_bin: str, report: list[str]
) -> None:
    """1. A release with its ModelService serves streaming clients through the gateway; the
    controller's finalizer is on the ModelService. 2. ``helm uninstall``. Result: the HTTPRoute is
    deleted while the Deployment stands untouched; the gateway answers new requests 503 while the
    streams in flight finish; the settle later the Deployment is deleted in the foreground and the
    Service; the garbage collector deletes the ReplicaSet and its pods, which drain and go; then the
    finalizer is released. Stages RouteRemoving, RouteSettling, Uninstalling, PodsTerminating,
    Released, outcome Clean; not one stream that had started is cut."""
    release = "kbstage"
    name = f"{release}-drain-router"
    host = models.hostname(NAMESPACE, release)
    helm.install(release, MODEL_CHART, NAMESPACE, staged_values(NAMESPACE, release))
    gateway = Gateway(kube.api, haproxy_bin, tmp_path, delay_secs=GATEWAY_DELAY_SECS)
    await gateway.start()
    watch = DeletionWatch(kube.api, NAMESPACE, name)
    load: StampedLoad | None = None
    try:
        await kube.wait("the controller's finalizer on the ModelService", lambda: has_finalizer(kube, NAMESPACE, name))
        await kube.wait("the gateway serving both pods", lambda: serving(kube, gateway, host, NAMESPACE, release))
        load = await start_load(gateway, host)
        await kube.wait("streams completed", lambda: _async(load.count(Outcome.COMPLETED) >= CLIENTS))
        replicasets = [r["metadata"]["name"] for r in await kube.list("ReplicaSet", NAMESPACE, selector(release))]
        pods = [p["metadata"]["name"] for p in await kube.list("Pod", NAMESPACE, selector(release))]
        await watch.start()
        log = AuditLog(installed.audit_log)

        helm.uninstall(release, NAMESPACE, wait=False)

        # The route goes first: gone while the Deployment stands, not even marked for deletion.
        await kube.wait_gone("HTTPRoute", NAMESPACE, name, timeout=60)
        deployment = await kube.get("Deployment", NAMESPACE, name)
        service = await kube.get("Service", NAMESPACE, name)
        msvc = await kube.get("ModelService", NAMESPACE, name)
        assert deployment is not None and not deployment["metadata"].get("deletionTimestamp"), deployment
        assert service is not None and not service["metadata"].get("deletionTimestamp")
        assert msvc is not None and msvc["metadata"].get("deletionTimestamp")
        assert FINALIZER in msvc["metadata"]["finalizers"]
        assert msvc["status"]["deletion"]["stage"] in ("RouteRemoving", "RouteSettling"), msvc["status"]
        # The gateway stops routing the host; the pods are still there for the streams in flight.
        await kube.wait("the gateway dropping the route", lambda: _async(not routes(gateway, host)))
        assert len(await kube.list("Pod", NAMESPACE, selector(release))) == 2
        # The Deployment goes in the foreground: it stays, terminating, while its pods do.
        found = await kube.wait("the Deployment deleted", lambda: _deleting(kube, "Deployment", NAMESPACE, name))
        assert "foregroundDeletion" in found["metadata"].get("finalizers", []), found["metadata"]
        await kube.wait_gone("ModelService", NAMESPACE, name, timeout=120)
        for kind in ("Deployment", "ReplicaSet", "Pod", "Service", "EndpointSlice"):
            await kube.wait(f"every {kind} of the release gone", lambda k=kind: _gone(kube, k, NAMESPACE, release))
        await load.stop()
        await watch.stop()
        calls = log.calls()
    finally:
        await gateway.stop()
        if load is not None:
            await load.stop()
        await watch.stop()
        helm.uninstall(release, NAMESPACE, wait=False)
        await release_leftovers(kube, NAMESPACE, {"ModelService": [name], "Deployment": [name], "Service": [name]})

    # The stages, as the API server showed them, and the outcome.
    assert watch.stages() == STAGES, watch.seen
    assert watch.last is not None and watch.last.outcome == "Clean"

    # What the controller sent, in order: the route, the settle, then the workload.
    ours = [c for c in calls if c.user == CONTROLLER_USER and c.write and c.namespace == NAMESPACE]
    assert foreign_writes(ours) == [
        f"{CONTROLLER_USER} delete httproutes {NAMESPACE}/{name} -> 200",
        f"{CONTROLLER_USER} delete deployments {NAMESPACE}/{name} -> 200",
        f"{CONTROLLER_USER} delete services {NAMESPACE}/{name} -> 200",
    ]
    route_delete = delete_of(ours, "httproutes", name)
    deployment_delete = delete_of(ours, "deployments", name)
    # The settle is counted from when the controller saw the route gone (routeRemovedAt).
    removed_at = durations.parse_time(watch.last.deletion["routeRemovedAt"])
    assert route_delete.answered <= removed_at <= deployment_delete.received - SETTLE_SECS
    # The garbage collector, not the controller, deleted the ReplicaSet and the pods (after the
    # Deployment's delete), and the pods went when their kubelet confirmed them, before the release.
    collected = [c for c in calls if c.user == GARBAGE_COLLECTOR and c.verb == "delete"]
    for resource, names in (("replicasets", replicasets), ("pods", pods)):
        for gone in names:
            assert deletes_of(collected, resource, gone)[0].received >= deployment_delete.answered
    confirmed = [c for c in calls if c.user == KUBELET and c.verb == "delete" and c.resource == "pods"]
    assert {c.name for c in confirmed} >= set(pods)
    # Each pod's router drained (the window, then nothing left in flight) and exited cleanly.
    drained = {pod: drain_complete(installed.root, NAMESPACE, pod) for pod in pods}
    assert all(d is not None and d["exit_code"] == 0 and d["inflight"] == 0 for d in drained.values()), drained
    release_write = max((c for c in ours if c.resource == "modelservices" and c.code == 200), key=lambda c: c.received)
    assert release_write.received >= max(c.answered for c in confirmed if c.name in pods)

    # The clients: nothing that had started was cut; the streams in flight when the route was
    # deleted completed; new requests got the gateway's 503, and only after the route was deleted.
    streams = load.streams
    in_flight = [s for s in streams if s.spans(route_delete.received)]
    refused = [s for s in streams if s.outcome is Outcome.REFUSED]
    report.append(
        f"{len(streams)} streams: {load.count(Outcome.COMPLETED)} completed, {len(refused)} refused by the "
        f"gateway after the route went, {len(lost(streams))} cut; {len(in_flight)} in flight at the route's delete; "
        f"workload deleted {deployment_delete.received - route_delete.answered:.1f} s after the route "
        f"({deployment_delete.received - removed_at:.1f} s after it was seen gone); stages {' > '.join(watch.stages())}"
    )
    assert not lost(streams), lost(streams)[:5]
    assert in_flight and all(s.outcome is Outcome.COMPLETED for s in in_flight)
    assert refused and all(s.started >= route_delete.received and "503" in s.record.detail for s in refused), [
        s for s in refused if s.started < route_delete.received or "503" not in s.record.detail
    ][:3]


async def test_the_teardown_writes_nothing_the_service_does_not_own(
    kube: Kube, helm: Helm, installed: Cluster, tmp_path: Path, haproxy_bin: str, report: list[str]
) -> None:
    """1. A release without a ModelService serves streaming clients; its HTTPRoute, Deployment and
    Service carry no ownership mark. A ModelService written by hand names them (and selects their
    pods, force-delete-after 0 s) and one Service that is its own by the label. 2. The ModelService
    is deleted. Result: the route is waited for as a stuck one until the 15 s budget ends
    (RouteStuck), the Service it owns is deleted, nothing else is written: the release's route,
    Deployment, Service, ReplicaSet and pods keep their uid and resourceVersion, the controller sent
    no write to any of them, ``status.notOwned`` names each, and the clients lose nothing."""
    release = "kbown"
    name = f"{release}-drain-router"
    intruder = f"{release}-intruder"
    mine = f"{intruder}-mine"
    host = models.hostname(NAMESPACE, release)
    helm.install(release, MODEL_CHART, NAMESPACE, models.fake_model_values(NAMESPACE, release))
    gateway = Gateway(kube.api, haproxy_bin, tmp_path, delay_secs=GATEWAY_DELAY_SECS)
    await gateway.start()
    watch = DeletionWatch(kube.api, NAMESPACE, intruder)
    load: StampedLoad | None = None
    try:
        deployment = await kube.get("Deployment", NAMESPACE, name)
        assert deployment is not None and SERVICE_LABEL not in deployment["metadata"].get("labels", {})
        await kube.apply({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": mine, "namespace": NAMESPACE, "labels": {SERVICE_LABEL: intruder}},
            "spec": {"ports": [{"port": 80}], "selector": {"app": mine}},
        })  # fmt: skip
        workload = [("apps/v1", "Deployment", name), ("v1", "Service", name), ("v1", "Service", mine)]
        pod_selector = deployment["spec"]["selector"]
        await kube.apply(model_service(intruder, route=name, workload=workload, pod_selector=pod_selector))
        await kube.wait("the finalizer on the ModelService", lambda: has_finalizer(kube, NAMESPACE, intruder))
        await kube.wait("the gateway serving both pods", lambda: serving(kube, gateway, host, NAMESPACE, release))
        load = await start_load(gateway, host)
        await kube.wait("streams completed", lambda: _async(load.count(Outcome.COMPLETED) >= CLIENTS))
        before = await objects(kube, NAMESPACE, release, name)
        pods = [key.removeprefix("Pod/") for key in before if key.startswith("Pod/")]
        await watch.start()
        log = AuditLog(installed.audit_log)

        await kube.delete("ModelService", NAMESPACE, intruder)

        await kube.wait_gone("ModelService", NAMESPACE, intruder, timeout=90)
        await kube.wait_gone("Service", NAMESPACE, mine)
        # Untouched, read before anything else can fail: the release's objects and the controller's
        # writes (only the Service it owns).
        after = await objects(kube, NAMESPACE, release, name)
        calls = log.calls()
        ours = [c for c in calls if c.user == CONTROLLER_USER and c.write]
        assert len(pods) == 2 and after == before, (before, after)
        assert foreign_writes(ours) == [f"{CONTROLLER_USER} delete services {NAMESPACE}/{mine} -> 200"]
        released = watch.gone_at or 0.0
        await kube.wait(
            "streams completed after the release",
            lambda: _async(load.count(Outcome.COMPLETED, since=released) >= CLIENTS),
        )
        await load.stop()
        await watch.stop()
        warned = [m for t, r, m in await events_for(kube, NAMESPACE, intruder) if (t, r) == ("Warning", "NotOwned")]
    finally:
        await gateway.stop()
        if load is not None:
            await load.stop()
        await watch.stop()
        await release_leftovers(kube, NAMESPACE, {"ModelService": [intruder], "Service": [mine]})
        helm.uninstall(release, NAMESPACE)

    started = delete_of([c for c in calls if c.resource == "modelservices"], "modelservices", intruder)
    assert delete_of(ours, "services", mine).received >= started.received + 15  # the route held it
    stages = watch.stages()
    assert stages[0] == "RouteRemoving" and stages[-1] == "Released" and "RouteSettling" not in stages, stages
    assert watch.last is not None and watch.last.outcome == "RouteStuck"
    neither = "neither labelled for this service nor owned by it"
    through = "not owned through a ReplicaSet by a Deployment this service owns"
    expected = {f"{kind}/{name}: {neither}" for kind in ("HTTPRoute", "Deployment", "Service")}
    expected |= {f"Pod/{pod}: {through}" for pod in pods}
    assert set(watch.last.not_owned) == expected, watch.last.not_owned
    assert {m.removeprefix("left alone: ") for m in warned} == expected, warned
    streams = load.streams
    report.append(
        f"not owned, left alone: {len(expected)} objects, 0 controller writes to them; "
        f"{len(streams)} streams, {load.count(Outcome.COMPLETED)} completed; stages {' > '.join(stages)}"
    )
    assert streams and all(s.outcome is Outcome.COMPLETED for s in streams), [
        s for s in streams if s.outcome is not Outcome.COMPLETED
    ][:5]


async def test_a_service_naming_another_services_objects_is_released_without_a_write(
    kube: Kube, helm: Helm, installed: Cluster, report: list[str]
) -> None:
    """1. A release with its own ModelService: its route, Deployment and Service carry the label of
    that ModelService. A second ModelService, written by hand, names the same objects. 2. The second
    is deleted. Result: the objects are another service's (ForeignWorkload): the finalizer is
    dropped at once without a stage, and the controller writes nothing but that ModelService; the
    release's objects and its own ModelService are as they were."""
    release = "kbfor"
    name = f"{release}-drain-router"
    intruder = f"{release}-intruder"
    helm.install(release, MODEL_CHART, NAMESPACE, staged_values(NAMESPACE, release))
    watch = DeletionWatch(kube.api, NAMESPACE, intruder)
    try:
        await kube.wait("the release's ModelService finalizer", lambda: has_finalizer(kube, NAMESPACE, name))
        deployment = await kube.get("Deployment", NAMESPACE, name)
        assert deployment is not None and deployment["metadata"]["labels"][SERVICE_LABEL] == name
        workload = [("apps/v1", "Deployment", name), ("v1", "Service", name)]
        pod_selector = deployment["spec"]["selector"]
        await kube.apply(model_service(intruder, route=name, workload=workload, pod_selector=pod_selector))
        await kube.wait("the finalizer on the second one", lambda: has_finalizer(kube, NAMESPACE, intruder))
        before = await objects(kube, NAMESPACE, release, name)
        await watch.start()
        log = AuditLog(installed.audit_log)

        await kube.delete("ModelService", NAMESPACE, intruder)

        await kube.wait_gone("ModelService", NAMESPACE, intruder, timeout=30)
        await watch.stop()
        after = await objects(kube, NAMESPACE, release, name)
        calls = log.calls()
        warned = [
            m for t, r, m in await events_for(kube, NAMESPACE, intruder) if (t, r) == ("Warning", "ForeignWorkload")
        ]
    finally:
        await watch.stop()
        await release_leftovers(kube, NAMESPACE, {"ModelService": [intruder]})
        helm.uninstall(release, NAMESPACE)

    assert after == before, (before, after)
    ours = [c for c in calls if c.user == CONTROLLER_USER and c.write]
    assert foreign_writes(ours) == []
    assert {c.name for c in ours if c.resource == "modelservices"} == {intruder}, [str(c) for c in ours]
    assert watch.stages() == [], watch.seen
    assert len(warned) == 1 and f"{SERVICE_LABEL}={name}" in warned[0], warned
    report.append(f"another service's objects: {len(after)} left as they were, released in one pass: {warned[0]}")


async def test_deleting_one_of_two_services_leaves_the_other_serving(
    kube: Kube, helm: Helm, installed: Cluster, tmp_path: Path, haproxy_bin: str, report: list[str]
) -> None:
    """1. The same release in team-a and team-b (the same object names in both), each with its
    ModelService, each serving streaming clients through one gateway. 2. team-a's is uninstalled.
    Result: team-a's teardown runs (route, workload, pods, release; no stream cut), while team-b's
    clients never see an error, its objects keep their resourceVersions and the controller sends
    nothing to team-b."""
    release = "kbtwo"
    name = f"{release}-drain-router"
    spaces = (NAMESPACE, OTHER_NAMESPACE)
    hosts = {ns: models.hostname(ns, release) for ns in spaces}
    for ns in spaces:
        helm.install(release, MODEL_CHART, ns, staged_values(ns, release))
    gateway = Gateway(kube.api, haproxy_bin, tmp_path, delay_secs=GATEWAY_DELAY_SECS)
    await gateway.start()
    loads: dict[str, StampedLoad] = {}
    try:
        for ns in spaces:
            await kube.wait(f"the finalizer in {ns}", lambda ns=ns: has_finalizer(kube, ns, name))
            await kube.wait(f"the gateway serving {ns}", lambda ns=ns: serving(kube, gateway, hosts[ns], ns, release))
            loads[ns] = await start_load(gateway, hosts[ns])
        for ns in spaces:
            await kube.wait(
                f"streams completed in {ns}", lambda ns=ns: _async(loads[ns].count(Outcome.COMPLETED) >= CLIENTS)
            )
        before = await objects(kube, OTHER_NAMESPACE, release, name)
        log = AuditLog(installed.audit_log)

        helm.uninstall(release, NAMESPACE, wait=False)

        await kube.wait_gone("ModelService", NAMESPACE, name, timeout=120)
        for kind in ("Deployment", "Pod", "Service"):
            await kube.wait(f"every {kind} of team-a's release gone", lambda k=kind: _gone(kube, k, NAMESPACE, release))
        torn_down = max(c.answered for c in log.calls() if c.resource)
        other = loads[OTHER_NAMESPACE]
        await kube.wait(
            "team-b's streams completed after the teardown",
            lambda: _async(other.count(Outcome.COMPLETED, since=torn_down) >= CLIENTS),
        )
        for load in loads.values():
            await load.stop()
        after = await objects(kube, OTHER_NAMESPACE, release, name)
        calls = log.calls()
    finally:
        await gateway.stop()
        for load in loads.values():
            await load.stop()
        helm.uninstall(release, NAMESPACE, wait=False)
        await release_leftovers(kube, NAMESPACE, {"ModelService": [name], "Deployment": [name], "Service": [name]})
        helm.uninstall(release, OTHER_NAMESPACE)

    assert after == before and after[f"ModelService/{name}"] is not None, (before, after)
    ours = [c for c in calls if c.user == CONTROLLER_USER and c.write]
    assert [str(c) for c in ours if c.namespace == OTHER_NAMESPACE] == []
    assert foreign_writes(ours) == [
        f"{CONTROLLER_USER} delete {resource} {NAMESPACE}/{name} -> 200"
        for resource in ("httproutes", "deployments", "services")
    ]
    kept, gone = loads[OTHER_NAMESPACE].streams, loads[NAMESPACE].streams
    report.append(
        f"team-b kept serving: {len(kept)} streams, {sum(s.outcome is Outcome.COMPLETED for s in kept)} completed; "
        f"team-a torn down: {len(gone)} streams, {len(lost(gone))} cut"
    )
    assert kept and all(s.outcome is Outcome.COMPLETED for s in kept), [
        s for s in kept if s.outcome is not Outcome.COMPLETED
    ][:5]
    assert not lost(gone), lost(gone)[:5]
