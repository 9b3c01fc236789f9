"""The drain's section of the settings tree (:class:`DrainSettings`): how long the router keeps
serving after SIGTERM, the pod's grace that bounds it and the deadline derived from it, the load
balancer's probe declared for the startup advisories, when open WebSocket tunnels are told to go;
and the bounds those are checked against (:func:`drain_router.config.build_config`, the
advisories).

The other sections (what the router serves and how it reports) are :mod:`.sections`.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

from drain_router.config.flags import Flag, setting
from drain_router.config.values import choice, integer, required_seconds, seconds
from drain_router.decisions import advisory, websocket_close

#: The Kubernetes default ``terminationGracePeriodSeconds``, assumed when the operator declares none:
#: defined once, beside the advisory that compares against it (decisions import nothing of ours).
K8S_DEFAULT_GRACE_SECS = advisory.K8S_DEFAULT_GRACE_SECS

#: ``--shutdown-drain-secs`` when not given: the Kubernetes default grace, hence the advisory until
#: a larger grace is declared (admission control's default queue timeout follows it).
DEFAULT_SHUTDOWN_DRAIN_SECS = 30

#: Hard ceiling for ``--shutdown-drain-secs``. A longer value is a typo (an extra digit, or
#: milliseconds for seconds), not a drain: no grace period rescues it.
MAX_SHUTDOWN_DRAIN_SECS = 1800

#: The deadline fires this many seconds before the declared grace ends, so the router can abort,
#: count and log what is left and exit 1 before the kubelet's SIGKILL takes the choice away.
SHUTDOWN_DEADLINE_MARGIN_SECS = 2

WEBSOCKET_CLOSE_AT = websocket_close.MODES


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DrainSettings:
    TITLE: ClassVar[str] = "Drain"
    """The heading of this section's flags in ``serve --help``."""

    shutdown_drain_secs: int = setting(
        DEFAULT_SHUTDOWN_DRAIN_SECS,
        Flag(
            name="shutdown-drain-secs",
            metavar="SECS",
            parse=required_seconds(),
            help="After SIGTERM, keep serving this long with /readyz answering 503, so endpoint removal "
            "reaches kube-proxy and gateways before the listener closes. If a probe-driven load "
            "balancer removes the pod, size it above failureThreshold * periodSeconds. It must "
            "leave room under terminationGracePeriodSeconds for in-flight streams: the default "
            "equals the Kubernetes default grace, so startup warns until you declare a larger "
            "--termination-grace-secs. 0 disables the pause. At most 1800.",
        ),
    )
    termination_grace_secs: int | None = setting(
        None,
        Flag(
            name="termination-grace-secs",
            metavar="SECS",
            parse=seconds(minimum=1, optional=True),
            help="The pod's real terminationGracePeriodSeconds (feed both from one value). Enables the "
            "deadline: at SIGTERM + grace - 2 s, remaining requests are aborted, counted and the "
            "router exits 1. Unset: the advisory assumes the Kubernetes default 30, and the router "
            "waits for in-flight work until it is killed.",
        ),
    )
    readiness_probe_period_secs: int | None = setting(
        None,
        Flag(
            name="readiness-probe-period-secs",
            metavar="SECS",
            parse=seconds(minimum=1, optional=True),
            help="The load balancer's readiness probe period, declared so startup can check the drain "
            "window against failureThreshold * periodSeconds.",
        ),
    )
    readiness_probe_failure_threshold: int | None = setting(
        None,
        Flag(
            name="readiness-probe-failure-threshold",
            metavar="N",
            parse=integer(minimum=1, optional=True),
            help="The load balancer's readiness probe failure threshold (with the period above).",
        ),
    )
    websocket_close_at: Literal["deadline", "closing", "idle"] = setting(
        websocket_close.DEFAULT,
        Flag(
            name="websocket-close-at",
            parse=choice(WEBSOCKET_CLOSE_AT),
            choices=WEBSOCKET_CLOSE_AT,
            help="When open WebSocket sessions are sent Close 1001 (Going Away), so their clients "
            "reconnect to another replica. deadline: at the in-flight deadline (a session lives as long "
            "as the pod may, but a pod with a live session is held for the whole grace and its router "
            "exits 1). closing: at the start of closing, every session at once (the pod goes quickly, "
            "but a session in the middle of a response is cut). idle: from the start of closing, each "
            f"session as soon as it has been quiet both ways for {websocket_close.WEBSOCKET_QUIET_SECS:g} s "
            "(between turns), else at the deadline (the pod goes soon after its sessions' current turns).",
        ),
    )

    def deadline_secs(self) -> int | None:
        """Seconds from the first SIGTERM at which in-flight work is aborted; ``None`` without a
        declared grace."""
        if self.termination_grace_secs is None:
            return None
        return max(self.termination_grace_secs - SHUTDOWN_DEADLINE_MARGIN_SECS, 0)

    def drain_wait_cap_secs(self) -> int:
        """Longest /admin/drain-wait hold: the declared grace, else the longest drain there can be."""
        grace = self.termination_grace_secs
        return MAX_SHUTDOWN_DRAIN_SECS if grace is None else grace

    def drain_wait_timeout_secs(self) -> int:
        """Default timeout of /admin/drain-wait: the declared grace, else the Kubernetes default."""
        grace = self.termination_grace_secs
        return K8S_DEFAULT_GRACE_SECS if grace is None else grace
