"""The emulator's additions for recycling and lifecycle rules behave like a real API server: the
Eviction subresource with PodDisruptionBudgets, the Deployment controller, the ``resourceVersion``
precondition on patches, and RBAC. Each is checked over HTTP, as the controller sees it."""

from __future__ import annotations

from typing import Any

import kmock
import pytest

from drain_router.controller import crd

from . import crd_cases
from .conftest import MSVC, NAMESPACE, eventually
from .emulator import ClusterEmulator
from .rules_scenario import patch_deployment

LABELS = {"app": "llama"}
CONTROLLER = {"User-Agent": "kopf/1.45.2"}
"""What the controller's own calls look like; the tests' kmock client is exempt from RBAC mode."""

AUDIT_OWNERSHIP = False
"""These tests drive the emulator itself, not the controller: the ownership audit does not apply."""


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


async def _observed(emu: ClusterEmulator, *, healthy: int, expected: int, name: str = "llama") -> dict[str, Any]:
    """Wait for the disruption controller's pass that counts these pods; the budget's stored status."""

    def status() -> dict[str, Any] | None:
        pdb = emu.get("policy/v1/poddisruptionbudgets", NAMESPACE, name) or {}
        got = pdb.get("status") or {}
        return got if (got.get("currentHealthy"), got.get("expectedPods")) == (healthy, expected) else None

    return await eventually(status, what=f"budget {name} observed {healthy}/{expected} healthy", timeout=10)


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
    await _observed(emu, healthy=2, expected=2)
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
    """maxUnavailable 1 over two Ready pods: one eviction passes and takes the one disruption the
    stored status allowed, so the second is refused at once, before the disruption controller has
    counted the evicted pod out; its next pass does (1 healthy), and still allows nothing."""
    emu, server = cluster
    await _pdb(emu, maxUnavailable=1)
    await _pod(emu, "a")
    await _pod(emu, "b")
    await _observed(emu, healthy=2, expected=2)
    emu.pdb_controller_paused = True
    assert (await _evict(server, "a"))[0] == 201
    assert (await _evict(server, "b"))[0] == 429
    pdb = emu.get("policy/v1/poddisruptionbudgets", NAMESPACE, "llama")
    assert pdb is not None and pdb["status"]["currentHealthy"] == 2 and pdb["status"]["disruptionsAllowed"] == 0
    emu.pdb_controller_paused = False
    status = await _observed(emu, healthy=1, expected=2)
    assert status["disruptionsAllowed"] == 0


async def test_eviction_reads_the_stored_budget_status_not_a_fresh_count(cluster: Any) -> None:
    """minAvailable 1 over a Ready pod and an unready one: the disruption controller stores 0 allowed.
    With it paused, the second pod turns Ready: a fresh count would allow one disruption, but the
    eviction reads the stored status and is refused; the next pass allows it."""
    emu, server = cluster
    await _pdb(emu, minAvailable=1)
    await _pod(emu, "a")
    await _pod(emu, "b", ready=False)
    await _observed(emu, healthy=1, expected=2)
    emu.pdb_controller_paused = True
    await emu.set_pod_ready("b", True)
    assert (await _evict(server, "a"))[0] == 429
    emu.pdb_controller_paused = False
    await _observed(emu, healthy=2, expected=2)
    assert (await _evict(server, "a"))[0] == 201


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
    await _observed(emu, healthy=1, expected=2)
    assert (await _evict(server, "a"))[0] == code


class ManualClock:
    """The emulator's clock, moved only by the test: each step of a rollout happens when the test
    says, and the test waits for the emulator's next pass (``ticks``), never for a time."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


async def _passes(emu: ClusterEmulator, n: int = 2) -> None:
    """Wait for ``n`` more passes of the emulated controllers."""
    target = emu.ticks + n
    await eventually(lambda: emu.ticks >= target, what=f"{n} controller passes", timeout=10)


async def _step(emu: ClusterEmulator, clock: ManualClock, seconds: float) -> None:
    """Move the clock ``seconds`` on (and a millisecond, past float rounding) and wait two passes."""
    clock.now += seconds + 0.001
    await _passes(emu)


def _deployment_body(replicas: int, version: str = "1", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "llama", "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": LABELS},
            "template": {"metadata": {"labels": LABELS, "annotations": {"version": version}}},
            **spec,
        },
    }


def _objects(emu: ClusterEmulator, path: str, *, alive_only: bool = True) -> list[dict[str, Any]]:
    return [
        o.raw
        for k, o in emu.objects.items()
        if k[0] == kmock.resource(path)
        and not o.deleted
        and not (alive_only and o.raw["metadata"].get("deletionTimestamp"))
    ]


def _dstatus(emu: ClusterEmulator) -> dict[str, Any]:
    return (emu.get("apps/v1/deployments", NAMESPACE, "llama") or {}).get("status") or {}


def _ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or ())


async def test_deployment_owns_a_replicaset_that_owns_pending_then_running_then_ready_pods(cluster: Any) -> None:
    """1. a Deployment of one replica 2. the clock moves past ``pending_for`` 3. past ``ready_after``.
    Result: a ReplicaSet ``<deployment>-<hash>`` owned by the Deployment, a pod owned by the ReplicaSet,
    both labelled with the same ``pod-template-hash``; the pod Pending without podIP or startTime,
    then Running with both but not Ready, then Ready; the Deployment's status shows it only
    ``status_delay`` later."""
    emu, _ = cluster
    emu.clock = clock = ManualClock()
    deployment = await emu.put("apps/v1/deployments", _deployment_body(1))
    await _passes(emu)
    (rs,) = _objects(emu, "apps/v1/replicasets")
    (pod,) = _objects(emu, "v1/pods")
    template_hash = rs["metadata"]["labels"]["pod-template-hash"]
    assert rs["metadata"]["name"] == f"llama-{template_hash}"
    assert rs["metadata"]["ownerReferences"][0]["uid"] == deployment["metadata"]["uid"]
    assert pod["metadata"]["ownerReferences"][0]["uid"] == rs["metadata"]["uid"]
    assert pod["metadata"]["labels"] == {**LABELS, "pod-template-hash": template_hash}
    assert pod["status"]["phase"] == "Pending" and "podIP" not in pod["status"] and "startTime" not in pod["status"]
    await _step(emu, clock, emu.pending_for)
    (pod,) = _objects(emu, "v1/pods")
    assert pod["status"]["phase"] == "Running" and pod["status"]["podIP"] and pod["status"]["startTime"]
    assert not _ready(pod)
    await _step(emu, clock, emu.ready_after)
    (pod,) = _objects(emu, "v1/pods")
    assert _ready(pod)
    assert "readyReplicas" not in _dstatus(emu), "the Deployment's status lags the pod"
    await _step(emu, clock, emu.status_delay)
    assert _dstatus(emu) == {
        "observedGeneration": 1,
        "replicas": 1,
        "updatedReplicas": 1,
        "readyReplicas": 1,
        "availableReplicas": 1,
    }


async def test_observed_generation_lags_a_spec_change(cluster: Any) -> None:
    """A scale is a new ``generation`` at once; ``observedGeneration`` follows ``status_delay`` later,
    and the counts stay as they were until then."""
    emu, server = cluster
    emu.clock = clock = ManualClock()
    await emu.put("apps/v1/deployments", _deployment_body(1))
    await _passes(emu)
    for _ in range(3):
        await _step(emu, clock, max(emu.pending_for, emu.ready_after, emu.status_delay))
    assert _dstatus(emu)["readyReplicas"] == 1
    await patch_deployment(server, {"spec": {"replicas": 2}})
    assert emu.get("apps/v1/deployments", NAMESPACE, "llama")["metadata"]["generation"] == 2  # type: ignore[index]
    await _passes(emu)
    assert _dstatus(emu)["observedGeneration"] == 1 and _dstatus(emu)["replicas"] == 1
    await _step(emu, clock, emu.status_delay)
    assert _dstatus(emu)["observedGeneration"] == 2 and _dstatus(emu)["replicas"] == 2
    assert _dstatus(emu)["readyReplicas"] == 1 and _dstatus(emu)["unavailableReplicas"] == 1


async def test_template_change_rolls_out_through_a_new_replicaset_within_surge_and_unavailable(
    cluster: Any,
) -> None:
    """Four replicas (25%: one surge, one unavailable) and a new template, stepped by the clock.
    Result: a second ReplicaSet; at every step at most five pods and at least three Ready ones;
    the status never all four updated, Ready and available while an old pod remains; at the end four Ready pods of the
    new template, the old ReplicaSet at zero, and the status all four."""
    emu, server = cluster
    emu.clock = clock = ManualClock()
    step = max(emu.pending_for, emu.ready_after, emu.status_delay)
    await emu.put("apps/v1/deployments", _deployment_body(4))
    await _passes(emu)
    for _ in range(3):
        await _step(emu, clock, step)
    assert _dstatus(emu)["availableReplicas"] == 4
    await patch_deployment(server, {"spec": {"template": {"metadata": {"annotations": {"version": "2"}}}}})
    mixed = False
    for _ in range(40):
        await _step(emu, clock, step / 2)
        alive = _objects(emu, "v1/pods")
        versions = {p["metadata"]["annotations"]["version"] for p in alive}
        mixed = mixed or versions == {"1", "2"}
        assert len(alive) <= 5, alive
        assert sum(1 for p in alive if _ready(p)) >= 3
        status = _dstatus(emu)
        counts = [status.get(k) for k in ("replicas", "updatedReplicas", "readyReplicas", "availableReplicas")]
        if "1" in versions:  # an old pod is still alive: the status never looks finished
            assert not (status.get("observedGeneration") == 2 and counts == [4, 4, 4, 4]), status
        if versions == {"2"} and status.get("updatedReplicas") == 4 and status.get("availableReplicas") == 4:
            break
    else:
        raise AssertionError(f"the rollout did not finish: {_dstatus(emu)}")
    assert mixed, "old and new pods served side by side during the rollout"
    sets = {
        rs["spec"]["template"]["metadata"]["annotations"]["version"]: rs for rs in _objects(emu, "apps/v1/replicasets")
    }
    assert sets["1"]["spec"]["replicas"] == 0 and sets["2"]["spec"]["replicas"] == 4
    assert _dstatus(emu) == {
        "observedGeneration": 2,
        "replicas": 4,
        "updatedReplicas": 4,
        "readyReplicas": 4,
        "availableReplicas": 4,
    }


async def test_scale_to_zero_and_back(cluster: Any) -> None:
    emu, server = cluster
    await emu.put("apps/v1/deployments", _deployment_body(2))
    await eventually(lambda: _dstatus(emu).get("readyReplicas") == 2, what="two Ready replicas", timeout=10)
    ips = sorted(p["status"]["podIP"] for p in _objects(emu, "v1/pods"))
    assert all(ip.startswith("127.0.0.") for ip in ips) and len(set(ips)) == 2
    await patch_deployment(server, {"spec": {"replicas": 0}})
    await eventually(
        lambda: (
            not _objects(emu, "v1/pods")
            and "replicas" not in _dstatus(emu)
            and _dstatus(emu)["observedGeneration"] == 2
        ),
        what="scaled to zero",
        timeout=10,
    )
    # A status-only write does not bump the generation.
    assert emu.get("apps/v1/deployments", NAMESPACE, "llama")["metadata"]["generation"] == 2  # type: ignore[index]
    await patch_deployment(server, {"spec": {"replicas": 1}})
    await eventually(lambda: _dstatus(emu).get("readyReplicas") == 1, what="one Ready replica again", timeout=10)
    assert len(_objects(emu, "apps/v1/replicasets")) == 1, "a scale is no new template"


async def test_garbage_collection_is_in_the_background_and_takes_a_while(cluster: Any) -> None:
    """Deleting a Deployment removes it at once; its ReplicaSet goes ``gc_delay`` later, and its pods
    (gracefully, so Terminating first) a further ``gc_delay`` after that."""
    emu, server = cluster
    emu.clock = clock = ManualClock()
    await emu.put("apps/v1/deployments", _deployment_body(1))
    await _passes(emu)
    response = await server.client.delete(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/llama", json={})
    assert response.status == 200
    assert emu.get("apps/v1/deployments", NAMESPACE, "llama") is None
    await _passes(emu)
    assert len(_objects(emu, "apps/v1/replicasets")) == 1 and len(_objects(emu, "v1/pods")) == 1
    await _step(emu, clock, emu.gc_delay)
    assert not _objects(emu, "apps/v1/replicasets") and len(_objects(emu, "v1/pods")) == 1
    await _step(emu, clock, emu.gc_delay)
    assert not _objects(emu, "v1/pods") and _objects(emu, "v1/pods", alive_only=False), "Terminating, not gone"


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


async def _create_msvc(server: kmock.Server, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    response = await server.client.post(
        f"/apis/{MSVC.rsplit('/', 1)[0]}/namespaces/{NAMESPACE}/{crd.plural()}", json=body
    )
    return response.status, await response.json()


async def test_custom_resource_unknown_fields_are_pruned_and_defaults_applied(cluster: Any) -> None:
    emu, server = cluster
    body = crd_cases.valid_body(
        "llama", NAMESPACE, LABELS, recycling={"maxPodLifetimeSeconds": 60, "typo": 1}, unknown={"x": 1}
    )
    body["extra"] = "top level"
    code, created = await _create_msvc(server, body)
    assert code == 200, created
    stored = emu.get(MSVC, NAMESPACE, "llama")
    assert stored is not None and created["spec"] == stored["spec"]
    assert "extra" not in stored and "unknown" not in stored["spec"]
    assert stored["spec"]["recycling"] == {"maxPodLifetimeSeconds": 60, "waitForIdle": True}, "pruned, defaulted"
    assert stored["spec"]["podSelector"] == {"matchLabels": LABELS}, "additionalProperties kept"
    assert stored["spec"]["suspend"] is False and "router" not in stored["spec"], "defaults only where the parent is"


@pytest.mark.parametrize("case", crd_cases.CASES, ids=[c["id"] for c in crd_cases.CASES])
async def test_custom_resource_validation_is_a_422_invalid_status_with_causes(
    cluster: Any, case: dict[str, Any]
) -> None:
    """The CRD's OpenAPI schema and its CEL rules answered as ``tests/cases/crd/admission.yaml``
    says the real API server answers (e2e/kubernetes/test_crd.py holds the real one to it)."""
    emu, server = cluster
    code, body = await _create_msvc(server, crd_cases.body(case, "llama", NAMESPACE, LABELS))
    if not case["causes"]:
        assert code == 200, body
        return
    assert (code, body["kind"], body["status"], body["reason"]) == (422, "Status", "Failure", "Invalid"), body
    assert body["message"].startswith('ModelService.drainrouter.dev "llama" is invalid: ')
    assert crd_cases.by_field(body["details"]["causes"]) == crd_cases.by_field(case["causes"])
    assert emu.get(MSVC, NAMESPACE, "llama") is None, "nothing stored"


async def test_an_update_is_validated_and_an_unchanged_invalid_field_ratchets(cluster: Any) -> None:
    """A merge patch that breaks the schema is refused and changes nothing; an object stored before
    the CRD refused its spec still takes a status write (the spec is unchanged)."""
    emu, server = cluster
    await emu.put(MSVC, crd_cases.valid_body("llama", NAMESPACE, LABELS, router={"adminPort": 0}), admit=False)
    url = f"/apis/{MSVC.rsplit('/', 1)[0]}/namespaces/{NAMESPACE}/{crd.plural()}/llama"
    headers = {"Content-Type": "application/merge-patch+json"}
    response = await server.client.patch(url + "/status", json={"status": {"phase": "Deleting"}}, headers=headers)
    assert response.status == 200, await response.text()
    response = await server.client.patch(url + "/status", json={"status": {"phase": "Gone"}}, headers=headers)
    assert response.status == 422 and (await response.json())["details"]["causes"][0]["field"] == "status.phase"
    response = await server.client.patch(url, json={"spec": {"router": {"adminPort": 70000}}}, headers=headers)
    assert response.status == 422
    stored = emu.get(MSVC, NAMESPACE, "llama")
    assert (
        stored is not None and stored["spec"]["router"]["adminPort"] == 0 and stored["status"] == {"phase": "Deleting"}
    )


async def test_put_is_the_update_verb_and_replaces_the_object(cluster: Any) -> None:
    """RBAC: a PUT needs ``update``, a PATCH ``patch`` (one does not grant the other). A PUT replaces
    the object (a label it leaves out is gone) and, with a stale ``resourceVersion``, is 409."""
    emu, server = cluster
    service = await emu.put("v1/services", {"metadata": {"name": "s", "namespace": NAMESPACE, "labels": {"a": "1"}}})
    url = f"/api/v1/namespaces/{NAMESPACE}/services/s"
    replacement = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": NAMESPACE}}
    patch = {"Content-Type": "application/merge-patch+json", **CONTROLLER}
    emu.rbac = [(("",), ("services",), ("patch",))]
    denied = await server.client.put(url, json=replacement, headers=CONTROLLER)
    assert denied.status == 403 and 'cannot update resource "services"' in (await denied.json())["message"]
    assert (await server.client.patch(url, json={"metadata": {"labels": {"b": "2"}}}, headers=patch)).status == 200
    emu.rbac = [(("",), ("services",), ("update",))]
    denied = await server.client.patch(url, json={"metadata": {"labels": {"b": "3"}}}, headers=patch)
    assert denied.status == 403 and 'cannot patch resource "services"' in (await denied.json())["message"]
    stale = {
        **replacement,
        "metadata": {**replacement["metadata"], "resourceVersion": service["metadata"]["resourceVersion"]},
    }
    assert (await server.client.put(url, json=stale, headers=CONTROLLER)).status == 409
    response = await server.client.put(url, json=replacement, headers=CONTROLLER)
    assert response.status == 200
    stored = emu.get("v1/services", NAMESPACE, "s")
    assert (
        stored is not None
        and "labels" not in stored["metadata"]
        and stored["metadata"]["uid"] == service["metadata"]["uid"]
    )
