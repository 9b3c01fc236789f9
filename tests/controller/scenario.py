"""Building blocks of the operator scenarios: a ModelService with its workload, route and pods in the
emulated cluster, and what the tests read back (status, events, the API server's request log)."""

from __future__ import annotations

from typing import Any

import kmock

from drain_router.controller import crd
from drain_router.decisions.ownership import SERVICE_LABEL

from .conftest import MSVC, NAMESPACE, ClusterEmulator, eventually
from .emulator import EXITS_AFTER

LABELS = {"app.kubernetes.io/instance": "llama"}
OWNED = {SERVICE_LABEL: "llama"}
"""The label the model chart puts on everything it renders: the objects are the service's to delete."""
ROUTE = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "name": "llama"}


async def make_service(
    cluster: ClusterEmulator,
    *,
    deletion_spec: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    pods: int = 2,
    grace: int = 30,
    exits_after: float | None = 0.5,
    suspend: bool = False,
    service_labels: dict[str, str] | None = None,
    node: str = "gpu-1",
    route_object: bool = True,
    pod_selector: dict[str, Any] | None = None,
    route: dict[str, Any] | None = ROUTE,
    pool: str | None = None,
    pool_last: bool = False,
) -> None:
    """The ModelService ``llama`` with its Deployment, Service, route and pods. With ``pool``, an
    InferencePool of that name exists too, first in ``spec.workload`` (last with ``pool_last``)
    unless it is the ``route``."""
    await cluster.put(
        "v1/nodes", {"metadata": {"name": node}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    )
    deployment = await cluster.put(
        "apps/v1/deployments", {"metadata": {"name": "llama", "namespace": NAMESPACE, "labels": OWNED}}
    )
    await cluster.put(
        "v1/services",
        {
            "metadata": {
                "name": "llama",
                "namespace": NAMESPACE,
                "labels": OWNED if service_labels is None else service_labels,
            }
        },
    )
    if route_object:
        await cluster.put(
            "gateway.networking.k8s.io/v1/httproutes",
            {"metadata": {"name": "llama", "namespace": NAMESPACE, "labels": OWNED}},
        )
    workload = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"},
        {"apiVersion": "v1", "kind": "Service", "name": "llama"},
    ]
    if pool is not None:
        await cluster.put(
            "inference.networking.k8s.io/v1/inferencepools",
            {
                "metadata": {"name": pool, "namespace": NAMESPACE, "labels": OWNED},
                "spec": {"selector": {"matchLabels": LABELS}},
            },
        )
        pool_ref = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool", "name": pool}
        if route != pool_ref:
            workload.insert(len(workload) if pool_last else 0, pool_ref)
    owner = await replicaset(cluster, deployment)
    for i in range(pods):
        await cluster.put(
            "v1/pods",
            {
                "metadata": {
                    "name": f"llama-{i}",
                    "namespace": NAMESPACE,
                    "labels": LABELS,
                    "ownerReferences": owner,
                    "annotations": {} if exits_after is None else {EXITS_AFTER: str(exits_after)},
                },
                "spec": {"nodeName": node, "terminationGracePeriodSeconds": grace},
            },
        )
    # An unrelated pod and a finished one: neither may hold the finalizer.
    await cluster.put(
        "v1/pods",
        {"metadata": {"name": "other", "namespace": NAMESPACE, "labels": {"app": "other"}}, "spec": {"nodeName": node}},
    )
    await cluster.put(
        "v1/pods",
        {
            "metadata": {"name": "llama-job", "namespace": NAMESPACE, "labels": LABELS},
            "spec": {"nodeName": node},
            "status": {"phase": "Succeeded"},
        },
    )
    await cluster.put(
        MSVC,
        {
            "apiVersion": f"{crd.group()}/{crd.version()}",
            "kind": "ModelService",
            "metadata": {"name": "llama", "namespace": NAMESPACE, "annotations": annotations or {}},
            "spec": {
                "podSelector": {"matchLabels": LABELS} if pod_selector is None else pod_selector,
                "route": route,
                "suspend": suspend,
                "workload": workload,
                "deletion": {"routeSettle": "1s", **(deletion_spec or {})},
            },
        },
    )


async def replicaset(cluster: ClusterEmulator, deployment: dict[str, Any], name: str = "llama-5f7c") -> list[Any]:
    """A ReplicaSet of ``deployment`` (no template: the emulator leaves it alone) and the owner
    reference its pods carry, so that they are the service's through it."""
    rs = await cluster.put(
        "apps/v1/replicasets",
        {
            "metadata": {
                "name": name,
                "namespace": deployment["metadata"]["namespace"],
                "ownerReferences": [controller_ref("apps/v1", "Deployment", deployment)],
            }
        },
    )
    return [controller_ref("apps/v1", "ReplicaSet", rs)]


def controller_ref(api_version: str, kind: str, owner: dict[str, Any]) -> dict[str, Any]:
    meta = owner["metadata"]
    return {"apiVersion": api_version, "kind": kind, "name": meta["name"], "uid": meta["uid"], "controller": True}


def msvc(cluster: ClusterEmulator) -> dict[str, Any] | None:
    return cluster.get(MSVC, NAMESPACE, "llama")


def stage(cluster: ClusterEmulator) -> str | None:
    obj = msvc(cluster)
    return None if obj is None else ((obj.get("status") or {}).get("deletion") or {}).get("stage")


def exists(cluster: ClusterEmulator, path: str, name: str = "llama") -> bool:
    return cluster.get(path, NAMESPACE, name) is not None


async def delete_msvc(cluster: ClusterEmulator, server: kmock.Server) -> None:
    await eventually(
        lambda: "drainrouter.dev/staged-deletion" in (msvc(cluster) or {}).get("metadata", {}).get("finalizers", []),
        what="the finalizer added by the operator",
    )
    response = await server.client.delete(f"/apis/{MSVC.rsplit('/', 1)[0]}/namespaces/{NAMESPACE}/{crd.plural()}/llama")
    assert response.status == 200, await response.text()


def events(cluster: ClusterEmulator) -> list[tuple[str, str]]:
    out = []
    for (res, _, _), obj in cluster.objects.items():
        if res == kmock.resource("v1/events") and obj.history:
            raw = obj.last
            out.append((raw["type"], raw["reason"]))
    return out


def event_messages(cluster: ClusterEmulator) -> list[tuple[str, str, str]]:
    """(type, reason, message) of every event posted so far."""
    out = []
    for (res, _, _), obj in cluster.objects.items():
        if res == kmock.resource("v1/events") and obj.history:
            raw = obj.last
            out.append((raw["type"], raw["reason"], raw.get("message") or ""))
    return out


def message(cluster: ClusterEmulator) -> str:
    """``status.deletion.message`` as last written, ``""`` before any."""
    obj = msvc(cluster)
    return "" if obj is None else ((obj.get("status") or {}).get("deletion") or {}).get("message") or ""


def delete_order(cluster: ClusterEmulator) -> list[str]:
    return [
        f"{r.resource.plural}/{r.name}"
        for r in cluster._requests
        if r.action == kmock.action.DELETE and r.resource is not None and r.resource.plural != crd.plural()
    ]


def msvc_url() -> str:
    return f"/apis/{crd.group()}/{crd.version()}/namespaces/{NAMESPACE}/{crd.plural()}/llama"


def finalizer_held(cluster: ClusterEmulator) -> bool:
    obj = msvc(cluster)
    return obj is not None and "drainrouter.dev/staged-deletion" in obj["metadata"].get("finalizers", [])


def final_status(cluster: ClusterEmulator) -> dict[str, Any]:
    return cluster.objects[cluster.key(MSVC, NAMESPACE, "llama")].last["status"]["deletion"]


def passes(cluster: ClusterEmulator) -> int:
    """GETs of the ModelService itself: one per pass of the handler."""
    return sum(
        1
        for r in cluster._requests
        if r.action == kmock.action.FETCH and r.resource is not None and r.resource.plural == crd.plural()
    )
