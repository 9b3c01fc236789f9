"""Building blocks of the recycling and lifecycle operator tests: a ModelService over a Deployment the
emulator's Deployment controller keeps at ``spec.replicas``, its pods' routers stood in for by
:mod:`fake_routers`, and what the tests read back."""

from __future__ import annotations

from typing import Any

import kmock

from drain_router.controller import crd

from .conftest import MSVC, NAMESPACE, ClusterEmulator
from .emulator import EXITS_AFTER
from .scenario import OWNED

LABELS = {"app.kubernetes.io/instance": "llama"}
ROUTE = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "name": "llama"}


async def make_service(
    cluster: ClusterEmulator,
    *,
    admin_port: int,
    replicas: int = 1,
    recycling: dict[str, Any] | None = None,
    lifecycle: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
    exits_after: float | None = 0.2,
    grace: int = 30,
    admit: bool = True,
    router_port: int | None = None,
) -> None:
    """``exits_after``: seconds after its deletion that a simulated container exits; ``None`` for
    process-backed pods, whose real router decides. ``admit=False``: the ModelService was stored
    before the CRD carried today's validation (so rules it refuses can reach the controller)."""
    await cluster.put(
        "apps/v1/deployments",
        {
            "metadata": {"name": "llama", "namespace": NAMESPACE, "labels": OWNED},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": LABELS},
                "template": {
                    "metadata": {
                        "labels": LABELS,
                        "annotations": {} if exits_after is None else {EXITS_AFTER: str(exits_after)},
                    },
                    "spec": {"terminationGracePeriodSeconds": grace},
                },
            },
        },
    )
    await cluster.put(
        "gateway.networking.k8s.io/v1/httproutes",
        {"metadata": {"name": "llama", "namespace": NAMESPACE, "labels": OWNED}},
    )
    spec: dict[str, Any] = {
        "podSelector": {"matchLabels": LABELS},
        "route": ROUTE,
        "router": {"adminPort": admin_port, **({} if router_port is None else {"port": router_port})},
        "workload": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"}],
        "deletion": {"routeSettle": "0s"},
    }
    if recycling is not None:
        spec["recycling"] = recycling
    if lifecycle is not None:
        spec["lifecycle"] = lifecycle
    body: dict[str, Any] = {
        "apiVersion": f"{crd.group()}/{crd.version()}",
        "kind": "ModelService",
        "metadata": {"name": "llama", "namespace": NAMESPACE},
        "spec": spec,
    }
    if status is not None:
        body["status"] = status
    await cluster.put(MSVC, body, admit=admit)


def pods(cluster: ClusterEmulator, *, alive_only: bool = True) -> list[dict[str, Any]]:
    """The service's pods, oldest first, Pending ones last (terminating ones too unless ``alive_only``)."""
    out = [
        o.raw
        for k, o in cluster.objects.items()
        if k[0] == kmock.resource("v1/pods")
        and not o.deleted
        and (not alive_only or not o.raw["metadata"].get("deletionTimestamp"))
    ]
    # A Pending pod has no startTime yet: it sorts after every started one.
    return sorted(out, key=lambda p: (p["status"].get("startTime") or "~", p["metadata"]["name"]))


def ready_pods(cluster: ClusterEmulator) -> list[dict[str, Any]]:
    return [
        p
        for p in pods(cluster)
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in p["status"].get("conditions") or ())
    ]


def deployment(cluster: ClusterEmulator) -> dict[str, Any]:
    obj = cluster.get("apps/v1/deployments", NAMESPACE, "llama")
    assert obj is not None
    return obj


def status(cluster: ClusterEmulator) -> dict[str, Any]:
    obj = cluster.get(MSVC, NAMESPACE, "llama")
    return {} if obj is None else obj.get("status") or {}


def condition(cluster: ClusterEmulator, type_: str) -> dict[str, Any] | None:
    return next((c for c in status(cluster).get("conditions") or () if c.get("type") == type_), None)


def held(cluster: ClusterEmulator) -> dict[str, Any] | None:
    return (status(cluster).get("recycling") or {}).get("held")


def gauge(op: Any) -> float:
    return float(
        op.ctx.metrics.registry.get_sample_value(
            "drain_router_controller_recycle_held_pods", {"namespace": NAMESPACE, "name": "llama"}
        )
        or 0.0
    )


def held_since(op: Any) -> float | None:
    value = op.ctx.metrics.registry.get_sample_value(
        "drain_router_controller_recycle_held_since_timestamp_seconds", {"namespace": NAMESPACE, "name": "llama"}
    )
    return None if value is None else float(value)


def counter(op: Any, name: str, labels: dict[str, str] | None = None) -> float:
    return float(op.ctx.metrics.registry.get_sample_value(name, labels or {}) or 0.0)


def patches_to(cluster: ClusterEmulator, plural: str) -> list[Any]:
    return [
        r
        for r in cluster._requests
        if r.action == kmock.action.UPDATE and r.resource is not None and r.resource.plural == plural
    ]


async def patch_deployment(server: kmock.Server, body: dict[str, Any]) -> None:
    """A person's (or a test's) merge patch of the Deployment ``llama``: scale it, pause it, roll it."""
    response = await server.client.patch(
        f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/llama",
        json=body,
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status == 200, await response.text()
