"""``recycling.next_recycle`` and ``recycling.after_eviction`` from ``tests/cases/recycling/``."""

from __future__ import annotations

from typing import Any

import pytest

from drain_router.decisions import durations, objects, recycling
from tests import casefiles

T0 = durations.parse_time("2025-01-01T00:00:00Z")
DEFAULT_PODS = [{"name": "a", "start": 0}, {"name": "b", "start": 10}]
ROWS = casefiles.params(casefiles.load("recycling/next-recycle.yaml"))


def _pod(data: dict[str, Any]) -> objects.Pod:
    start = data.get("start")
    return objects.Pod(
        name=data["name"],
        uid=data.get("uid", f"uid-{data['name']}"),
        phase=data.get("phase", "Running"),
        ready=data.get("ready", True),
        deletion_timestamp=T0 + 10_000 if data.get("terminating", False) else None,
        start_time=None if start is None else T0 + start,
    )


def _deployments(row: dict[str, Any], active: int) -> tuple[recycling.DeploymentObservation, ...]:
    if "deployments" in row:
        return tuple(recycling.DeploymentObservation(name=d["name"], owned=True) for d in row["deployments"])
    d = row.get("deployment", {})
    desired = d.get("specReplicas", active)
    counts = {
        k: d.get(k, active if desired is None else desired) for k in ("replicas", "updated", "ready", "available")
    }
    return (
        recycling.DeploymentObservation(
            name="llama",
            exists=d.get("exists", True),
            owned=d.get("owned", True),
            generation=d.get("generation", 1),
            observed_generation=d.get("observedGeneration", 1),
            spec_replicas=desired,
            replicas=counts["replicas"],
            updated_replicas=counts["updated"],
            ready_replicas=counts["ready"],
            available_replicas=counts["available"],
        ),
    )


def _held(data: dict[str, Any] | None) -> recycling.HeldRecord | None:
    if data is None:
        return None
    return recycling.HeldRecord(
        pod=data["pod"],
        uid=data.get("uid", f"uid-{data['pod']}"),
        reason=recycling.HoldReason(data["reason"]),
        since=T0 + data["since"],
        retry_at=None if data.get("retryAt") is None else T0 + data["retryAt"],
    )


def _evicted(data: dict[str, Any] | None) -> recycling.EvictedRecord | None:
    if data is None:
        return None
    return recycling.EvictedRecord(pod=data["pod"], uid=data.get("uid", f"uid-{data['pod']}"), at=T0 + data["at"])


@pytest.mark.parametrize("row", ROWS)
def test_next_recycle(row: dict[str, Any]) -> None:
    s = row.get("spec", {"maxPodLifetimeSeconds": 100})
    spec = recycling.RecyclingSpec(
        max_pod_lifetime_seconds=s["maxPodLifetimeSeconds"],
        wait_for_idle=s.get("waitForIdle", True),
        idle_timeout_seconds=s.get("maxPodLifetimeIdleTimeoutSeconds"),
    )
    pods = tuple(_pod(p) for p in row.get("pods", DEFAULT_PODS))
    active = sum(1 for p in pods if p.active)
    obs = recycling.WorkloadObservation(service="llama", deployments=_deployments(row, active), pods=pods)
    now = T0 + row["now"]
    held = _held(row.get("held"))
    last = _evicted(row.get("lastEvicted"))
    probe = None
    if "probe" in row:
        first = recycling.next_recycle(spec, obs, None, held, now, last_evicted=last)
        assert first.kind is recycling.Kind.PROBE, "a probe answer is only given after a Probe decision"
        assert first.pod is not None
        p = row["probe"]
        probe = recycling.ProbeResult(
            uid=p.get("uid", first.pod.uid),
            code=p.get("code"),
            inflight=p.get("inflight"),
            queued=p.get("queued", 0),
            state=p.get("state"),
            error=p.get("error"),
        )
    decision = recycling.next_recycle(spec, obs, probe, held, now, last_evicted=last)
    assert decision == recycling.next_recycle(spec, obs, probe, held, now, last_evicted=last), "pure"
    if "answer" in row:
        assert decision.kind is recycling.Kind.EVICT
        a = row["answer"]
        answer = recycling.EvictAnswer(
            code=a["code"],
            reason=a.get("reason"),
            cause=a.get("cause"),
            message=a.get("message", ""),
            failure=a.get("failure", False),
        )
        decision = recycling.after_eviction(decision, answer, now)

    expect = row["expect"]
    assert decision.kind.value == expect["kind"]
    if "pod" in expect:
        assert decision.pod is not None and decision.pod.name == expect["pod"]
    if "reason" in expect:
        assert decision.reason is not None and decision.reason.value == expect["reason"]
    if "requeueAt" in expect:
        assert decision.requeue_at == (None if expect["requeueAt"] is None else T0 + expect["requeueAt"])
    if "events" in expect:
        assert [e.reason.value for e in decision.events] == expect["events"]
    if "messageContains" in expect:
        assert any(expect["messageContains"] in e.message for e in decision.events), decision.events
    if "held" in expect:
        got = (
            None
            if decision.held is None
            else {"pod": decision.held.pod, "reason": decision.held.reason.value, "since": decision.held.since - T0}
        )
        assert got == expect["held"]
    if "retryAt" in expect:
        assert decision.held is not None
        assert decision.held.retry_at == (None if expect["retryAt"] is None else T0 + expect["retryAt"])
    if "lastEvicted" in expect:
        record = decision.last_evicted
        got_record = None if record is None else {"pod": record.pod, "at": record.at - T0}
        assert got_record == expect["lastEvicted"]
    if "condition" in expect:
        cond = recycling.condition_for(decision.held, now, decision.last_evicted)
        assert (cond.type, {"status": cond.status, "reason": cond.reason}) == ("RecycleHeld", expect["condition"])
    if decision.kind is recycling.Kind.HOLD:
        assert decision.held is not None and decision.held.reason is decision.reason
