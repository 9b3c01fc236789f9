"""The 18 staged-deletion cases (``tests/cases/deletion/controller/``), each as one pass of the real
operator against the emulator: the same files ``test_deletion_cases.py`` runs through the pure
``deletion.next_stage``.

Each case becomes a cluster: its route, workload objects, pods and nodes as objects (a route or
object marked ``deleting`` holds a finalizer of its own), the ModelService with the case's spec,
annotations and ``status.deletion``, then deleted. The operator's clock and the emulator's are both
frozen at the case's ``now``, and the emulator runs no kubelet or Deployment controller, so the
cluster stays as the case describes it; the standard requeue is long (:data:`REQUEUE`), so the first
pass is the only one. What it did is read back from the API server: the status write (a subset
compared with ``expect.status``, plus ``phase: Deleting`` and the ``Deleting`` condition), the DELETE
requests (``expect.actions``, in order; a force delete with grace 0 and the pod's UID), the events,
the InvalidAnnotation warnings, whether the finalizer was dropped (``Release``, ``Skip``) or kept
(``Continue``, ``Hold``), and the requeue kopf recorded (``expect.requeueAt``, or the standard one).
"""

from __future__ import annotations

import datetime
import json
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest

from drain_router.controller import crd, handlers
from drain_router.decisions import deletion

from . import casefiles, ownership_audit
from .conftest import MSVC, NAMESPACE, RBAC_ENV, ClusterEmulator, Operator, eventually
from .emulator import FOREGROUND
from .scenario import LABELS, OWNED, msvc, msvc_url, replicaset

CASES = casefiles.load_dir("controller")
REQUEUE = 900.0
"""The standard requeue of these tests: longer than any test, so the first pass is the only one."""
PLURALS = {"HTTPRoute": "httproutes", "Deployment": "deployments", "Service": "services"}
PATHS = {
    "HTTPRoute": "gateway.networking.k8s.io/v1/httproutes",
    "Deployment": "apps/v1/deployments",
    "Service": "v1/services",
}
REASONS = {r.value for r in deletion.Reason}
HOLDER = "example.com/keep"
"""A finalizer of someone else's, on a route or workload object the case marks ``deleting``."""


class FrozenClock:
    def __init__(self, at: float) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


@pytest.fixture()
async def cluster(request: pytest.FixtureRequest) -> AsyncIterator[tuple[ClusterEmulator, kmock.Server]]:
    """The emulated API server alone: no kubelet and no Deployment controller (nothing changes the
    cluster but the operator), its clock set by the test; RBAC as the chart grants it in RBAC mode."""
    spec = crd.load()["spec"]
    emulator = ClusterEmulator()
    if os.environ.get(RBAC_ENV) == "1":
        emulator.rbac = request.getfixturevalue("chart_rules")
    emulator.resources[MSVC] = kmock.ResourceInfo(
        kind=spec["names"]["kind"],
        namespaced=True,
        shortnames=set(spec["names"]["shortNames"]),
        subresources=set(spec["versions"][0]["subresources"]),
        verbs={"get", "list", "watch", "patch", "delete"},
    )
    audit = ownership_audit.install(emulator, MSVC)
    async with emulator, kmock.Server(emulator) as server:
        yield emulator, server
    assert not audit.violations, f"writes to objects the service does not own: {audit.violations}"


def _object(kind: str, data: dict[str, Any], deleted_at: str) -> tuple[str, dict[str, Any]]:
    meta: dict[str, Any] = {"name": data["name"], "namespace": NAMESPACE}
    if data.get("serviceLabel") is not None:
        meta["labels"] = {deletion.SERVICE_LABEL: data["serviceLabel"]}
    elif data.get("owned", True):
        meta["labels"] = OWNED
    if data.get("deleting"):
        meta.update(finalizers=[HOLDER], deletionTimestamp=deleted_at)
    return PATHS[kind], {"metadata": meta}


async def _build(emu: ClusterEmulator, case: dict[str, Any]) -> None:
    obs = case["observations"]
    for node, ready in (obs.get("nodes") or {}).items():
        condition = {"type": "Ready", "status": "True" if ready else "False"}
        await emu.put("v1/nodes", {"metadata": {"name": node}, "status": {"conditions": [condition]}})
    route, workload = obs.get("route"), obs.get("workload") or []
    for data in ([route] if route else []) + workload:
        if data["exists"]:
            await emu.put(*_object(data["kind"], data, case["now"]))
    spec_workload = [{k: o[k] for k in ("apiVersion", "kind", "name")} for o in workload]
    owner_refs: list[Any] = []
    if obs.get("pods"):
        # The pods are the service's through a ReplicaSet of its Deployment. Once the teardown has
        # deleted the Deployment (in the foreground), it stays, terminating, while its pods do.
        live = next((o for o in workload if o["kind"] == "Deployment" and o["exists"]), None)
        if live is None:
            name = next((o["name"] for o in workload if o["kind"] == "Deployment"), "llama")
            gone = {"deletionTimestamp": case["now"], "finalizers": [FOREGROUND]}
            deployment = await emu.put(
                PATHS["Deployment"], {"metadata": {"name": name, "namespace": NAMESPACE, "labels": OWNED, **gone}}
            )
            if not any(o["kind"] == "Deployment" for o in workload):
                spec_workload.append({"apiVersion": "apps/v1", "kind": "Deployment", "name": name})
        else:
            deployment = emu.get(PATHS["Deployment"], NAMESPACE, live["name"])  # type: ignore[assignment]
        owner_refs = await replicaset(emu, deployment)
    for pod in obs.get("pods") or []:
        meta: dict[str, Any] = {
            "name": pod["name"],
            "namespace": NAMESPACE,
            "labels": LABELS,
            "ownerReferences": owner_refs,
        }
        if pod.get("deletionTimestamp"):
            meta.update(deletionTimestamp=pod["deletionTimestamp"], deletionGracePeriodSeconds=pod.get("grace"))
        spec: dict[str, Any] = {"nodeName": pod.get("node")}
        if pod.get("grace") is not None:
            spec["terminationGracePeriodSeconds"] = pod["grace"]
        await emu.put("v1/pods", {"metadata": meta, "spec": spec, "status": {"phase": pod.get("phase", "Running")}})
    ref = ("apiVersion", "kind", "name")
    body: dict[str, Any] = {
        "apiVersion": f"{crd.group()}/{crd.version()}",
        "kind": "ModelService",
        "metadata": {"name": "llama", "namespace": NAMESPACE, "annotations": case.get("annotations") or {}},
        "spec": {
            "podSelector": {"matchLabels": LABELS},
            "route": None if route is None else {k: route[k] for k in ref},
            "suspend": obs.get("suspend", False),
            "workload": spec_workload,
            **({"deletion": case["spec"]["deletion"]} if (case.get("spec") or {}).get("deletion") else {}),
        },
    }
    if case["status"] is not None:
        body["status"] = {"deletion": case["status"]}
    await emu.put(MSVC, body)


def _status_writes(emu: ClusterEmulator) -> list[dict[str, Any]]:
    return [
        r.data["status"]
        for r in emu._requests
        if r.resource is not None
        and r.resource.plural == crd.plural()
        and r.subresource == "status"
        and isinstance(r.data, dict)
        and "deletion" in (r.data.get("status") or {})
    ]


def _deletes(emu: ClusterEmulator) -> list[dict[str, Any]]:
    """The DELETE requests the operator sent for anything but the ModelService, as case actions."""
    out = []
    for r in emu._requests:
        if r.action != kmock.action.DELETE or r.resource is None or r.resource.plural == crd.plural():
            continue
        if r.resource.plural == "pods":
            data = r.data if isinstance(r.data, dict) else {}
            assert data.get("gracePeriodSeconds") == 0, f"a pod deleted without grace 0: {r.name} {data}"
            out.append({"kind": "ForceDeletePod", "pod": r.name, "uid": (data.get("preconditions") or {}).get("uid")})
        else:
            kind = {v: k for k, v in PLURALS.items()}[r.resource.plural]
            out.append({"kind": None, "ref": f"{kind}/{r.name}"})
    return out


def _events(emu: ClusterEmulator) -> list[dict[str, str]]:
    out = []
    for (res, _, _), obj in emu.objects.items():
        if res == kmock.resource("v1/events") and obj.history:
            raw = obj.last
            out.append({"type": raw["type"], "reason": raw["reason"], "message": raw.get("message") or ""})
    return out


def _delayed(emu: ClusterEmulator) -> float | None:
    """When kopf will run the handler again (its progress annotation), ``None`` before any requeue."""
    obj = msvc(emu)
    if obj is None:
        return None
    for key, value in (obj["metadata"].get("annotations") or {}).items():
        if key.startswith(handlers.PREFIX + "/") and "delayed" in value:
            delayed = json.loads(value).get("delayed")
            if delayed:
                return datetime.datetime.fromisoformat(delayed).replace(tzinfo=datetime.UTC).timestamp()
    return None


def _expected_action(action: dict[str, Any], emu_uids: dict[str, str]) -> dict[str, Any]:
    if action["kind"] == "ForceDeletePod":
        return {"kind": "ForceDeletePod", "pod": action["pod"], "uid": emu_uids[action["pod"]]}
    return {"kind": None, "ref": action["ref"]}


@pytest.mark.parametrize("case", CASES)
async def test_controller_case_through_the_operator(
    cluster: tuple[ClusterEmulator, kmock.Server], case: dict[str, Any]
) -> None:
    emu, server = cluster
    now = casefiles.t(case["now"])
    assert now is not None
    clock = FrozenClock(now)
    emu.clock = clock
    await _build(emu, case)
    uids = {
        pod["name"]: emu.get("v1/pods", NAMESPACE, pod["name"])["metadata"]["uid"]  # type: ignore[index]
        for pod in case["observations"].get("pods") or []
    }
    op = Operator(server, requeue_secs=REQUEUE)
    await op.start()
    try:
        assert op.ctx is not None
        op.ctx.clock = clock
        await eventually(
            lambda: "drainrouter.dev/staged-deletion" in (msvc(emu) or {}).get("metadata", {}).get("finalizers", []),
            what="the finalizer added by the operator",
        )
        response = await server.client.delete(msvc_url())
        assert response.status == 200, await response.text()
        asked = time.time()
        expect = case["expect"]
        released = expect["verdict"] in ("Release", "Skip")

        await eventually(
            lambda: msvc(emu) is None or _delayed(emu) is not None, what="the first pass to release or requeue"
        )
        assert (msvc(emu) is None) == released, "the finalizer must be dropped exactly for Release and Skip"

        writes = _status_writes(emu)
        if expect.get("status") is None:
            assert writes == [], "no status is written"
        else:
            assert len(writes) == 1, writes
            (written,) = writes
            assert written["phase"] == "Deleting"
            got = {k: written["deletion"].get(k) for k in expect["status"]}
            assert got == expect["status"]
            (cond,) = [c for c in written["conditions"] if c["type"] == "Deleting"]
            assert {"status": cond["status"], "reason": cond["reason"]} == expect["condition"]

        wanted = [_expected_action(a, uids) for a in expect.get("actions", [])]
        assert _deletes(emu) == wanted

        if expect["verdict"] in ("Continue", "Hold"):
            delayed = _delayed(emu)
            assert delayed is not None
            requeue_at = casefiles.t(expect.get("requeueAt"))
            delay = REQUEUE if requeue_at is None else requeue_at - now
            assert abs((delayed - asked) - delay) < 5.0, f"requeued in {delayed - asked:.1f}s, not {delay:g}s"

        wanted_events = expect.get("events")
        if wanted_events:
            await eventually(
                lambda: len([e for e in _events(emu) if e["reason"] in REASONS]) >= len(wanted_events),
                what=f"{len(wanted_events)} events",
                timeout=10,
            )
        if wanted_events is not None:
            got_events = [e for e in _events(emu) if e["reason"] in REASONS]
            assert [{k: g[k] for k in w} for g, w in zip(got_events, wanted_events)] == wanted_events
            assert len(got_events) == len(wanted_events), got_events

        invalid = expect.get("invalid", [])
        if invalid:
            await eventually(
                lambda: any(e["reason"] == "InvalidAnnotation" for e in _events(emu)),
                what="InvalidAnnotation",
                timeout=10,
            )
        warned = [e for e in _events(emu) if e["reason"] in ("InvalidAnnotation", "InvalidSpec")]
        assert len(warned) == len(invalid)
        for event, want in zip(warned, invalid):
            assert event["type"] == "Warning" and event["reason"] == want["reason"]
            assert event["message"].startswith(f"{want['key']}="), event
    finally:
        await op.stop()


async def test_phase_is_deleting_from_the_first_pass_to_the_release(
    cluster: tuple[ClusterEmulator, kmock.Server],
) -> None:
    """``status.phase: Deleting`` is written with every stage, not only in the first write:
    RouteRemoving through Released, the operator's real clock, a 0 s settle and no pods."""
    emu, server = cluster
    case = next(p.values[0] for p in CASES if p.id == "route-deleted-before-uninstall")
    observations = {**case["observations"], "pods": []}
    await _build(emu, {**case, "observations": observations, "spec": {"deletion": {"routeSettle": "0s"}}})
    op = Operator(server)
    await op.start()
    try:
        await eventually(
            lambda: "drainrouter.dev/staged-deletion" in (msvc(emu) or {}).get("metadata", {}).get("finalizers", []),
            what="the finalizer added by the operator",
        )
        response = await server.client.delete(msvc_url())
        assert response.status == 200, await response.text()
        await eventually(lambda: msvc(emu) is None, what="the release")
    finally:
        await op.stop()
    writes = _status_writes(emu)
    stages = [w["deletion"]["stage"] for w in writes]
    assert stages[0] == "RouteRemoving" and stages[-1] == "Released", stages
    assert [w.get("phase") for w in writes] == ["Deleting"] * len(writes), writes
