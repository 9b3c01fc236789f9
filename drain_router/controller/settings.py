"""The controller's settings: one frozen object built by the ``controller`` subcommand. No kopf here."""

from __future__ import annotations

import dataclasses

from drain_router.decisions import lifecycle, recycling

DEFAULT_REQUEUE_SECS = 5.0
DEFAULT_MAX_SLEEP_SECS = 60.0
DEFAULT_METRICS_PORT = 9092
DEFAULT_LEASE_NAME = "drain-router-controller"
DEFAULT_LEASE_DURATION_SECS = 15
DEFAULT_RENEW_DEADLINE_SECS = 10.0
DEFAULT_RETRY_PERIOD_SECS = 2.0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ControllerSettings:
    namespaces: tuple[str, ...] = ()
    """Namespaces to watch ModelServices in. Empty only together with ``all_namespaces``."""
    all_namespaces: bool = False
    """Watch the whole cluster (needs a ClusterRole instead of a Role)."""
    metrics_port: int = DEFAULT_METRICS_PORT
    """Prometheus ``/metrics`` port; 0 disables the listener. 9092: next to the router's 9091."""
    requeue_secs: float = DEFAULT_REQUEUE_SECS
    """Every wait of the staged deletion is a requeue after this many seconds (the route settle waits
    for its exact remainder instead). 5 s: short against a 60 s settle and a 30 s pod grace, cheap in
    API calls (a handful of GETs per ModelService being deleted)."""
    log_format: str = "json"
    """``json`` (one object a line on stdout, as the router logs) or ``console`` (for a terminal)."""
    log_level: str = "info"
    """kopf's and the controller's log level."""
    liveness_port: int = 0
    """Port of kopf's liveness endpoint ``/healthz`` (on 0.0.0.0), for the pod's livenessProbe; 0: none."""
    read_nodes: bool = True
    """Read the node of a pod stuck terminating (nodes are cluster-scoped: needs a ClusterRole). Off, in
    a namespaced install without one, every pod's node counts as Ready: a pod past its grace counts
    until grace + 5 min instead of being let go at once when its node is NotReady or gone."""
    finalizer: str = "drainrouter.dev/staged-deletion"
    """The finalizer that holds a ModelService until its teardown is over."""
    max_sleep_secs: float = DEFAULT_MAX_SLEEP_SECS
    """The recycling/lifecycle loop of a ModelService sleeps until its decisions' earliest requeue
    time, but never longer than this: a spec change or a person scaling the Deployment back up
    (which wakes a scaled-to-zero service) is noticed within it. 60 s: a few cheap reads and one
    probe per pod per minute per ModelService."""
    idle_probe_timeout_secs: float = recycling.IDLE_PROBE_TIMEOUT_SECS
    """The idle probe's whole-request timeout (a timeout is a failed probe). Shortened only by tests."""
    idle_recheck_secs: float = recycling.IDLE_RECHECK_SECS
    """Probe a busy (or unanswering) recycling candidate again after this long. Shortened only by tests."""
    recycle_retry_secs: float = recycling.RECYCLE_RETRY_SECS
    """Retry a refused eviction (PDB 429, 403, any other failure) after this long. 30 s as in the
    seed; shortened only by tests."""
    recycle_settle_secs: float = recycling.RECYCLE_SETTLE_SECS
    """After an eviction of ours, how long the next expired pod may wait for the replacement without
    a ``PodRecycleHeld`` warning. 600 s, a Deployment's default progress deadline; shortened only by
    tests."""
    lifecycle_buffer_secs: float = lifecycle.LIFECYCLE_REQUEUE_BUFFER_SECS
    """Look again this long after a lifecycle rule's due time. Shortened only by tests."""
    leader_election: bool = False
    """Run the operator only while holding the ``coordination.k8s.io/v1`` Lease ``lease_name`` in
    ``lease_namespace``, so that of several replicas exactly one acts (the CLI turns it on by
    default; off: this process acts at once, and must be the only one)."""
    lease_name: str = DEFAULT_LEASE_NAME
    """The Lease every replica of one install competes for (the chart: the release's full name)."""
    lease_namespace: str = ""
    """The Lease's namespace: the controller's own (the chart passes it from the downward API)."""
    identity: str = ""
    """This process's ``holderIdentity``: the pod name plus a per-process suffix (set by the CLI)."""
    lease_duration_secs: int = DEFAULT_LEASE_DURATION_SECS
    """How long a standby waits, from the moment it sees a renewal, before it takes the Lease from a
    holder that stopped renewing (the Lease's ``leaseDurationSeconds``; whole seconds, as the API
    stores it). A dead leader is replaced within ``lease_duration_secs + retry_period_secs``. 15 s
    as in client-go: long against API server hiccups, short against a pod rescheduling."""
    renew_deadline_secs: float = DEFAULT_RENEW_DEADLINE_SECS
    """A leader that has not renewed for this long (counted from the moment it sent its last
    successful renewal) stops acting: the process exits with ``EXIT_LEADERSHIP_LOST`` so Kubernetes
    restarts it as a standby. Strictly less than ``lease_duration_secs``: the difference is the
    margin for a request already sent to land and for the two replicas' clocks running at different
    rates (only durations are compared, never two clocks' readings). 10 s as in client-go."""
    retry_period_secs: float = DEFAULT_RETRY_PERIOD_SECS
    """A leader renews, and a standby looks at the Lease, this often. 2 s as in client-go."""

    def __post_init__(self) -> None:
        if bool(self.namespaces) == self.all_namespaces:
            raise ValueError("give --namespace (one or more) or --all-namespaces, not both and not neither")
        for field in (
            "requeue_secs",
            "max_sleep_secs",
            "idle_probe_timeout_secs",
            "idle_recheck_secs",
            "recycle_retry_secs",
            "recycle_settle_secs",
        ):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field}={getattr(self, field)!r} must be positive")
        if self.lifecycle_buffer_secs < 0:
            raise ValueError(f"lifecycle_buffer_secs={self.lifecycle_buffer_secs!r} must be >= 0")
        for port_field in ("metrics_port", "liveness_port"):
            if not 0 <= getattr(self, port_field) <= 65535:
                raise ValueError(f"{port_field}={getattr(self, port_field)!r} is not a port")
        if self.liveness_port and self.liveness_port == self.metrics_port:
            raise ValueError(f"liveness_port and metrics_port are both {self.metrics_port}")
        if self.leader_election:
            self._check_leader_election()

    def _check_leader_election(self) -> None:
        if not self.lease_name:
            raise ValueError("leader election needs a Lease name (--leader-election-lease)")
        if not self.lease_namespace:
            raise ValueError(
                "leader election needs the Lease's namespace and none was found (no service account "
                "namespace file, not exactly one --namespace): give --leader-election-namespace, or "
                "--no-leader-election for a single replica"
            )
        if not self.identity:
            raise ValueError("leader election needs this process's identity (the pod name)")
        if self.lease_duration_secs < 1:
            raise ValueError(f"lease_duration_secs={self.lease_duration_secs!r} must be at least 1 (whole seconds)")
        if self.retry_period_secs <= 0:
            raise ValueError(f"retry_period_secs={self.retry_period_secs!r} must be positive")
        if not self.renew_deadline_secs < self.lease_duration_secs:
            raise ValueError(
                f"renew_deadline_secs={self.renew_deadline_secs!r} must be less than "
                f"lease_duration_secs={self.lease_duration_secs!r}: a leader that cannot renew must stop "
                "acting before a standby may take the Lease"
            )
        if not self.renew_deadline_secs >= 2 * self.retry_period_secs:
            raise ValueError(
                f"renew_deadline_secs={self.renew_deadline_secs!r} must be at least twice "
                f"retry_period_secs={self.retry_period_secs!r}: a leader gets two tries to renew before it stops"
            )

    @property
    def takeover_bound_secs(self) -> float:
        """The longest a standby waits after the leader's last renewal before it takes over
        (plus one API round trip): it sees the renewal within a retry period, waits the lease
        duration from then, and looks again at once."""
        return self.lease_duration_secs + self.retry_period_secs
