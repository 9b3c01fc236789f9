"""Pod recycling: evict one pod past its maximum lifetime at a time, only when its router is idle.

Purely computational, no side effects. The caller observes the Deployment and the service's pods and
calls :func:`next_recycle` with ``probe=None``; when the decision is ``Probe`` it asks the candidate's
router (``GET /admin/inflight``) and calls again with the answer. On ``Evict`` it creates the
Eviction and hands the API server's answer to :func:`after_eviction`. Either way it writes
``decision.held`` to ``status.recycling.held``, sets the ``RecycleHeld`` condition
(:func:`condition_for`), posts
``decision.events`` and looks again at ``decision.requeue_at`` (``None``: the standard requeue).

Gates, in order: exactly one Deployment in ``spec.workload``, not labelled for another service; the
Deployment stable (generation observed, every replica count equal to ``spec.replicas``); every active
pod Ready, not terminating, started; as many active pods as ``status.replicas``. The candidate is
the expired pod with the earliest deadline, ties by name. An expired pod not evicted this pass is
held, and the record of it says why.

Modules, each importable on its own; this facade re-exports their public names: ``records`` (the
constants, the spec, observations, probe and eviction answers, the held record, the decision) and
``choice`` (:func:`next_recycle`, :func:`after_eviction`, :func:`condition_for`).
"""

from drain_router.decisions.recycling.choice import (
    CONDITION_TYPE,
    after_eviction,
    condition_for,
    deadline_of,
    next_recycle,
)
from drain_router.decisions.recycling.records import (
    IDLE_PROBE_TIMEOUT_SECS,
    IDLE_RECHECK_SECS,
    MAX_LIFETIME_SECS,
    RECYCLE_RETRY_SECS,
    RECYCLE_SETTLE_SECS,
    SERVING,
    DeploymentObservation,
    EventReason,
    EvictAnswer,
    EvictedRecord,
    HeldRecord,
    HoldReason,
    Kind,
    ProbeResult,
    RecycleDecision,
    RecyclingSpec,
    WorkloadObservation,
)

__all__ = [
    "CONDITION_TYPE",
    "IDLE_PROBE_TIMEOUT_SECS",
    "IDLE_RECHECK_SECS",
    "MAX_LIFETIME_SECS",
    "RECYCLE_RETRY_SECS",
    "RECYCLE_SETTLE_SECS",
    "SERVING",
    "DeploymentObservation",
    "EventReason",
    "EvictAnswer",
    "EvictedRecord",
    "HeldRecord",
    "HoldReason",
    "Kind",
    "ProbeResult",
    "RecycleDecision",
    "RecyclingSpec",
    "WorkloadObservation",
    "after_eviction",
    "condition_for",
    "deadline_of",
    "next_recycle",
]
