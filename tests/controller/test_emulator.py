"""The emulator's additions for recycling and lifecycle rules behave like a real API server: the
Eviction subresource with PodDisruptionBudgets, the Deployment controller, the ``resourceVersion``
precondition on patches, and RBAC. Each is checked over HTTP, as the controller sees it."""

from __future__ import annotations

from typing import Any

import kmock
import pytest

from .conftest import NAMESPACE, eventually
from .emulator import ClusterEmulator

LABELS = {"app": "llama"}
CONTROLLER = {"User-Agent": "kopf/1.45.2"}
"""What the controller's own calls look like; the tests' kmock client is exempt from RBAC mode."""


async def _pod(
    emu: ClusterEmulator, name: str, *, ready: bool = True, phase: str = "Running", grace: int = 30
) -> dict[str, Any]:
    return await emu.put(
        "v1/pods",
        {
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": LABELS},
            "spec": {"terminationGracePeriodSeconds": grace},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
        },
    )


async def _pdb(emu: ClusterEmulator, name: str = "llama", **spec: Any) -> None:
    await emu.put(
        "policy/v1/poddisruptionbudgets",
        {"metadata": {"name": name, "namespace": NAMESPACE}, "spec": {"selector": {"matchLabels": LABELS}, **spec}},
    )


async def _evict(
    server: kmock.Server, name: str, uid: str | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    body: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": NAMESPACE},
    }
    if uid is not None:
        body["deleteOptions"] = {"preconditions": {"uid": uid}}
    response = await server.client.post(
        f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/eviction", json=body, headers=headers
    )
    return response.status, await response.json()


def _terminating(emu: ClusterEmulator, name: str) -> bool:
    pod = emu.get("v1/pods", NAMESPACE, name)
    return pod is None or bool(pod["metadata"].get("deletionTimestamp"))


async def test_eviction_without_a_budget_is_a_graceful_delete(cluster: Any) -> None:
    emu, server = cluster
    pod = await _pod(emu, "a")
    code, body = await _evict(server, "a", pod["metadata"]["uid"])
    assert (code, body["status"]) == (201, "Success")
    stored = emu.get("v1/pods", NAMESPACE, "a")
    assert stored is not None and stored["metadata"]["deletionGracePeriodSeconds"] == 30  # graceful, not gone


async def test_eviction_of_a_missing_pod_is_404(cluster: Any) -> None:
    code, body = await _evict(cluster[1], "nobody")
    assert (code, body["reason"]) == (404, "NotFound")


async def test_eviction_with_another_uid_is_409_and_leaves_the_pod(cluster: Any) -> None:
    emu, server = cluster
    await _pod(emu, "a")
    code, body = await _evict(server, "a", "not-its-uid")
    assert (code, body["reason"]) == (409, "Conflict")
    assert not _terminating(emu, "a")


@pytest.mark.parametrize("kind", ["terminal", "terminating"])
async def test_terminal_or_terminating_pods_skip_the_budget(cluster: Any, kind: str) -> None:
    emu, server = cluster
    await _pdb(emu, maxUnavailable=0)
    pod = await _pod(emu, "a", phase="Succeeded" if kind == "terminal" else "Running")
    if kind == "terminating":
        response = await server.client.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/a", json={})
        assert response.status == 200
    code, _ = await _evict(server, "a", pod["metadata"]["uid"])
    assert code == 201 and _terminating(emu, "a")


async def test_two_budgets_are_a_500(cluster: Any) -> None:
    emu, server = cluster
    await _pdb(emu, "one", maxUnavailable=1)
    await _pdb(emu, "two", maxUnavailable=1)
    await _pod(emu, "a")
    code, body = await _evict(server, "a")
    assert code == 500 and body["message"].startswith("This pod has more than one PodDisruptionBudget")
    assert not _terminating(emu, "a")


async def test_budget_at_zero_is_429_with_the_disruption_budget_cause(cluster: Any) -> None:
    emu, server = cluster
    await _pdb(emu, maxUnavailable=0)
    await _pod(emu, "a")
    await _pod(emu, "b")
    code, body = await _evict(server, "a")
    assert (code, body["reason"], body["details"]["causes"][0]["reason"]) == (
        429,
        "TooManyRequests",
        "DisruptionBudget",
    )
    assert "needs 2 healthy pods and has 2 currently" in body["details"]["causes"][0]["message"]
    assert not _terminating(emu, "a")


async def test_budget_not_yet_observed_is_429(cluster: Any) -> None:
    emu, server = cluster
    await _pdb(emu, maxUnavailable=1)
    await _pod(emu, "a")
    await _pod(emu, "b")
    emu.pdb_controller_paused = True
    await emu.put("policy/v1/poddisruptionbudgets", {"metadata": {"name": "unused", "namespace": "other"}})
    key = emu.key("policy/v1/poddisruptionbudgets", NAMESPACE, "llama")
    emu.objects[key].patch(
        {"metadata": {"generation": 2}, "status": {"observedGeneration": 1, "disruptionsAllowed": 1}}
    )
    code, body = await _evict(server, "a")
    assert code == 429 and "still being processed" in body["details"]["causes"][0]["message"]


async def test_budget_allows_one_then_refuses_the_next(cluster: Any) -> None:
    """maxUnavailable 1 over two Ready pods: one eviction passes; the evicted pod is no longer
    healthy, so the second is refused until it is replaced."""
    emu, server = cluster
    await _pdb(emu, maxUnavailable=1)
    await _pod(emu, "a")
    await _pod(emu, "b")
    assert (await _evict(server, "a"))[0] == 201
    assert (await _evict(server, "b"))[0] == 429
    pdb = emu.get("policy/v1/poddisruptionbudgets", NAMESPACE, "llama")
    assert pdb is not None and pdb["status"]["currentHealthy"] == 1 and pdb["status"]["disruptionsAllowed"] == 0


async def test_min_available_percent(cluster: Any) -> None:
    emu, _ = cluster
    for name in "abcd":
        await _pod(emu, name)
    await _pdb(emu, minAvailable="50%")
    pdb = emu.get("policy/v1/poddisruptionbudgets", NAMESPACE, "llama")
    assert pdb is not None
    assert emu.pdb_status(pdb) == {
        "observedGeneration": 1,
        "currentHealthy": 4,
        "desiredHealthy": 2,
        "expectedPods": 4,
        "disruptionsAllowed": 2,
    }


@pytest.mark.parametrize(("policy", "code"), [("AlwaysAllow", 201), ("IfHealthyBudget", 429)])
async def test_unready_pod_with_always_allow(cluster: Any, policy: str, code: int) -> None:
    emu, server = cluster
    await _pdb(emu, maxUnavailable=0, unhealthyPodEvictionPolicy=policy)
    await _pod(emu, "a", ready=False)
    await _pod(emu, "b")
    assert (await _evict(server, "a"))[0] == code


async def test_deployment_keeps_replicas_with_start_time_ip_and_readiness(cluster: Any) -> None:
    emu, server = cluster
    await emu.put(
        "apps/v1/deployments",
        {
            "metadata": {"name": "llama", "namespace": NAMESPACE},
            "spec": {"replicas": 2, "selector": {"matchLabels": LABELS}, "template": {"metadata": {"labels": LABELS}}},
        },
    )

    def pods() -> list[dict[str, Any]]:
        return [
            o.raw
            for k, o in emu.objects.items()
            if k[0] == kmock.resource("v1/pods") and not o.deleted and not o.raw["metadata"].get("deletionTimestamp")
        ]

    def status() -> dict[str, Any]:
        return (emu.get("apps/v1/deployments", NAMESPACE, "llama") or {}).get("status") or {}

    await eventually(lambda: status().get("readyReplicas") == 2, what="two Ready replicas", timeout=10)
    assert status() == {
        "observedGeneration": 1,
        "replicas": 2,
        "updatedReplicas": 2,
        "readyReplicas": 2,
        "availableReplicas": 2,
    }
    ips = sorted(p["status"]["podIP"] for p in pods())
    assert all(ip.startswith("127.0.0.") for ip in ips) and len(set(ips)) == 2
    assert all(p["status"]["startTime"] and p["metadata"]["labels"] == LABELS for p in pods())

    response = await server.client.patch(
        f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/llama",
        json={"spec": {"replicas": 0}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status == 200
    deployment = emu.get("apps/v1/deployments", NAMESPACE, "llama")
    assert deployment is not None and deployment["metadata"]["generation"] == 2
    await eventually(lambda: not pods() and status().get("replicas") == 0, what="scaled to zero", timeout=10)
    # A status-only write does not bump the generation.
    deployment = emu.get("apps/v1/deployments", NAMESPACE, "llama")
    assert deployment is not None and deployment["metadata"]["generation"] == 2


async def test_stale_resource_version_in_a_patch_is_409_and_changes_nothing(cluster: Any) -> None:
    emu, server = cluster
    await emu.put("v1/services", {"metadata": {"name": "s", "namespace": NAMESPACE}})
    current = emu.get("v1/services", NAMESPACE, "s")
    assert current is not None
    url = f"/api/v1/namespaces/{NAMESPACE}/services/s"
    headers = {"Content-Type": "application/merge-patch+json"}
    stale = {"metadata": {"resourceVersion": "0", "labels": {"x": "1"}}}
    response = await server.client.patch(url, json=stale, headers=headers)
    assert response.status == 409 and (await response.json())["reason"] == "Conflict"
    assert emu.get("v1/services", NAMESPACE, "s") == current
    fresh = {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"], "labels": {"x": "1"}}}
    response = await server.client.patch(url, json=fresh, headers=headers)
    assert response.status == 200
    after = emu.get("v1/services", NAMESPACE, "s")
    assert after is not None and after["metadata"]["labels"] == {"x": "1"}
    assert after["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"]


async def test_rbac_mode_allows_only_the_rules_with_a_real_status_body(cluster: Any) -> None:
    emu, server = cluster
    pod = await _pod(emu, "a")
    emu.rbac = [(("",), ("pods",), ("list",))]
    assert (await server.client.get(f"/api/v1/namespaces/{NAMESPACE}/pods", headers=CONTROLLER)).status == 200
    code, body = await _evict(server, "a", pod["metadata"]["uid"], headers=CONTROLLER)
    assert code == 403
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "reason": "Forbidden",
        "message": 'pods "a" is forbidden: User "system:serviceaccount:drain-router:drain-router-'
        'controller" cannot create resource "pods/eviction" in API group "" in the '
        'namespace "ns"',
        "details": {"name": "a", "group": "", "kind": "pods"},
        "code": 403,
    }
    assert not _terminating(emu, "a"), "a refused call never mutates"
    assert (await server.client.get("/api/v1", headers=CONTROLLER)).status == 200, "discovery needs no rule"
    denied = await server.client.get(f"/api/v1/namespaces/{NAMESPACE}/pods/a", headers=CONTROLLER)
    assert denied.status == 403, "get is not list"
    own = await server.client.get(f"/api/v1/namespaces/{NAMESPACE}/pods/a")
    assert own.status == 200, "the tests' own calls are exempt"


async def test_forbid_takes_one_verb_on_one_resource_away(cluster: Any) -> None:
    emu, server = cluster
    emu.rbac = None  # forbid() on its own, also under CONTROLLER_TEST_RBAC=1
    pod = await _pod(emu, "a")
    emu.forbid("create", "pods/eviction")
    assert (await _evict(server, "a", pod["metadata"]["uid"], headers=CONTROLLER))[0] == 403
    assert (await server.client.get(f"/api/v1/namespaces/{NAMESPACE}/pods/a", headers=CONTROLLER)).status == 200
    assert not _terminating(emu, "a")
    emu.heal()
    assert (await _evict(server, "a", pod["metadata"]["uid"], headers=CONTROLLER))[0] == 201
