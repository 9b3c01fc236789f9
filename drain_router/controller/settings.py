"""The controller's settings: one frozen object built by the ``controller`` subcommand. No kopf here.

Each setting a user gives is declared once, as a field with its default and its
:class:`~drain_router.config.flags.Flag` (flag, click type and bounds, metavar, help, heading);
``drain-router controller`` generates its options, and their ``DRAIN_ROUTER_CONTROLLER_*``
variables, from them as ``serve`` does from its own (:mod:`drain_router.config.flags`), listed under
headings (:mod:`drain_router.config.usage`). The other fields are for tests and for the command
itself (``identity``).
"""

from __future__ import annotations

import dataclasses

import click

from drain_router import config
from drain_router.config.flags import Flag, setting
from drain_router.controller import options as options_
from drain_router.controller.options import DELETION, ENDPOINTS, LEADER_ELECTION, LOGGING, WATCH
from drain_router.decisions import lifecycle, recycling, service_ports, wake_endpoints

_PORT = click.IntRange(0, 65535)
_POSITIVE_SECS = click.FloatRange(min=0, min_open=True)

#: The port of kopf's /healthz when none is given: the chart's ``health.port``, which its
#: livenessProbe reads (a test keeps them equal). 8081, as controller-runtime's health probes.
DEFAULT_LIVENESS_PORT = 8081
#: The activator's admin port when none is given: the controller chart's ``activator.adminPort``.
DEFAULT_ACTIVATOR_ADMIN_PORT = 9091


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ControllerSettings:
    namespaces: tuple[str, ...] = setting(
        (),
        Flag(
            name="namespace",
            heading=WATCH,
            kind="repeated",
            metavar="NS",
            help="Watch ModelServices in this namespace; repeat for several (the environment variable "
            "takes a space-separated list). Needs only a namespaced Role.",
        ),
    )
    """Empty only together with ``all_namespaces``."""
    all_namespaces: bool = setting(
        False,
        Flag(name="all-namespaces", heading=WATCH, kind="flag", help="Watch every namespace (needs a ClusterRole)."),
    )
    metrics_port: int = setting(
        9092,
        Flag(
            name="metrics-port",
            heading=ENDPOINTS,
            type=_PORT,
            metavar="PORT",
            help="Prometheus /metrics port for drain_router_controller_*; 0 disables it.",
        ),
    )
    """9092: next to the router's 9091."""
    tracing: bool = setting(
        False,
        Flag(
            name="tracing",
            heading=ENDPOINTS,
            kind="switch",
            help="OpenTelemetry spans of the recycling, lifecycle and deletion passes (needs the 'otel' "
            "extra); the standard OTEL_* variables configure the exporter (OTLP/HTTP), endpoint, sampler "
            "and service name.",
        ),
    )
    """Off: the controller never loads the SDK."""
    liveness_port: int = setting(
        0,
        Flag(
            name="liveness-port",
            heading=ENDPOINTS,
            type=_PORT,
            metavar="PORT",
            cli_default=DEFAULT_LIVENESS_PORT,
            help="Serve kopf's liveness endpoint GET /healthz on this port (for a livenessProbe); 0: none.",
        ),
    )
    """kopf serves it on 0.0.0.0. The command's default is :data:`DEFAULT_LIVENESS_PORT`; the field's
    (library callers and tests) is 0: none."""
    read_nodes: bool = setting(
        True,
        Flag(
            name="node-reads",
            heading=WATCH,
            kind="switch",
            help="Read the node of a pod stuck terminating (needs get on nodes, cluster-scoped). "
            "--no-node-reads for a namespaced install without a ClusterRole: nodes then count as Ready.",
        ),
    )
    """Off, every pod's node counts as Ready: a pod past its grace counts until grace + 5 min instead
    of being let go at once when its node is NotReady or gone."""
    requeue_secs: float = setting(
        5.0,
        Flag(
            name="requeue-secs",
            heading=DELETION,
            type=_POSITIVE_SECS,
            metavar="SECS",
            help="Every wait of a staged deletion is a requeue after this long (the route settle "
            "requeues for its exact remainder).",
        ),
    )
    """5 s: short against a 60 s settle and a 30 s pod grace, cheap in API calls (a handful of GETs
    per ModelService being deleted)."""
    activator_service: wake_endpoints.ActivatorService | None = setting(None, options_.ACTIVATOR_SERVICE)
    """``None``: no activator, ScaleToZero only scales (a sleeping service wakes only by a person)."""
    activator_ports: range = setting(service_ports.DEFAULT_PORTS, options_.ACTIVATOR_PORTS)
    """The activator ports assigned to sleeping services (:data:`service_ports.DEFAULT_PORTS`)."""
    activator_admin_port: int = setting(DEFAULT_ACTIVATOR_ADMIN_PORT, options_.ACTIVATOR_ADMIN_PORT)
    """Where the controller asks an activator pod which ports it listens on: the chart's
    ``activator.adminPort`` (a test keeps them equal)."""
    leader_election: bool = setting(
        False,
        Flag(
            name="leader-election",
            heading=LEADER_ELECTION,
            kind="switch",
            cli_default=True,
            help="Act only while holding a coordination.k8s.io/v1 Lease, so that of several replicas "
            "exactly one acts and a standby takes over within --leader-election-lease-duration plus "
            "--leader-election-retry-period of the leader's last renewal. --no-leader-election: act at "
            "once (then run exactly one replica).",
        ),
    )
    """Run the operator only while holding the Lease ``lease_name`` in ``lease_namespace``. Off (the
    field's default, for tests): this process acts at once, and must be the only one."""
    lease_name: str = setting(
        "drain-router-controller",
        Flag(
            name="leader-election-lease",
            heading=LEADER_ELECTION,
            metavar="NAME",
            help="The Lease the replicas of one install compete for (one per install).",
        ),
    )
    """The chart passes the release's full name."""
    lease_namespace: str = setting(
        "",
        Flag(
            name="leader-election-namespace",
            heading=LEADER_ELECTION,
            metavar="NS",
            show_default=False,
            help="The Lease's namespace. Default: the pod's own (its service account's namespace), else "
            "the one --namespace watched.",
        ),
    )
    """The chart passes the controller's own from the downward API; the command fills in the default."""
    lease_duration_secs: int = setting(
        15,
        Flag(
            name="leader-election-lease-duration",
            heading=LEADER_ELECTION,
            type=click.IntRange(min=1),
            metavar="SECS",
            help="A standby takes the Lease from a leader that has not renewed it for this long (whole seconds).",
        ),
    )
    """Counted by a standby from the moment it sees a renewal (the Lease's ``leaseDurationSeconds``;
    whole seconds, as the API stores it). A dead leader is replaced within ``lease_duration_secs +
    retry_period_secs``. 15 s as in client-go: long against API server hiccups, short against a pod
    rescheduling."""
    renew_deadline_secs: float = setting(
        10.0,
        Flag(
            name="leader-election-renew-deadline",
            heading=LEADER_ELECTION,
            type=_POSITIVE_SECS,
            metavar="SECS",
            help="A leader that cannot renew for this long stops acting: it exits with status 3 and "
            "restarts as a standby. Less than the lease duration (the rest is the safety margin).",
        ),
    )
    """Counted from the moment the leader sent its last successful renewal; the exit status is
    ``EXIT_LEADERSHIP_LOST``. Strictly less than ``lease_duration_secs``: the difference is the margin
    for a request already sent to land and for the two replicas' clocks running at different rates
    (only durations are compared, never two clocks' readings). 10 s as in client-go."""
    retry_period_secs: float = setting(
        2.0,
        Flag(
            name="leader-election-retry-period",
            heading=LEADER_ELECTION,
            type=_POSITIVE_SECS,
            metavar="SECS",
            help="The leader renews, and a standby looks at the Lease, this often. At most half the renew deadline.",
        ),
    )
    """2 s as in client-go."""
    log_format: str = setting(
        "json",
        Flag(
            name="log-format",
            heading=LOGGING,
            choices=config.LOG_FORMATS,
            case_sensitive=True,
            help="json: one object a line on stdout, as the router logs. console: for a terminal.",
        ),
    )
    log_level: str = setting(
        "info",
        Flag(
            name="log-level",
            heading=LOGGING,
            choices=config.LOG_LEVELS,
            help="Minimum level logged, the controller's and kopf's alike.",
        ),
    )
    """kopf's and the controller's log level."""
    identity: str = ""
    """This process's ``holderIdentity``: the pod name plus a per-process suffix (set by the CLI)."""
    finalizer: str = "drainrouter.dev/staged-deletion"
    """The finalizer that holds a ModelService until its teardown is over."""
    max_sleep_secs: float = 60.0
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
