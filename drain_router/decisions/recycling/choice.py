"""Pod recycling's choice: which expired pod to evict, when, and what an eviction's answer means.

Purely computational, no side effects; ``now`` is Unix seconds everywhere. The records it reads and
returns are in ``records``; the package docstring describes the pass as the controller runs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drain_router.decisions.objects import Condition, Event, Pod
from drain_router.decisions.recycling.records import (
    IDLE_RECHECK_SECS,
    MAX_LIFETIME_SECS,
    RECYCLE_RETRY_SECS,
    RECYCLE_SETTLE_SECS,
    EventReason,
    EvictedRecord,
    HeldRecord,
    HoldReason,
    Kind,
    RecycleDecision,
)

if TYPE_CHECKING:  # what the caller observed and was answered: read here, never built
    from drain_router.decisions.recycling.records import (
        DeploymentObservation,
        EvictAnswer,
        ProbeResult,
        RecyclingSpec,
        WorkloadObservation,
    )


CONDITION_TYPE = "RecycleHeld"
"""``True`` while a pod is held (reason: why), ``False`` when none is."""


def condition_for(held: HeldRecord | None, now: float, last_evicted: EvictedRecord | None = None) -> Condition:
    """``RecycleHeld`` for what ``status.recycling.held`` says: the reason, the pod and how long it
    has been overdue; while nothing is held and our last eviction settles, that it does."""
    if held is None and last_evicted is not None:
        return Condition(
            type=CONDITION_TYPE,
            status="False",
            reason="Recycling",
            message=f"pod {last_evicted.pod} evicted {max(now - last_evicted.at, 0.0):.0f}s ago; "
            "the next waits for its replacement",
        )
    if held is None:
        return Condition(type=CONDITION_TYPE, status="False", reason="NothingHeld", message="no expired pod is held")
    overdue = max(now - held.since, 0.0)
    return Condition(
        type=CONDITION_TYPE,
        status="True",
        reason=held.reason.value,
        message=f"pod {held.pod} overdue by {overdue:.0f}s, not recycled: {held.reason.value}",
    )


def deadline_of(spec: RecyclingSpec, pod: Pod) -> float | None:
    if pod.start_time is None:
        return None
    return pod.start_time + min(spec.max_pod_lifetime_seconds, MAX_LIFETIME_SECS)


def next_recycle(
    spec: RecyclingSpec,
    obs: WorkloadObservation,
    probe: ProbeResult | None,
    held: HeldRecord | None,
    now: float,
    *,
    last_evicted: EvictedRecord | None = None,
    recheck_secs: float = IDLE_RECHECK_SECS,
    settle_secs: float = RECYCLE_SETTLE_SECS,
) -> RecycleDecision:
    """One recycling pass. Purely computational function with no side effects; ``now`` is Unix seconds.
    ``last_evicted`` is the stored ``status.recycling.lastEvicted``: while the Deployment is unstable
    for at most ``settle_secs`` (:data:`RECYCLE_SETTLE_SECS`) after it, the next expired pod waits
    unreported. ``recheck_secs`` (:data:`IDLE_RECHECK_SECS`) and ``settle_secs`` are shortened only by
    tests."""
    active = [p for p in obs.pods if p.active]
    deadlines = {p.name: d for p in active if (d := deadline_of(spec, p)) is not None}
    expired = sorted((d, p.name, p) for p in active if (d := deadlines.get(p.name)) is not None and now >= d)
    deployment, gate = _gate(obs, active)
    settling = (
        last_evicted
        if last_evicted is not None and gate in _SETTLING_GATES and now < last_evicted.at + settle_secs
        else None
    )
    if deployment is not None and _desired(deployment) == 0:
        return RecycleDecision(kind=Kind.NOTHING)
    if not expired:
        return RecycleDecision(
            kind=Kind.NOTHING, last_evicted=settling, requeue_at=min(deadlines.values()) if deadlines else None
        )
    deadline, _, pod = expired[0]
    if settling is not None:  # our own eviction's replacement is coming up: not a hold, not news
        return RecycleDecision(kind=Kind.NOTHING, pod=pod, deadline=deadline, last_evicted=settling)
    if gate is not None:
        return _hold(pod, deadline, gate, held, requeue_at=None)
    if held is not None and held.uid == pod.uid and held.retry_at is not None and now < held.retry_at:
        return _hold(pod, deadline, held.reason, held, requeue_at=held.retry_at, retry_at=held.retry_at)
    timeout = spec.idle_timeout_seconds
    if not spec.wait_for_idle or timeout == 0 or (timeout is not None and now >= deadline + timeout):
        return RecycleDecision(kind=Kind.EVICT, pod=pod, deadline=deadline, held=held)
    if probe is None or probe.uid != pod.uid:
        return RecycleDecision(kind=Kind.PROBE, pod=pod, deadline=deadline, held=held)
    if probe.idle:
        return RecycleDecision(kind=Kind.EVICT, pod=pod, deadline=deadline, held=held)
    recheck = now + recheck_secs
    if timeout is not None:
        recheck = min(recheck, deadline + timeout)
    reason = HoldReason.IDLE_PROBE_FAILED if probe.failed else HoldReason.BUSY
    return _hold(pod, deadline, reason, held, requeue_at=recheck)


def after_eviction(
    decision: RecycleDecision, answer: EvictAnswer, now: float, *, retry_secs: float = RECYCLE_RETRY_SECS
) -> RecycleDecision:
    """What an Evict decision became, given the API server's answer. Purely computational, no side
    effects. 2xx: recycled, standard requeue. 404/409: the pod is gone or replaced, observe again.
    429: held by a PodDisruptionBudget. 403: forbidden. Anything else (a 500 for a pod under two
    PDBs, a 2xx saying Failure): failed. The last three retry after ``retry_secs``
    (:data:`RECYCLE_RETRY_SECS`, shortened only by tests)."""
    pod, deadline = decision.pod, decision.deadline
    assert decision.kind is Kind.EVICT and pod is not None and deadline is not None, decision
    retry = now + retry_secs
    if 200 <= answer.code < 300 and not answer.failure:
        return RecycleDecision(
            kind=Kind.NOTHING,
            pod=pod,
            last_evicted=EvictedRecord(pod=pod.name, uid=pod.uid, at=now),
            events=(
                Event(
                    type="Normal",
                    reason=EventReason.POD_RECYCLED,
                    message=f"pod {pod.name} evicted: past its maximum lifetime",
                ),
            ),
        )
    if answer.code in (404, 409):
        return RecycleDecision(kind=Kind.NOTHING)
    if answer.code == 429:
        return _hold(pod, deadline, HoldReason.DISRUPTION_BUDGET, decision.held, requeue_at=retry, retry_at=retry)
    if answer.code == 403:
        warning = Event(
            type="Warning",
            reason=EventReason.POD_RECYCLE_FORBIDDEN,
            message=f"create pods/eviction forbidden for pod {pod.name}: {answer.message}; retrying in {retry_secs:g}s",
        )
        return _hold(
            pod, deadline, HoldReason.FORBIDDEN, decision.held, requeue_at=retry, retry_at=retry, extra=(warning,)
        )
    warning = Event(
        type="Warning",
        reason=EventReason.POD_RECYCLE_FAILED,
        message=f"eviction of pod {pod.name} failed ({answer.code}): {answer.message}",
    )
    return _hold(
        pod, deadline, HoldReason.EVICTION_FAILED, decision.held, requeue_at=retry, retry_at=retry, extra=(warning,)
    )


_SETTLING_GATES = (HoldReason.WORKLOAD_UNSTABLE, HoldReason.FOREIGN_POD)
"""What our own eviction causes until its replacement is Ready and counted: the evicted pod
terminating, the replica counts short, the active pods one fewer than a lagging ``status.replicas``."""


def _desired(deployment: DeploymentObservation) -> int:
    return 1 if deployment.spec_replicas is None else deployment.spec_replicas


def _gate(obs: WorkloadObservation, active: list[Pod]) -> tuple[DeploymentObservation | None, HoldReason | None]:
    """(the Deployment when there is exactly one, the first gate that holds or ``None``)."""
    if len(obs.deployments) != 1 or not obs.deployments[0].exists:
        return None, HoldReason.NO_DEPLOYMENT
    deployment = obs.deployments[0]
    if not deployment.owned:
        return deployment, HoldReason.NOT_OWNED
    desired = _desired(deployment)
    counts = (
        deployment.replicas,
        deployment.updated_replicas,
        deployment.ready_replicas,
        deployment.available_replicas,
    )
    if deployment.observed_generation != deployment.generation or any(c != desired for c in counts):
        return deployment, HoldReason.WORKLOAD_UNSTABLE
    if any(p.terminating or not p.ready or p.start_time is None for p in active):
        return deployment, HoldReason.WORKLOAD_UNSTABLE
    if len(active) != deployment.replicas:
        return deployment, HoldReason.FOREIGN_POD
    return deployment, None


def _hold(
    pod: Pod,
    deadline: float,
    reason: HoldReason,
    previous: HeldRecord | None,
    requeue_at: float | None,
    extra: tuple[Event, ...] = (),
    retry_at: float | None = None,
) -> RecycleDecision:
    """Hold ``pod``: record why; ``PodRecycleHeld`` only the first time this pod (by UID) is held."""
    record = HeldRecord(pod=pod.name, uid=pod.uid, reason=reason, since=deadline, retry_at=retry_at)
    first = previous is None or previous.uid != pod.uid
    events = extra + (
        (
            Event(
                type="Warning",
                reason=EventReason.POD_RECYCLE_HELD,
                message=f"pod {pod.name} is past its maximum lifetime and not recycled: {reason.value}",
            ),
        )
        if first
        else ()
    )
    return RecycleDecision(
        kind=Kind.HOLD, pod=pod, deadline=deadline, reason=reason, held=record, events=events, requeue_at=requeue_at
    )
