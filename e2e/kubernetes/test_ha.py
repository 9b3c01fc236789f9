"""The controller's high availability on the real control plane: the chart's two replicas elect a
leader on a real ``coordination.k8s.io/v1`` Lease; the leader crashes mid-work, the standby takes the
Lease within the documented bound, and finishes the work without doing any of it twice.

The crash: the leader's container process group is killed with SIGKILL (the node agent runs each
container as a process group and reports its leader as ``containerID: process://<pid>``). That is
what an OOM kill or a segfault does: no Lease release, no cleanup; the kubelet restarts the
container in the same pod after its back-off, and it comes back as a standby. (A lost node, whose
leader may go on running cut off from the API server, is the renew deadline's case, proven against
the emulator in tests/controller/test_ha.py.)

Work in progress across the failover, from the API server's audit log (who sent each request: the
pod name of the bound service-account token):

- a ModelService being deleted: the old leader removed its route and is waiting out the route
  settle when it dies; the new leader resumes the settle from the stored status and uninstalls.
  Each object is deleted exactly once: the route by the old leader, the Deployment and the Service
  by the new one.
- a ModelService recycling pods (a lifetime of a few seconds, a drain long enough that the pod the
  old leader evicted is still terminating when the new leader takes over): every pod is evicted at
  most once, whichever leader asked.

And: the standby sends nothing but Lease reads until it holds the Lease; the dead leader, and its
restarted container, send nothing but Lease reads after the kill; the takeover lands between
``leaseDurationSeconds`` and ``leaseDurationSeconds + retryPeriod`` (plus a round trip) after the old
leader's last renewal, measured on the Lease's own ``renewTime`` and ``acquireTime``; and
``leaseTransitions`` counts one more.

The session's controller runs with the chart's default election values (15 s lease, 2 s retry), so
this scenario changes nothing of it; it waits until the killed container is back and Ready.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from typing import Any

import pytest

from drain_router.decisions import durations
from e2e.kubernetes import models
from e2e.kubernetes.audit import AuditLog, Call, ok
from e2e.kubernetes.conftest import CONTROLLER_NAMESPACE, CONTROLLER_USER
from e2e.kubernetes.containers import container_pid, restarts
from e2e.kubernetes.kube import MODEL_CHART, Helm, Json, Kube, is_ready, path
from e2e.kubernetes.timeline import History

NAMESPACE = "team-b"
LEASE = "ctl-drain-router-controller"
CONTROLLER_SELECTOR = "app.kubernetes.io/instance=ctl,app.kubernetes.io/component=controller"
RECYCLED = "kcharec"
DELETED = "kchadel"
LIFETIME_SECS = 10
DRAIN_SECS = 30
"""The recycled pods' drain: the pod the old leader evicts is still terminating when the new one leads."""
SETTLE_SECS = 40
"""The deleted service's route settle: longer than the failover, so the new leader resumes it."""
ROUND_TRIP_SECS = 1.0
"""The bound's "plus one API round trip", on a machine other scenarios load."""
#: The scenario's own time; the session's setup (the machine's lock, the cluster) is not counted.
pytestmark = pytest.mark.timeout(600, func_only=True)


def recycled_values() -> dict[str, Any]:
    return models.fake_model_values(
        NAMESPACE, RECYCLED, drain_secs=DRAIN_SECS, grace_secs=DRAIN_SECS + 15, model_service=True,
        extra={"modelService": {
            "enabled": True,
            "recycling": {"enabled": True, "maxPodLifetimeSeconds": LIFETIME_SECS},
            "deletion": {"routeSettle": "2s"},
        }},
    )  # fmt: skip


def deleted_values() -> dict[str, Any]:
    return models.fake_model_values(
        NAMESPACE, DELETED, replicas=1, model_service=True,
        extra={"modelService": {"enabled": True, "deletion": {"routeSettle": f"{SETTLE_SECS}s"}}},
    )  # fmt: skip


def pod_of(identity: str) -> str:
    """A holder identity is the pod name plus a random suffix per process."""
    return identity.rsplit("_", 1)[0]


def retry_period(deployment: Json) -> float:
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return float(args[args.index("--leader-election-retry-period") + 1])


async def _now(value: object) -> object:
    return value


async def test_a_crashed_leader_is_replaced_within_the_bound_and_nothing_is_done_twice(
    kube: Kube, helm: Helm, report: list[str]
) -> None:
    started, begun = time.monotonic(), time.time()
    audit = AuditLog(kube.cluster.audit_log, whole=True)
    lease_path = path("Lease", CONTROLLER_NAMESPACE) + f"?fieldSelector=metadata.name%3D{LEASE}"
    leases = History(kube.api, lease_path)
    await leases.start()
    controller = await kube.get("Deployment", CONTROLLER_NAMESPACE, LEASE)
    assert controller is not None
    retry = retry_period(controller)
    try:
        helm.install(RECYCLED, MODEL_CHART, NAMESPACE, recycled_values())
        helm.install(DELETED, MODEL_CHART, NAMESPACE, deleted_values())
        lease = await kube.get("Lease", CONTROLLER_NAMESPACE, LEASE)
        assert lease is not None
        old_identity = lease["spec"]["holderIdentity"]
        duration = int(lease["spec"]["leaseDurationSeconds"])
        leader = pod_of(old_identity)
        pods = await kube.list("Pod", CONTROLLER_NAMESPACE, CONTROLLER_SELECTOR)
        assert len(pods) == 2 and all(is_ready(p) for p in pods), [p["metadata"]["name"] for p in pods]
        standby = next(p["metadata"]["name"] for p in pods if p["metadata"]["name"] != leader)
        leader_pod = next(p for p in pods if p["metadata"]["name"] == leader)
        restarted_before = restarts(leader_pod)

        # A deletion in progress: the old leader removed the route and waits out the settle.
        helm.uninstall(DELETED, NAMESPACE, wait=False)
        await kube.wait("the deletion settling", lambda: stage(kube, f"{DELETED}-drain-router", "RouteSettling"))
        # A recycle in progress: the old leader's last eviction still terminating.
        evicted = await kube.wait(
            "an eviction by the leader, its pod still terminating", lambda: fresh_eviction(kube, audit, leader)
        )

        os.killpg(container_pid(leader_pod, "controller"), signal.SIGKILL)
        killed = time.time()

        def taken() -> Json | None:
            spec = leases.current().get(LEASE, {}).get("spec", {})
            return spec if (spec.get("holderIdentity") or "").startswith(f"{standby}_") else None

        new = await kube.wait("the standby holding the Lease", lambda: _now(taken()), timeout=duration + 30)
        assert not leases.resyncs, "the Lease's watch broke: a renewal may be missing from its history"
        last_renewal = max(
            durations.parse_time(c.obj["spec"]["renewTime"])
            for c in leases.changes
            if c.obj["spec"].get("holderIdentity") == old_identity
        )
        takeover = durations.parse_time(new["acquireTime"]) - last_renewal
        assert last_renewal <= killed, "a renewal after the kill"
        assert duration <= takeover <= duration + retry + ROUND_TRIP_SECS, (
            f"taken {takeover:.3f} s after the last renewal; the bound is {duration} + {retry:g} s"
        )
        assert new["leaseTransitions"] == lease["spec"]["leaseTransitions"] + 1, (lease["spec"], new)

        # The new leader finishes the deletion and goes on recycling.
        await kube.wait_gone("ModelService", NAMESPACE, f"{DELETED}-drain-router", timeout=120)
        await kube.wait(
            "an eviction by the new leader",
            lambda: _now([c for c in audit.evictions(CONTROLLER_USER, NAMESPACE) if ok(c.code) and c.pod == standby]),
            timeout=90,
        )
        # The killed container is back, as a standby; both replicas Ready again.
        await kube.wait("the killed controller restarted and Ready", lambda: restarted(kube, leader, restarted_before))
        lease_now = await kube.get("Lease", CONTROLLER_NAMESPACE, LEASE)
        assert lease_now is not None and pod_of(lease_now["spec"]["holderIdentity"]) == standby

        acquired = durations.parse_time(new["acquireTime"])
        check_one_actor(audit, leader=leader, standby=standby, since=begun, killed=killed, acquired=acquired)
        deletes = check_deleted_once(audit, leader=leader, standby=standby)
        evictions = check_evicted_once(audit)
        report.append(
            f"takeover {takeover:.2f} s after the last renewal (bound {duration} + {retry:g} s), "
            f"{acquired - killed:.2f} s after the SIGKILL; leaseTransitions "
            f"{lease['spec']['leaseTransitions']} -> {new['leaseTransitions']}; evicted {evicted} before the kill; "
            f"{evictions} evictions, each pod once; deletes {deletes}; {time.monotonic() - started:.0f} s"
        )
    finally:
        await leases.stop()
        helm.uninstall(DELETED, NAMESPACE)
        helm.uninstall(RECYCLED, NAMESPACE)


async def restarted(kube: Kube, name: str, before: int) -> bool:
    pods = await kube.list("Pod", CONTROLLER_NAMESPACE, CONTROLLER_SELECTOR)
    mine = [p for p in pods if p["metadata"]["name"] == name]
    return len(pods) == 2 and all(is_ready(p) for p in pods) and restarts(mine[0]) > before


async def stage(kube: Kube, name: str, wanted: str) -> bool:
    found = await kube.get("ModelService", NAMESPACE, name)
    return bool(((found or {}).get("status") or {}).get("deletion", {}).get("stage") == wanted)


async def fresh_eviction(kube: Kube, audit: AuditLog, leader: str) -> str | None:
    """A pod the leader evicted that is still terminating (its drain holds it DRAIN_SECS)."""
    by_leader = {c.name for c in audit.evictions(CONTROLLER_USER, NAMESPACE) if ok(c.code) and c.pod == leader}
    selector = f"app.kubernetes.io/instance={RECYCLED}"
    for pod in await kube.list("Pod", NAMESPACE, selector):
        name = pod["metadata"]["name"]
        if name in by_leader and pod["metadata"].get("deletionTimestamp"):
            return str(name)
    return None


def check_one_actor(
    audit: AuditLog, *, leader: str, standby: str, since: float, killed: float, acquired: float
) -> None:
    """Never two actors: from ``since`` until it took the Lease the standby only read the Lease; after
    the kill the old leader's pod (its restarted container, a standby now) only read the Lease."""
    for c in audit.by(CONTROLLER_USER):
        if c.received < since:
            continue
        idle = (c.pod == standby and c.received < acquired) or (c.pod == leader and c.received > killed)
        assert not idle or (c.resource, c.verb) == ("leases", "get"), f"a standby acted: {c}"


def check_deleted_once(audit: AuditLog, *, leader: str, standby: str) -> str:
    """Each object of the deleted service deleted exactly once: the route by the old leader, before
    the kill; the Deployment and the Service by the new leader."""
    name = f"{DELETED}-drain-router"
    deletes: dict[str, list[Call]] = {}
    for c in audit.by(CONTROLLER_USER, NAMESPACE):
        if c.verb == "delete" and c.name == name:
            deletes.setdefault(c.resource, []).append(c)
    expected = {"httproutes": leader, "deployments": standby, "services": standby}
    for resource, by in expected.items():
        calls = deletes.get(resource, [])
        assert len(calls) == 1 and ok(calls[0].code) and calls[0].pod == by, (
            f"{resource}/{name}: {[str(c) for c in calls]}, wanted one by {by}"
        )
    assert set(deletes) == set(expected), sorted(deletes)
    return ", ".join(f"{r} by {'old' if by == leader else 'new'} leader" for r, by in expected.items())


def check_evicted_once(audit: AuditLog) -> int:
    """No pod evicted twice (a second eviction of a terminating pod is accepted by the API server:
    only the controller can keep from asking)."""
    admitted = Counter(
        c.name for c in audit.evictions(CONTROLLER_USER, NAMESPACE) if ok(c.code) and c.name.startswith(f"{RECYCLED}-")
    )
    twice = {name: n for name, n in admitted.items() if n > 1}
    assert not twice, f"evicted more than once: {twice}"
    return len(admitted)
