"""The API calls recycling and lifecycle rules make, against the emulator: every Eviction answer is
data (code, Status reason, first cause), never an exception; scale and delete; conditional status
patches."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest
from kubernetes_asyncio import client

from drain_router.controller import crd
from drain_router.controller.kube import client as kube_
from drain_router.controller.kube import observe
from drain_router.decisions import deletion, ownership, recycling

from . import consents, scenario
from .conftest import MSVC, NAMESPACE
from .emulator import ClusterEmulator

DEPLOYMENT = deletion.ObjectRef(api_version="apps/v1", kind="Deployment", name="llama")
LABEL = {ownership.SERVICE_LABEL: "llama"}
AUDIT_OWNERSHIP = False
"""These tests call the API client directly, with consents made for objects the test wrote as it
needed (a pod with no ReplicaSet): the ownership audit of the operator tests does not apply."""


@pytest.fixture
async def kube(cluster: Any) -> AsyncIterator[kube_.Kube]:
    configuration = client.Configuration(host=str(cluster[1].url).rstrip("/"))
    async with client.ApiClient(configuration) as api:
        yield kube_.Kube(api)


async def _pod(emu: ClusterEmulator, name: str = "a") -> str:
    pod = await emu.put(
        "v1/pods",
        {
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "x"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        },
    )
    return str(pod["metadata"]["uid"])


async def test_evict_success_is_201_and_sends_the_uid_and_no_grace(cluster: Any, kube: kube_.Kube) -> None:
    emu, _ = cluster
    uid = await _pod(emu)
    answer = await kube.evict_pod(consents.pod("a", uid))
    assert answer == recycling.EvictAnswer(code=201)
    (request,) = [r for r in emu._requests if r.subresource == "eviction"]
    assert request.data == {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "a", "namespace": NAMESPACE},
        "deleteOptions": {"preconditions": {"uid": uid}},
    }


async def test_evict_answers_are_data(cluster: Any, kube: kube_.Kube) -> None:
    emu, _ = cluster
    assert (await kube.evict_pod(consents.pod("nobody", "u"))).code == 404
    await _pod(emu)
    conflict = await kube.evict_pod(consents.pod("a", "another-uid"))
    assert (conflict.code, conflict.reason) == (409, "Conflict")
    await emu.put(
        "policy/v1/poddisruptionbudgets",
        {"metadata": {"name": "llama", "namespace": NAMESPACE}, "spec": {"selector": {}, "maxUnavailable": 0}},
    )
    uid = emu.get("v1/pods", NAMESPACE, "a")["metadata"]["uid"]  # type: ignore[index]
    budget = await kube.evict_pod(consents.pod("a", uid))
    assert (budget.code, budget.reason, budget.cause) == (429, "TooManyRequests", "DisruptionBudget")
    assert "disruption budget" in budget.message
    emu.forbid("create", "pods/eviction")
    forbidden = await kube.evict_pod(consents.pod("a", uid))
    assert (forbidden.code, forbidden.reason) == (403, "Forbidden") and "pods/eviction" in forbidden.message
    emu.heal()
    await emu.put(
        "policy/v1/poddisruptionbudgets",
        {"metadata": {"name": "two", "namespace": NAMESPACE}, "spec": {"selector": {}, "maxUnavailable": 1}},
    )
    failed = await kube.evict_pod(consents.pod("a", uid))
    assert failed.code == 500 and failed.message.startswith("This pod has more than one PodDisruptionBudget")


def test_a_2xx_failure_status_is_a_failure() -> None:
    answer = kube_.evict_answer(
        201,
        {
            "kind": "Status",
            "status": "Failure",
            "reason": "Odd",
            "message": "no",
            "details": {"causes": [{"reason": "Something"}]},
        },
    )
    assert answer == recycling.EvictAnswer(code=201, reason="Odd", cause="Something", message="no", failure=True)
    assert not kube_.evict_answer(201, {"kind": "Status", "status": "Success"}).failure


async def test_no_answer_is_code_0(kube: kube_.Kube) -> None:
    configuration = client.Configuration(host="http://127.0.0.1:9")  # discard port: nothing listens
    async with client.ApiClient(configuration) as api:
        answer = await kube_.Kube(api).evict_pod(consents.pod("a", "u"))
    assert answer.code == 0 and "no answer" in answer.message


async def test_scale_is_a_merge_patch_of_spec_replicas(cluster: Any, kube: kube_.Kube) -> None:
    emu, _ = cluster
    created = await emu.put(
        "apps/v1/deployments",
        {"metadata": {"name": "llama", "namespace": NAMESPACE, "labels": LABEL}, "spec": {"replicas": 3}},
    )
    await kube.scale(DEPLOYMENT, consents.of("Deployment", created), 0)
    stored = emu.get("apps/v1/deployments", NAMESPACE, "llama")
    assert stored is not None and stored["spec"]["replicas"] == 0
    async with emu._lock:
        emu._hard_delete(emu.key("apps/v1/deployments", NAMESPACE, "llama"))
    await emu.put(
        "apps/v1/deployments",
        {"metadata": {"name": "llama", "namespace": NAMESPACE, "labels": LABEL}, "spec": {"replicas": 3}},
    )
    with pytest.raises(kube_.CallFailed) as replaced:  # another object under the name: not written
        await kube.scale(DEPLOYMENT, consents.of("Deployment", created), 0)
    assert replaced.value.failure.code == 422
    stored = emu.get("apps/v1/deployments", NAMESPACE, "llama")
    assert stored is not None and stored["spec"]["replicas"] == 3
    emu.forbid("patch", "deployments")
    with pytest.raises(kube_.CallFailed) as caught:
        await kube.scale(DEPLOYMENT, consents.of("Deployment", stored), 0)
    assert caught.value.failure.code == 403 and "PATCH apps/v1 deployments/llama" in caught.value.failure.call


async def _msvc(emu: ClusterEmulator) -> dict[str, Any]:
    return await emu.put(
        MSVC,
        {
            "apiVersion": f"{crd.group()}/{crd.version()}",
            "kind": "ModelService",
            "metadata": {"name": "llama", "namespace": NAMESPACE},
            "spec": {"podSelector": {"matchLabels": {"app": "llama"}}, "workload": []},
        },
    )


async def test_delete_modelservice(cluster: Any, kube: kube_.Kube) -> None:
    emu, _ = cluster
    created = await _msvc(emu)
    itself = ownership.itself(observe.owner(created))
    assert await kube.delete_modelservice(itself) == 200
    assert emu.get(MSVC, NAMESPACE, "llama") is None
    assert await kube.delete_modelservice(itself) == 404
    with pytest.raises(ValueError):  # only the ModelService's own consent deletes a ModelService
        await kube.delete_modelservice(consents.labelled("ModelService", "llama", "uid-other"))


async def test_status_patch_with_a_stale_resource_version_is_a_conflict(cluster: Any, kube: kube_.Kube) -> None:
    emu, _ = cluster
    created = await _msvc(emu)
    rv = created["metadata"]["resourceVersion"]
    written = await kube.patch_modelservice_status(NAMESPACE, "llama", {"phase": "Deleting"}, rv)
    assert written["status"] == {"phase": "Deleting"}
    with pytest.raises(kube_.Conflict):
        await kube.patch_modelservice_status(NAMESPACE, "llama", {"phase": None}, rv)
    assert emu.get(MSVC, NAMESPACE, "llama")["status"] == {"phase": "Deleting"}  # type: ignore[index]


ROUTE = deletion.ObjectRef(api_version="gateway.networking.k8s.io/v1", kind="HTTPRoute", name="llama")


async def test_discovery_answers_an_absent_group_version_then_finds_it_once_installed(
    cluster: Any, kube: kube_.Kube
) -> None:
    """The library's discovery: a group version the API server does not serve (the Gateway API CRDs
    not installed) is a failed call with 404, named with the guessed plural; installed later, it is
    found (a miss discovers again) and the object read; no discovery cache file is written."""
    emu, server = cluster
    httproutes = kmock.resource("gateway.networking.k8s.io/v1/httproutes")
    served = emu.resources[httproutes]
    del emu.resources[httproutes]
    with pytest.raises(kube_.CallFailed) as caught:
        await kube.get(ROUTE, NAMESPACE)
    failure = caught.value.failure
    assert failure.code == 404 and "not served" in failure.message
    assert failure.call == "GET gateway.networking.k8s.io/v1 httproutes/llama"
    assert await kube.get(DEPLOYMENT, NAMESPACE) is None, "a served kind still resolves (404 is no object)"
    emu.resources[httproutes] = served
    await emu.put("gateway.networking.k8s.io/v1/httproutes", {"metadata": {"name": "llama", "namespace": NAMESPACE}})
    route = await kube.get(ROUTE, NAMESPACE)
    assert route is not None and route["metadata"]["name"] == "llama"
    host = str(server.url).rstrip("/").encode()
    cache = os.path.join(tempfile.gettempdir(), f"osrcp-{hashlib.md5(host, usedforsecurity=False).hexdigest()}.json")
    assert not os.path.exists(cache)


async def test_a_pod_gone_with_its_replicaset_between_two_reads_is_not_called_not_owned(
    cluster: Any, kube: kube_.Kube
) -> None:
    """1. A Deployment the service owns, its ReplicaSet and a pod of it; a pod of no ReplicaSet. 2. The
    ReplicaSet and its pod go (a foreground deletion ending) after the pods are listed and before the
    ReplicaSet is read. Result: the pod that went is neither the service's nor listed as not owned
    (it was the service's); the pod of no ReplicaSet, still there, is listed as not owned."""
    emu, _ = cluster
    dep = await emu.put("apps/v1/deployments", {"metadata": {"name": "llama", "namespace": NAMESPACE, "labels": LABEL}})
    refs = await scenario.replicaset(emu, dep)
    selector = {"matchLabels": {"app": "x"}}
    for name, owners in (("llama-0", refs), ("stray", [])):
        meta = {"name": name, "namespace": NAMESPACE, "labels": {"app": "x"}, "ownerReferences": owners}
        await emu.put("v1/pods", {"metadata": meta})
    gone = [emu.key("v1/pods", NAMESPACE, "llama-0"), emu.key("apps/v1/replicasets", NAMESPACE, "llama-5f7c")]

    def foreground_ends(request: Any) -> None:
        if request.method == "GET" and request.resource == kmock.resource("apps/v1/replicasets"):
            for key in gone:
                if key in emu.objects and not emu.objects[key].deleted:
                    emu.objects[key].delete()

    emu.on_request = foreground_ends
    service = ownership.Owner(namespace=NAMESPACE, name="llama", uid="msvc-uid")
    consent = ownership.check(service, observe.claim("Deployment", dep))
    assert isinstance(consent, ownership.Consent)
    selected, failure = await observe.selected_pods(kube, service, selector, [consent])
    assert failure is None and selected is not None
    assert selected.owned == ()
    assert [n.what for n in selected.not_owned] == ["Pod/stray"], selected.not_owned
