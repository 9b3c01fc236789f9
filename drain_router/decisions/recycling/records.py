"""The records of pod recycling: the parsed spec, what the controller observed and was answered, what
is held, and the decision a pass returns, with the constants they share.

Purely computational, no side effects; the controller parses the API objects into these. The choice
itself (:func:`next_recycle`, :func:`after_eviction`) is in ``choice``.
"""

from __future__ import annotations

import dataclasses
import enum

from drain_router.decisions.objects import Event, Pod

MAX_LIFETIME_SECS = 9_223_372_036.0
"""Lifetimes are clamped below 2^63 ns in seconds, so no deadline overflows anywhere downstream."""
IDLE_PROBE_TIMEOUT_SECS = 2.0
"""The idle probe's whole-request timeout; a timeout is a probe failure (fails closed)."""
IDLE_RECHECK_SECS = 10.0
"""After a busy or failed probe, probe the candidate again this much later."""
RECYCLE_RETRY_SECS = 30.0
"""After a refused eviction (PDB 429, 403, any other failure), try again this much later."""
RECYCLE_SETTLE_SECS = 600.0
"""After an eviction of ours, the Deployment is unstable while the replacement comes up: the next
expired pod waits without a ``PodRecycleHeld`` warning (our own recycle in progress is not news) for
at most this long. 600 s: a Deployment's default ``progressDeadlineSeconds``; past it, the replacement
is stuck and the hold is reported."""
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


class HoldReason(enum.StrEnum):
    NO_DEPLOYMENT = "NoDeployment"
    NOT_OWNED = "NotOwned"
    WORKLOAD_UNSTABLE = "WorkloadUnstable"
    FOREIGN_POD = "ForeignPod"
    BUSY = "Busy"
    IDLE_PROBE_FAILED = "IdleProbeFailed"
    DISRUPTION_BUDGET = "DisruptionBudget"
    FORBIDDEN = "Forbidden"
    EVICTION_FAILED = "EvictionFailed"


class EventReason(enum.StrEnum):
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
    owned: bool = False
    """The service owns it (:func:`ownership.check`): a Deployment it does not own holds recycling."""
    generation: int = 1
    observed_generation: int | None = 1
    spec_replicas: int | None = 1
    """``spec.replicas``; ``None`` is the Kubernetes default, 1."""
    replicas: int = 0
    updated_replicas: int = 0
    ready_replicas: int = 0
    available_replicas: int = 0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadObservation:
    service: str
    deployments: tuple[DeploymentObservation, ...] = ()
    """Every ``apps/v1`` Deployment listed in ``spec.workload``, in order."""
    pods: tuple[Pod, ...] = ()
    """Pods matching ``spec.podSelector`` that the service owns (each with its consent), any phase."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProbeResult:
    """The candidate's ``/admin/inflight`` answer as the probe saw it."""

    uid: str
    code: int | None = None
    """HTTP status; ``None`` when there was no answer."""
    inflight: int | None = None
    queued: int = 0
    """Requests waiting in the router's admission queue (0 from a router that predates it)."""
    state: str | None = None
    error: str | None = None
    """Connection error, timeout or a body that is not the expected JSON."""

    @property
    def failed(self) -> bool:
        return self.error is not None or self.code != 200 or self.inflight is None or self.state is None

    @property
    def idle(self) -> bool:
        return not self.failed and self.inflight == 0 and self.queued == 0 and self.state == SERVING


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
class EvictedRecord:
    """``status.recycling.lastEvicted``: our latest eviction, kept while its replacement comes up (the
    Deployment unstable) and at most :data:`RECYCLE_SETTLE_SECS`."""

    pod: str
    uid: str
    at: float


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RecycleDecision:
    kind: Kind
    pod: Pod | None = None
    """The candidate (Probe, Evict, Hold)."""
    deadline: float | None = None
    """The candidate's deadline."""
    reason: HoldReason | None = None
    held: HeldRecord | None = None
    """What ``status.recycling.held`` says after this decision (``None``: nothing held). For Evict,
    the stored record, unchanged until :func:`after_eviction` knows the answer."""
    last_evicted: EvictedRecord | None = None
    """What ``status.recycling.lastEvicted`` says after this decision: set by a successful eviction,
    kept while the Deployment settles, cleared once it is stable (or the settle bound passed)."""
    events: tuple[Event, ...] = ()
    requeue_at: float | None = None
