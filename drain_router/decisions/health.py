"""The model server's health as ``/readyz`` sees it: how consecutive health-path answers become one
verdict, when the next poll starts, and how long an unhealthy model server can go unnoticed.

Purely computational: the poller (``drain_router.runtime.upstream_health``) does the I/O and the
clock, and calls these with what it observed.
"""

from __future__ import annotations

import dataclasses

#: The polling's defaults (``--upstream-health-interval-secs``, ``--upstream-health-timeout-secs``,
#: ``--upstream-health-failure-threshold``; :mod:`drain_router.config` re-exports them): a poll every
#: 2 s; each allowed 2 s, above the Kubernetes probe default of 1 s because an engine's health
#: handler can wait behind a model lock under load; and, as a Kubernetes probe's failureThreshold,
#: 3 failures before unhealthy, since one slow or failed answer is not an outage.
DEFAULT_INTERVAL_SECS = 2
DEFAULT_TIMEOUT_SECS = 2
DEFAULT_FAILURE_THRESHOLD = 3


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """What the polls so far say. ``up`` is what ``/readyz`` follows; ``failures`` counts the
    consecutive failed polls since the last success."""

    up: bool = False
    """False until the first success: a model server never seen healthy is not ready."""
    failures: int = 0


def judge(previous: Verdict, ok: bool, failure_threshold: int) -> Verdict:
    """Fold one poll's answer into the verdict, as Kubernetes probes do: one success is healthy at
    once; a failure turns a healthy model server unhealthy only at ``failure_threshold`` consecutive
    failures (an engine that answers slowly under load is not down)."""
    if ok:
        return Verdict(up=True, failures=0)
    failures = previous.failures + 1
    return Verdict(up=previous.up and failures < failure_threshold, failures=failures)


def next_poll_in(interval_secs: float, elapsed_secs: float) -> float:
    """Seconds to wait before the next poll: polls start every ``interval_secs`` (a fixed cadence,
    from one start to the next), or at once when the last one took longer than that."""
    return max(interval_secs - elapsed_secs, 0.0)


def notice_secs(interval_secs: int, failure_threshold: int, timeout_secs: int) -> int:
    """The longest a model server that stops answering can keep ``/readyz`` at 200.

    It dies just after a successful poll; ``failure_threshold`` more polls must fail, each starting
    one period after the last (the interval, or the timeout when that is longer: :func:`next_poll_in`),
    and the last one fails only when its timeout ends. With the timeout within the interval this is
    ``interval * threshold + timeout``."""
    return failure_threshold * max(interval_secs, timeout_secs) + timeout_secs


#: How long the default polling takes to notice a model server that stopped answering (8 s): the
#: router's own bound, which no drain window shortens (the upstream health advisory's floor).
DEFAULT_NOTICE_SECS = notice_secs(DEFAULT_INTERVAL_SECS, DEFAULT_FAILURE_THRESHOLD, DEFAULT_TIMEOUT_SECS)
