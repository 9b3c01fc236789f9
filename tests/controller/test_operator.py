"""The real kopf operator, in process, against the emulated API server (see ``emulator.py``).

Settle and grace periods are seconds long and the requeue is 0.2 s, so each scenario runs in a few
seconds of wall time; every wait is a poll with a deadline, never a bare sleep.
"""

from __future__ import annotations

from typing import Any

import kmock
import pytest

from router.controller import crd
from router.decisions import deletion, durations

from .conftest import MSVC, NAMESPACE, ClusterEmulator, Operator, eventually
from .emulator import EXITS_AFTER

LABELS = {"app.kubernetes.io/instance": "llama"}
ROUTE = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "name": "llama"}


async def make_service(cluster: ClusterEmulator, *, deletion_spec: dict[str, Any] | None = None,
                       annotations: dict[str, str] | None = None, pods: int = 2, grace: int = 30,
                       exits_after: float | None = 0.5, suspend: bool = False,
                       service_labels: dict[str, str] | None = None, node: str = "gpu-1") -> None:
    await cluster.put("v1/nodes", {"metadata": {"name": node}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    deployment = await cluster.put("apps/v1/deployments", {"metadata": {"name": "llama", "namespace": NAMESPACE}})
    await cluster.put("v1/services", {"metadata": {"name": "llama", "namespace": NAMESPACE, "labels": service_labels or {}}})
    await cluster.put("gateway.networking.k8s.io/v1/httproutes", {"metadata": {"name": "llama", "namespace": NAMESPACE}})
    owner = [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama", "uid": deployment["metadata"]["uid"]}]
    for i in range(pods):
        await cluster.put("v1/pods", {
            "metadata": {"name": f"llama-{i}", "namespace": NAMESPACE, "labels": LABELS, "ownerReferences": owner,
                         "annotations": {} if exits_after is None else {EXITS_AFTER: str(exits_after)}},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": grace}})
    # An unrelated pod and a finished one: neither may hold the finalizer.
    await cluster.put("v1/pods", {"metadata": {"name": "other", "namespace": NAMESPACE, "labels": {"app": "other"}},
                                  "spec": {"nodeName": node}})
    await cluster.put("v1/pods", {"metadata": {"name": "llama-job", "namespace": NAMESPACE, "labels": LABELS},
                                  "spec": {"nodeName": node}, "status": {"phase": "Succeeded"}})
    await cluster.put(MSVC, {
        "apiVersion": f"{crd.group()}/{crd.version()}", "kind": "ModelService",
        "metadata": {"name": "llama", "namespace": NAMESPACE, "annotations": annotations or {}},
        "spec": {"podSelector": {"matchLabels": LABELS}, "route": ROUTE, "suspend": suspend,
                 "workload": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"},
                              {"apiVersion": "v1", "kind": "Service", "name": "llama"}],
                 "deletion": {"routeSettle": "1s", **(deletion_spec or {})}}})


def msvc(cluster: ClusterEmulator) -> dict[str, Any] | None:
    return cluster.get(MSVC, NAMESPACE, "llama")


def stage(cluster: ClusterEmulator) -> str | None:
    obj = msvc(cluster)
    return None if obj is None else ((obj.get("status") or {}).get("deletion") or {}).get("stage")


def exists(cluster: ClusterEmulator, path: str, name: str = "llama") -> bool:
    return cluster.get(path, NAMESPACE, name) is not None


async def delete_msvc(cluster: ClusterEmulator, server: kmock.Server) -> None:
    await eventually(lambda: "drainrouter.dev/staged-deletion" in (msvc(cluster) or {}).get("metadata", {}).get("finalizers", []),
                     what="the finalizer added by the operator")
    response = await server.client.delete(f"/apis/{MSVC.rsplit('/', 1)[0]}/namespaces/{NAMESPACE}/{crd.plural()}/llama")
    assert response.status == 200, await response.text()


def events(cluster: ClusterEmulator) -> list[tuple[str, str]]:
    out = []
    for (res, _, _), obj in cluster.objects.items():
        if res == kmock.resource("v1/events") and obj.history:
            raw = obj.last
            out.append((raw["type"], raw["reason"]))
    return out


def delete_order(cluster: ClusterEmulator) -> list[str]:
    return [f"{r.resource.plural}/{r.name}" for r in cluster._requests
            if r.action == kmock.action.DELETE and r.resource is not None and r.resource.plural != crd.plural()]


async def test_route_first_settle_then_workload_then_pods(cluster: tuple[ClusterEmulator, kmock.Server],
                                                          operator: Operator) -> None:
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
    reasons = [reason for _, reason in events(emu)]
    for reason in ("RouteRemoving", "RouteSettling", "Uninstalling", "Uninstalled", "Released"):
        assert reasons.count(reason) == 1, (reason, reasons)
