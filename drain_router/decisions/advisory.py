"""Startup advisories: a drain configuration that works but is probably not what the operator meant.

Purely computational, no side effects. An advisory is a value with a stable ``code``, a static
``message`` and the compared numbers as separate fields, so a log aggregator can group and dedupe it
(a message with the seconds interpolated cannot be grouped).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from drain_router.decisions import health

#: The Kubernetes default ``terminationGracePeriodSeconds``, assumed when none is declared
#: (``drain_router.config`` re-exports it).
K8S_DEFAULT_GRACE_SECS = 30


class Code(str, enum.Enum):
    DRAIN_CONSUMES_GRACE = "DRAIN_CONSUMES_GRACE"
    DRAIN_SHORTER_THAN_PROBE_WINDOW = "DRAIN_SHORTER_THAN_PROBE_WINDOW"
    UPSTREAM_HEALTH_SLOWER_THAN_DRAIN = "UPSTREAM_HEALTH_SLOWER_THAN_DRAIN"
    QUEUE_TIMEOUT_EXCEEDS_DRAIN = "QUEUE_TIMEOUT_EXCEEDS_DRAIN"


MESSAGES: dict[Code, str] = {
    Code.DRAIN_CONSUMES_GRACE: (
        "shutdown drain leaves no time for in-flight requests within the termination grace period; "
        "raise terminationGracePeriodSeconds and declare it with --termination-grace-secs, "
        "or shorten --shutdown-drain-secs"
    ),
    Code.DRAIN_SHORTER_THAN_PROBE_WINDOW: (
        "shutdown drain ends before a probe-driven load balancer can see /readyz fail "
        "(failureThreshold * periodSeconds); new requests may reach a closed listener. "
        "Raise --shutdown-drain-secs above the probe window"
    ),
    Code.UPSTREAM_HEALTH_SLOWER_THAN_DRAIN: (
        "the router takes longer to notice a model server that stopped answering its health path "
        "(failure threshold * poll period + timeout) than the drain window gives load balancers to stop "
        "sending to a pod, and longer than its default polling would; requests keep reaching a dead "
        "model server longer than a shutdown takes to shed them. Lower --upstream-health-interval-secs, "
        "--upstream-health-failure-threshold or --upstream-health-timeout-secs, or raise "
        "--shutdown-drain-secs"
    ),
    Code.QUEUE_TIMEOUT_EXCEEDS_DRAIN: (
        "a queued request may wait longer than a shutdown lets it: at closing (the drain window after "
        "SIGTERM) every request still queued is answered 503 with Retry-After, so during a rollout "
        "clients are turned away before their queue timeout. Keep --queue-timeout-secs at most "
        "--shutdown-drain-secs (its default does), so every request queued before the pod began "
        "draining is admitted or times out on its own clock before closing; or raise --shutdown-drain-secs"
    ),
}


@dataclasses.dataclass(frozen=True, slots=True)
class Advisory:
    code: Code
    fields: tuple[tuple[str, Any], ...]

    @property
    def message(self) -> str:
        return MESSAGES[self.code]

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code.value, "message": self.message, **dict(self.fields)}


def drain_consumes_grace(shutdown_drain_secs: int, termination_grace_secs: int | None) -> Advisory | None:
    """Warn when the drain window uses up the grace period.

    ``>=`` and not ``>``: a drain equal to the grace leaves nothing for the in-flight drain. An
    undeclared grace falls back to the Kubernetes default, because the router cannot read its own pod
    spec; declaring the real grace, not shortening a correct drain, is how to silence it.
    """
    grace = K8S_DEFAULT_GRACE_SECS if termination_grace_secs is None else termination_grace_secs
    if shutdown_drain_secs < grace:
        return None
    return Advisory(
        Code.DRAIN_CONSUMES_GRACE,
        (
            ("shutdown_drain_secs", shutdown_drain_secs),
            ("termination_grace_secs", grace),
            ("grace_declared", termination_grace_secs is not None),
        ),
    )


def drain_shorter_than_probe_window(
    shutdown_drain_secs: int, probe_period_secs: int | None, probe_failure_threshold: int | None
) -> Advisory | None:
    """Warn when a declared probe-driven LB would still route to the pod after the window closes."""
    if probe_period_secs is None or probe_failure_threshold is None:
        return None
    window = probe_period_secs * probe_failure_threshold
    if shutdown_drain_secs > window:
        return None
    return Advisory(
        Code.DRAIN_SHORTER_THAN_PROBE_WINDOW,
        (
            ("shutdown_drain_secs", shutdown_drain_secs),
            ("probe_period_secs", probe_period_secs),
            ("probe_failure_threshold", probe_failure_threshold),
            ("probe_window_secs", window),
        ),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class HealthPolling:
    """How the model server's health path is polled (when one is set)."""

    interval_secs: int
    failure_threshold: int
    timeout_secs: int


def upstream_health_slower_than_drain(shutdown_drain_secs: int, polling: HealthPolling | None) -> Advisory | None:
    """Warn when noticing a model server that stopped answering takes longer than the drain window,
    and longer than the default polling takes.

    The drain window is how long the operator gives load balancers to stop sending to a pod once its
    ``/readyz`` says 503 (sized above their probe window). A model server that stops answering is the
    same event without a SIGTERM, except that ``/readyz`` turns 503 only once the router has noticed
    (:func:`health.notice_secs`). When that alone is longer than the window, a dead model server keeps
    getting traffic longer than a deliberate shutdown would ever take to shed it. ``>``: noticing
    within the window is within the budget.

    The budget is never below the default polling's own notice time (:data:`health.DEFAULT_NOTICE_SECS`,
    8 s): a short drain (5 s by hand, 1 s in a test) says how fast the load balancers follow
    ``/readyz``, not that a health path turned on with its defaults is wrong; only polling made slower
    than both is a choice that contradicts the drain. Silent without a health path (``polling`` is
    ``None``) and with no drain window (0: no budget is declared to compare with).
    """
    if polling is None or shutdown_drain_secs == 0:
        return None
    notice = health.notice_secs(polling.interval_secs, polling.failure_threshold, polling.timeout_secs)
    if notice <= max(shutdown_drain_secs, health.DEFAULT_NOTICE_SECS):
        return None
    return Advisory(
        Code.UPSTREAM_HEALTH_SLOWER_THAN_DRAIN,
        (
            ("shutdown_drain_secs", shutdown_drain_secs),
            ("upstream_health_interval_secs", polling.interval_secs),
            ("upstream_health_failure_threshold", polling.failure_threshold),
            ("upstream_health_timeout_secs", polling.timeout_secs),
            ("upstream_health_notice_secs", notice),
        ),
    )


def queue_timeout_exceeds_drain(
    shutdown_drain_secs: int, max_concurrent_requests: int, queue_size: int, queue_timeout_secs: float
) -> Advisory | None:
    """Warn when a request may wait in the admission queue longer than the drain window.

    At closing the router answers every request still queued with 503: the model server never
    saw them, so a retry elsewhere is safe, but each client waited for nothing. With a queue timeout
    no longer than the window, every request queued before SIGTERM reaches its own end (admitted, or
    503 at its timeout) before closing, and only requests that arrive during the drain, which the
    window exists to stop, can be turned away early. ``>``: a timeout equal to the window ends before
    closing for every request queued before SIGTERM. Silent with admission off
    (``max_concurrent_requests`` 0) or no queue (``queue_size`` 0): nothing ever waits; and with no
    drain window (0): SIGTERM goes straight to closing, which is what a drain of 0 asks for, and no
    queue timeout (more than 0) could end first, so there is no contradiction to point at, as for the
    upstream health advisory.
    """
    if max_concurrent_requests == 0 or queue_size == 0 or shutdown_drain_secs == 0:
        return None
    if queue_timeout_secs <= shutdown_drain_secs:
        return None
    return Advisory(
        Code.QUEUE_TIMEOUT_EXCEEDS_DRAIN,
        (("queue_timeout_secs", queue_timeout_secs), ("shutdown_drain_secs", shutdown_drain_secs)),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Admission:
    """The admission control's limit and queue (``max_concurrent_requests`` 0: off)."""

    max_concurrent_requests: int
    queue_size: int
    queue_timeout_secs: float


def advisories(
    *,
    shutdown_drain_secs: int,
    termination_grace_secs: int | None,
    probe_period_secs: int | None = None,
    probe_failure_threshold: int | None = None,
    health_polling: HealthPolling | None = None,
    admission: Admission | None = None,
) -> tuple[Advisory, ...]:
    """Every advisory that applies, in a stable order."""
    found = (
        drain_consumes_grace(shutdown_drain_secs, termination_grace_secs),
        drain_shorter_than_probe_window(shutdown_drain_secs, probe_period_secs, probe_failure_threshold),
        upstream_health_slower_than_drain(shutdown_drain_secs, health_polling),
        None
        if admission is None
        else queue_timeout_exceeds_drain(
            shutdown_drain_secs, admission.max_concurrent_requests, admission.queue_size, admission.queue_timeout_secs
        ),
    )
    return tuple(a for a in found if a is not None)
