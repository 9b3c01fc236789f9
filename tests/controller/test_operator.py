"""The real kopf operator, in process, against the emulated API server (see ``emulator.py``).

Settle and grace periods are seconds long and the requeue is 0.2 s, so each scenario runs in a few
seconds of wall time; every wait is a poll with a deadline, never a bare sleep.
"""

from __future__ import annotations

import asyncio
import time

import kmock

from drain_router.decisions import deletion, durations

from .conftest import MSVC, NAMESPACE, ClusterEmulator, Operator, eventually
from .scenario import (
    delete_msvc,
    delete_order,
    events,
    exists,
    final_status,
    finalizer_held,
    make_service,
    msvc,
    msvc_url,
    passes,
    stage,
)


async def test_route_first_settle_then_workload_then_pods(
    cluster: tuple[ClusterEmulator, kmock.Server], operator: Operator
) -> None:
    """1. ModelService with route, Deployment, Service and 2 pods (each drains 0.5 s after SIGTERM).
    2. Deleted. Result: the route is deleted first; during RouteSettling the Deployment still exists;
    after >= 1 s of settle the workload goes; the pods' wait holds the finalizer; then Released and
    the ModelService is gone. The unrelated and the Succeeded pod are never waited for."""
    emu, server = cluster
    await make_service(emu)
    await delete_msvc(emu, server)

    await eventually(lambda: stage(emu) == "RouteSettling", what="RouteSettling")
    assert not exists(emu, "gateway.networking.k8s.io/v1/httproutes")
    assert exists(emu, "apps/v1/deployments") and exists(emu, "v1/services")
    await eventually(lambda: stage(emu) in ("PodsTerminating", None), what="PodsTerminating")
    await eventually(lambda: msvc(emu) is None, what="the ModelService to be released")

    order = delete_order(emu)
    assert order[0] == "httproutes/llama"
    assert order.index("httproutes/llama") < order.index("deployments/llama") < order.index("services/llama")
    last = emu.objects[emu.key(MSVC, NAMESPACE, "llama")].last["status"]["deletion"]
    removed, uninstalled = durations.parse_time(last["routeRemovedAt"]), durations.parse_time(last["uninstalledAt"])
    assert uninstalled - removed >= 1.0, "the settle was skipped"
    assert last["stage"] == "Released" and last["outcome"] == "Clean"
    assert exists(emu, "v1/pods", "other")
    # kopf posts events from a background poster, so the last one may land after the release.
    await eventually(lambda: "Released" in [reason for _, reason in events(emu)], what="the Released event")
    reasons = [reason for _, reason in events(emu)]
    for reason in ("RouteRemoving", "RouteSettling", "Uninstalling", "Uninstalled", "Released"):
        assert reasons.count(reason) == 1, (reason, reasons)


async def test_pod_wait_holds_the_finalizer(cluster: tuple[ClusterEmulator, kmock.Server], operator: Operator) -> None:
    """1. Pods ignore SIGTERM, grace 2 s. 2. Deleted. Result: while they terminate the ModelService
    stays (finalizer held) with stage PodsTerminating and the pods listed; released only after the
    kubelet kills them at the end of their grace."""
    emu, server = cluster
    await make_service(emu, grace=2, exits_after=None, deletion_spec={"routeSettle": "0s"})
    await delete_msvc(emu, server)
    await eventually(lambda: stage(emu) == "PodsTerminating", what="PodsTerminating")
    held = msvc(emu)
    assert held is not None and finalizer_held(emu)
    report = held["status"]["deletion"]
    assert report["podsRemaining"] == 2 and report["message"] == "waiting for 2 pods"
    assert [p["name"] for p in report["pods"]] == ["llama-0", "llama-1"]
    assert held["status"]["conditions"][-1]["reason"] == "WaitingForPods"
    assert exists(emu, "v1/pods", "llama-0")  # still terminating
    # The stage and since when, for the stuck-deletion alert: the Deleting condition's transition.
    entered = durations.parse_time(held["status"]["conditions"][-1]["lastTransitionTime"])
    await eventually(lambda: stage_since(operator) == {"PodsTerminating": entered}, what="the stage gauge")
    await eventually(lambda: msvc(emu) is None, what="release after the pods' grace")
    assert not exists(emu, "v1/pods", "llama-0") and final_status(emu)["outcome"] == "Clean"
    await eventually(lambda: stage_since(operator) == {}, what="no stage series once released")


def stage_since(operator: Operator) -> dict[str, float]:
    """``drain_router_controller_deletion_stage_since_timestamp_seconds`` of llama, by stage."""
    assert operator.ctx is not None
    return {
        sample.labels["stage"]: sample.value
        for family in operator.ctx.metrics.registry.collect()
        for sample in family.samples
        if sample.name == "drain_router_controller_deletion_stage_since_timestamp_seconds"
        and sample.labels["name"] == "llama"
    }


async def test_force_delete_with_uid_precondition(
    cluster: tuple[ClusterEmulator, kmock.Server], operator: Operator
) -> None:
    """1. forceDeleteAfter 1s; pods ignore SIGTERM with a 600 s grace. 2. Deleted. Result:
    ForceDeleting, each pod deleted with grace 0 and its UID as precondition, one PodForceDeleted
    warning per pod, outcome PodsForceDeleted, released long before the grace."""
    emu, server = cluster
    await make_service(emu, grace=600, exits_after=None, deletion_spec={"routeSettle": "0s", "forceDeleteAfter": "1s"})
    uids = {name: emu.get("v1/pods", NAMESPACE, name)["metadata"]["uid"] for name in ("llama-0", "llama-1")}  # type: ignore[index]
    await delete_msvc(emu, server)
    await eventually(lambda: msvc(emu) is None, what="release after force delete")
    status = final_status(emu)
    assert status["outcome"] == "PodsForceDeleted" and status["forceDeleted"] == ["llama-0", "llama-1"]
    forced = [
        r
        for r in emu._requests
        if r.action == kmock.action.DELETE
        and r.resource == kmock.resource("v1/pods")
        and (r.data or {}).get("gracePeriodSeconds") == 0
    ]
    assert {r.name: r.data["preconditions"]["uid"] for r in forced} == uids
    await eventually(
        lambda: [reason for _, reason in events(emu)].count("PodForceDeleted") == 2,
        what="one PodForceDeleted event per pod",
    )
    reasons = [reason for _, reason in events(emu)]
    assert reasons.count("PodForceDeleted") == 2 and reasons.count("PodsForceDeleted") == 1
    assert ("Warning", "PodForceDeleted") in events(emu)


async def test_delete_precondition_answers_409(cluster: tuple[ClusterEmulator, kmock.Server]) -> None:
    """The emulator, like a real API server, refuses a delete whose UID precondition names a
    previous pod of the same name."""
    emu, server = cluster
    await emu.put("v1/pods", {"metadata": {"name": "p", "namespace": NAMESPACE}})
    body = {"gracePeriodSeconds": 0, "preconditions": {"uid": "not-this-one"}}
    response = await server.client.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/p", json=body)
    assert response.status == 409 and exists(emu, "v1/pods", "p")


async def test_restart_resumes_on_the_same_clock(
    cluster: tuple[ClusterEmulator, kmock.Server], operator: Operator
) -> None:
    """1. routeSettle 4s. 2. Deleted; RouteSettling recorded. 3. The operator stops, is down for 1 s,
    and a new one starts (no memory). Result: same startedAt, deadline and routeRemovedAt; the
    workload goes at routeRemovedAt + 4 s, not 4 s after the restart."""
    emu, server = cluster
    await make_service(emu, deletion_spec={"routeSettle": "4s"})
    await delete_msvc(emu, server)
    await eventually(lambda: stage(emu) == "RouteSettling", what="RouteSettling")
    before = dict(msvc(emu)["status"]["deletion"])  # type: ignore[index]
    await operator.stop()
    await asyncio.sleep(1.0)  # downtime: the clock runs while nobody watches
    assert stage(emu) == "RouteSettling" and exists(emu, "apps/v1/deployments")
    await operator.start()
    restarted = time.time()
    await eventually(lambda: msvc(emu) is None, what="release after the restart")
    after = final_status(emu)
    for field in ("startedAt", "deadline", "routeRemovedAt"):
        assert after[field] == before[field], field
    removed = durations.parse_time(after["routeRemovedAt"])
    uninstalled = durations.parse_time(after["uninstalledAt"])
    assert removed + 4 <= uninstalled < restarted + 4 - 0.5


async def test_orphan_skips_every_stage(cluster: tuple[ClusterEmulator, kmock.Server], operator: Operator) -> None:
    """1. deletion-policy: Orphan. 2. Deleted. Result: the ModelService goes at once; route,
    workload and pods are untouched."""
    emu, server = cluster
    await make_service(emu, annotations={deletion.ANNOTATION_DELETION_POLICY: "Orphan"})
    await delete_msvc(emu, server)
    await eventually(lambda: msvc(emu) is None, what="the ModelService to go")
    assert delete_order(emu) == []
    for path in ("gateway.networking.k8s.io/v1/httproutes", "apps/v1/deployments", "v1/services"):
        assert exists(emu, path), path
    await eventually(lambda: ("Normal", "Orphaned") in events(emu), what="the Orphaned event")


async def test_foreign_workload_skips_every_stage(
    cluster: tuple[ClusterEmulator, kmock.Server], operator: Operator
) -> None:
    """1. The Service is labelled drainrouter.dev/service=other. 2. Deleted. Result: nothing is
    deleted (not even the route), a ForeignWorkload warning, the ModelService goes."""
    emu, server = cluster
    await make_service(emu, service_labels={deletion.SERVICE_LABEL: "other"})
    await delete_msvc(emu, server)
    await eventually(lambda: msvc(emu) is None, what="the ModelService to go")
    assert delete_order(emu) == []
    assert exists(emu, "v1/services") and exists(emu, "gateway.networking.k8s.io/v1/httproutes")
    await eventually(lambda: ("Warning", "ForeignWorkload") in events(emu), what="the ForeignWorkload warning")


async def test_suspend_holds_then_resumes(cluster: tuple[ClusterEmulator, kmock.Server], operator: Operator) -> None:
    """1. spec.suspend true. 2. Deleted. Result: several passes later nothing is touched and the
    finalizer is held. 3. suspend set to false. Result: the staged teardown runs to Released."""
    emu, server = cluster
    await make_service(emu, suspend=True, deletion_spec={"routeSettle": "0s"})
    await delete_msvc(emu, server)
    seen = passes(emu)
    await eventually(lambda: passes(emu) >= seen + 3, what="three suspended passes")
    assert finalizer_held(emu) and delete_order(emu) == [] and stage(emu) is None
    response = await server.client.patch(
        msvc_url(), json={"spec": {"suspend": False}}, headers={"Content-Type": "application/merge-patch+json"}
    )
    assert response.status == 200, await response.text()
    await eventually(lambda: msvc(emu) is None, what="release after unsuspending")
    assert delete_order(emu)[0] == "httproutes/llama"


async def test_force_deleting_goes_back_to_pods_terminating(
    cluster: tuple[ClusterEmulator, kmock.Server], operator: Operator
) -> None:
    """Seed 000's arrow ForceDeleting -> PodsTerminating. 1. forceDeleteAfter 5s, pods ignore SIGTERM
    (grace 600 s); llama-0 was asked to stop 100 s ago, llama-1 goes with the workload. 2. Deleted.
    Result: llama-0 force-deleted at once; back in PodsTerminating (WaitingForPods) while llama-1
    has not been terminating for 5 s; then ForceDeleting again for llama-1; released with both
    listed and counted."""
    emu, server = cluster
    await make_service(emu, grace=600, exits_after=None, deletion_spec={"routeSettle": "0s", "forceDeleteAfter": "5s"})
    asked = time.time() - 100
    emu.objects[emu.key("v1/pods", NAMESPACE, "llama-0")].patch(
        {"metadata": {"deletionTimestamp": durations.format_time(asked + 600), "deletionGracePeriodSeconds": 600}}
    )
    await delete_msvc(emu, server)
    await eventually(
        lambda: stage(emu) == "PodsTerminating" and not exists(emu, "v1/pods", "llama-0"),
        what="back in PodsTerminating after llama-0's force delete",
    )
    assert exists(emu, "v1/pods", "llama-1")
    await eventually(lambda: msvc(emu) is None, what="release after the second force delete")
    status = final_status(emu)
    assert status["forceDeleted"] == ["llama-0", "llama-1"] and status["forceDeletedCount"] == 2
    await eventually(lambda: "Released" in [reason for _, reason in events(emu)], what="the Released event")
    reasons = [reason for _, reason in events(emu) if reason in ("PodsForceDeleted", "WaitingForPods")]
    assert reasons == ["PodsForceDeleted", "WaitingForPods", "PodsForceDeleted"], reasons
