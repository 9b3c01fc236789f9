"""The controller's settings: one frozen object built by the ``controller`` subcommand. No kopf here."""

from __future__ import annotations

import dataclasses

from router.decisions import lifecycle, recycling

DEFAULT_REQUEUE_SECS = 5.0
DEFAULT_MAX_SLEEP_SECS = 60.0
DEFAULT_METRICS_PORT = 9092


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
