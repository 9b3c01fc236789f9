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
"""

from __future__ import annotations

import dataclasses
import enum

MAX_LIFETIME_SECS = 9_223_372_036.0
"""Lifetimes are clamped below 2^63 ns in seconds, so no deadline overflows anywhere downstream."""
IDLE_PROBE_TIMEOUT_SECS = 2.0
"""The idle probe's whole-request timeout; a timeout is a probe failure (fails closed)."""
IDLE_RECHECK_SECS = 10.0
"""After a busy or failed probe, probe the candidate again this much later."""
RECYCLE_RETRY_SECS = 30.0
"""After a refused eviction (PDB 429, 403, any other failure), try again this much later."""
IGNORED_POD_PHASES = ("Succeeded", "Failed")
SERVING = "serving"


class Kind(str, enum.Enum):
    NOTHING = "Nothing"
    """Nothing expired, nothing to do, or an eviction answered: look again at ``requeue_at``."""
    HOLD = "Hold"
    """A pod is expired and not evicted this pass; ``reason`` says why."""
    PROBE = "Probe"
    """Ask the candidate's router whether it is idle, then call again with the answer."""
    EVICT = "Evict"
    """Create the Eviction for ``pod`` (UID precondition), then call :func:`after_eviction`."""


class HoldReason(str, enum.Enum):
    NO_DEPLOYMENT = "NoDeployment"
    FOREIGN_WORKLOAD = "ForeignWorkload"
    WORKLOAD_UNSTABLE = "WorkloadUnstable"
    FOREIGN_POD = "ForeignPod"
    BUSY = "Busy"
    IDLE_PROBE_FAILED = "IdleProbeFailed"
    DISRUPTION_BUDGET = "DisruptionBudget"
    FORBIDDEN = "Forbidden"
    EVICTION_FAILED = "EvictionFailed"


class EventReason(str, enum.Enum):
    POD_RECYCLED = "PodRecycled"
    POD_RECYCLE_HELD = "PodRecycleHeld"
    POD_RECYCLE_FORBIDDEN = "PodRecycleForbidden"
    POD_RECYCLE_FAILED = "PodRecycleFailed"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RecyclingSpec:
    """``spec.recycling``, parsed by the controller."""

    max_pod_lifetime_seconds: float
    wait_for_idle: bool = True
    """``False``: never probe, evict at the deadline."""
    idle_timeout_seconds: float | None = None
    """``maxPodLifetimeIdleTimeoutSeconds``: ``None`` waits for idle forever; N evicts without probing
    once the pod is overdue by N seconds; 0 never probes."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DeploymentObservation:
    """One ``apps/v1`` Deployment named in ``spec.workload``."""

    name: str
    exists: bool = True
    service_label: str | None = None
    """Value of the ``drainrouter.dev/service`` label, if any."""
    generation: int = 1
    observed_generation: int | None = 1
    spec_replicas: int | None = 1
    """``spec.replicas``; ``None`` is the Kubernetes default, 1."""
    replicas: int = 0
    updated_replicas: int = 0
    ready_replicas: int = 0
    available_replicas: int = 0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RecyclePod:
    name: str
    uid: str
    phase: str = "Running"
    ready: bool = True
    terminating: bool = False
    start_time: float | None = None
    pod_ip: str | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadObservation:
    service: str
    deployments: tuple[DeploymentObservation, ...] = ()
    """Every ``apps/v1`` Deployment listed in ``spec.workload``, in order."""
    pods: tuple[RecyclePod, ...] = ()
    """Pods matching ``spec.podSelector``, any phase."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProbeResult:
    """The candidate's ``/admin/inflight`` answer as the probe saw it."""

    uid: str
    code: int | None = None
    """HTTP status; ``None`` when there was no answer."""
    inflight: int | None = None
    state: str | None = None
    error: str | None = None
    """Connection error, timeout or a body that is not the expected JSON."""

    @property
    def failed(self) -> bool:
        return self.error is not None or self.code != 200 or self.inflight is None or self.state is None

    @property
    def idle(self) -> bool:
        return not self.failed and self.inflight == 0 and self.state == SERVING


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EvictAnswer:
    """The API server's answer to the Eviction: status code, ``Status.reason`` and first cause."""

    code: int
    reason: str | None = None
    cause: str | None = None
    message: str = ""
    failure: bool = False
    """A 2xx whose body says ``status: Failure`` (counts as a failure, not a success)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class HeldRecord:
    """``status.recycling.held``: the expired pod not recycled, and why. ``since`` is its deadline."""

    pod: str
    uid: str
    reason: HoldReason
    since: float
    retry_at: float | None = None
    """After a refused eviction (429, 403, any other failure): no new attempt on this pod before then,
    however often the controller looks (persisted, so a restart keeps the wait)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    type: str
    reason: EventReason
    message: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RecycleCondition:
    """``RecycleHeld``: True while a pod is held (reason: why), False when none is."""

    status: str
    reason: str
    message: str
    type: str = "RecycleHeld"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RecycleDecision:
    kind: Kind
    pod: RecyclePod | None = None
    """The candidate (Probe, Evict, Hold)."""
    deadline: float | None = None
    """The candidate's deadline."""
    reason: HoldReason | None = None
    held: HeldRecord | None = None
    """What ``status.recycling.held`` says after this decision (``None``: nothing held). For Evict,
    the stored record, unchanged until :func:`after_eviction` knows the answer."""
    events: tuple[Event, ...] = ()
    requeue_at: float | None = None


def condition_for(held: HeldRecord | None, now: float) -> RecycleCondition:
    """``RecycleHeld`` for what ``status.recycling.held`` says: the reason, the pod and how long it
    has been overdue."""
    if held is None:
        return RecycleCondition(status="False", reason="NothingHeld", message="no expired pod is held")
    overdue = max(now - held.since, 0.0)
    return RecycleCondition(
        status="True",
        reason=held.reason.value,
        message=f"pod {held.pod} overdue by {overdue:.0f}s, not recycled: {held.reason.value}",
    )


def deadline_of(spec: RecyclingSpec, pod: RecyclePod) -> float | None:
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
    recheck_secs: float = IDLE_RECHECK_SECS,
) -> RecycleDecision:
    """One recycling pass. Purely computational function with no side effects; ``now`` is Unix seconds.
    ``recheck_secs`` (:data:`IDLE_RECHECK_SECS`) is shortened only by tests."""
    active = [p for p in obs.pods if p.phase not in IGNORED_POD_PHASES]
    deadlines = {p.name: d for p in active if (d := deadline_of(spec, p)) is not None}
    expired = sorted((d, p.name, p) for p in active if (d := deadlines.get(p.name)) is not None and now >= d)
    deployment, gate = _gate(obs, active)
    if deployment is not None and _desired(deployment) == 0:
        return RecycleDecision(kind=Kind.NOTHING)
    if not expired:
        return RecycleDecision(kind=Kind.NOTHING, requeue_at=min(deadlines.values()) if deadlines else None)
    deadline, _, pod = expired[0]
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


def _desired(deployment: DeploymentObservation) -> int:
    return 1 if deployment.spec_replicas is None else deployment.spec_replicas


def _gate(obs: WorkloadObservation, active: list[RecyclePod]) -> tuple[DeploymentObservation | None, HoldReason | None]:
    """(the Deployment when there is exactly one, the first gate that holds or ``None``)."""
    if len(obs.deployments) != 1 or not obs.deployments[0].exists:
        return None, HoldReason.NO_DEPLOYMENT
    deployment = obs.deployments[0]
    if deployment.service_label is not None and deployment.service_label != obs.service:
        return deployment, HoldReason.FOREIGN_WORKLOAD
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
    pod: RecyclePod,
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
