"""Lifecycle rules: scale an idle service to zero, delete its workload, delete the ModelService itself.

Purely computational, no side effects. The caller validates ``spec.lifecycle.rules`` with
:func:`validate` (nothing runs while any error is listed), probes every active pod's router, turns the
answers into the service's idle clock with :func:`idle_clock`, works out from the real state which
policies are already done (:func:`done_from`), and asks :func:`next_rule` what to do. It writes
``decision.status`` to ``status.lifecycle`` first, then carries out ``decision.action`` (at most one
per pass), posts ``decision.events`` and looks again at ``decision.requeue_at``.

The idle clock (``status.lifecycle.idleSince``) is the latest ``idle_since`` reported by routers that
have served (``served > 0``), null while any router is busy, and kept as it is on a probe failure or
with no pods, so neither a recycled replacement nor a controller restart resets it. While the service
stays idle it never moves backwards: a reported ``idle_since`` older than the stored one is ignored.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from drain_router.decisions.objects import Event

MIN_IDLE_SECONDS = 1
"""The smallest ``condition.idleSeconds``, a whole number of seconds: the CRD's schema states the same
(``type: integer, minimum: 1``; a test holds the two together). A 0 would act between any two
requests."""
LIFECYCLE_REQUEUE_BUFFER_SECS = 2.0
"""Requeue this long after a rule's due time, so the pass that acts finds it due."""


class Policy(str, enum.Enum):
    SCALE_TO_ZERO = "ScaleToZero"
    """``spec.replicas: 0`` on the Deployment; the route is kept."""
    DELETE_WORKLOAD = "DeleteWorkload"
    """The staged teardown of the workload; the ModelService stays."""
    DELETE_SELF = "DeleteSelf"
    """Delete the ModelService; its finalizer runs the staged teardown."""


#: Ascending impact: the order thresholds must follow, and the reverse of the order overdue rules win.
ORDER = (Policy.SCALE_TO_ZERO, Policy.DELETE_WORKLOAD, Policy.DELETE_SELF)


class EventReason(enum.StrEnum):
    SCALED_TO_ZERO = "LifecycleScaledToZero"
    DELETE_WORKLOAD = "LifecycleDeleteWorkload"
    DELETE_SELF = "LifecycleDeleteSelf"


_EVENT = {
    Policy.SCALE_TO_ZERO: EventReason.SCALED_TO_ZERO,
    Policy.DELETE_WORKLOAD: EventReason.DELETE_WORKLOAD,
    Policy.DELETE_SELF: EventReason.DELETE_SELF,
}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    policy: Policy
    idle_seconds: float
    """Due once the service has been idle this long (``now >= idleSince + idle_seconds``)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RuleError:
    """One problem with ``spec.lifecycle.rules``: the field, the value and the reason."""

    field: str
    """``spec.lifecycle.rules[1].condition.idleSeconds``, or ``spec.lifecycle.rules`` for the list."""
    value: Any
    reason: str

    def __str__(self) -> str:
        return f"{self.field}={self.value!r}: {self.reason}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RouterReport:
    """One router's ``/admin/inflight`` answer."""

    pod: str
    inflight: int
    idle_since: float | None
    served: int
    queued: int = 0
    """Requests waiting in its admission queue: a router with requests queued is not idle (0 from a
    router that predates the queue)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProbeFailure:
    pod: str
    error: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LifecycleStatus:
    """``status.lifecycle``."""

    idle_since: float | None = None
    scaled_to_zero_at: float | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class IdleClock:
    idle_since: float | None
    """When the service went idle; ``None`` while a router is busy."""
    known: bool = True
    """``False`` after a probe failure: the stored value is kept and no rule acts this pass."""
    woke: bool = False
    """A person scaled the scaled-to-zero service back up: the clock restarted at ``now``."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RuleDecision:
    status: LifecycleStatus
    """What to write to ``status.lifecycle`` before acting."""
    action: Policy | None = None
    events: tuple[Event, ...] = ()
    requeue_at: float | None = None
    """``None``: nothing pending (every rule done), the standard requeue."""


def validate(rules: Sequence[Mapping[str, Any]]) -> tuple[RuleError, ...]:
    """Every problem with ``spec.lifecycle.rules`` at once: unknown policies, a missing
    ``condition.idleSeconds`` or one that is not a whole number >= :data:`MIN_IDLE_SECONDS`, a policy listed twice, and thresholds not strictly increasing
    ScaleToZero < DeleteWorkload < DeleteSelf. Purely computational, no side effects."""
    base = "spec.lifecycle.rules"
    if not rules:
        return (RuleError(field=base, value=[], reason="at least one rule is needed"),)
    errors: list[RuleError] = []
    seen: dict[Policy, tuple[int, float]] = {}
    for i, rule in enumerate(rules):
        policy = rule.get("policy")
        if policy not in {p.value for p in Policy}:
            errors.append(
                RuleError(
                    field=f"{base}[{i}].policy",
                    value=policy,
                    reason=f"expected one of {', '.join(p.value for p in ORDER)}",
                )
            )
            continue
        idle = (rule.get("condition") or {}).get("idleSeconds")
        if isinstance(idle, bool) or not isinstance(idle, int) or idle < MIN_IDLE_SECONDS:
            errors.append(
                RuleError(
                    field=f"{base}[{i}].condition.idleSeconds",
                    value=idle,
                    reason=f"expected a whole number of seconds >= {MIN_IDLE_SECONDS}",
                )
            )
            continue
        if Policy(policy) in seen:
            errors.append(
                RuleError(
                    field=f"{base}[{i}].policy",
                    value=policy,
                    reason=f"listed twice (also rules[{seen[Policy(policy)][0]}]); one rule per policy",
                )
            )
            continue
        seen[Policy(policy)] = (i, float(idle))
    present = [p for p in ORDER if p in seen]
    for lower, higher in itertools.pairwise(present):
        (_, low), (j, high) = seen[lower], seen[higher]
        if not low < high:
            errors.append(
                RuleError(
                    field=f"{base}[{j}].condition.idleSeconds",
                    value=high,
                    reason=f"{higher.value} must come strictly after {lower.value} ({low:g}s)",
                )
            )
    return tuple(errors)


def parse(rules: Sequence[Mapping[str, Any]]) -> tuple[Rule, ...]:
    """Validated rules -> typed rules; raises ``ValueError`` naming the problems for invalid ones."""
    errors = validate(rules)
    if errors:
        raise ValueError("; ".join(str(e) for e in errors))
    return tuple(Rule(policy=Policy(r["policy"]), idle_seconds=float(r["condition"]["idleSeconds"])) for r in rules)


def idle_clock(
    reports: Sequence[RouterReport | ProbeFailure],
    replicas: int,
    status: LifecycleStatus,
    now: float,
    *,
    waking: bool = False,
) -> IdleClock:
    """The service's idle clock from every active pod's router. Purely computational, no side effects.

    ``replicas`` is the Deployment's ``spec.replicas``: above zero while ``scaledToZeroAt`` is set
    means a person woke the service, and the clock restarts at ``now``. ``waking``: a wake is under
    way (the pods' cold start): the clock restarts at ``now`` on every such pass, so the service is
    idle from the wake's end at the earliest. A cold start is not idle time: counted as such, a wake
    longer than the ScaleToZero rule's ``idleSeconds`` would be put back to sleep at once, before
    the requests it woke for were handed on. Otherwise: no reports (no
    pods) keeps the stored value; any probe failure keeps it and marks the clock unknown; any router
    with requests in flight or queued makes it ``None``; all idle gives the latest ``idle_since`` of routers
    that have served (clamped to ``now``), never earlier than the stored value: while the service
    stays idle the clock only moves forward (a recycled pod's replacement has not served, so the
    latest report may come from an older router). With nothing stored and no router that has
    served, the clock starts at ``now``.
    """
    if status.scaled_to_zero_at is not None and replicas > 0:
        return IdleClock(idle_since=now, woke=True)
    routers = [r for r in reports if isinstance(r, RouterReport)]
    busy = any(r.inflight > 0 or r.queued > 0 for r in routers)
    if waking and not busy:
        return IdleClock(idle_since=now)
    if not reports:
        return IdleClock(idle_since=status.idle_since)
    if any(isinstance(r, ProbeFailure) for r in reports):
        return IdleClock(idle_since=status.idle_since, known=False)
    if busy:
        return IdleClock(idle_since=None)
    served = [min(r.idle_since, now) for r in routers if r.served > 0 and r.idle_since is not None]
    if status.idle_since is not None:  # still idle since then: an older report never moves it back
        return IdleClock(idle_since=max([status.idle_since, *served]))
    return IdleClock(idle_since=max(served) if served else now)


def done_from(
    *, deployment_exists: bool, deployment_deleting: bool, deployment_replicas: int | None, deletion_stage: str | None
) -> dict[Policy, bool]:
    """Which policies the real state already satisfies: ScaleToZero when the Deployment is absent,
    deleting or at ``spec.replicas == 0``; DeleteWorkload when the staged teardown is Released;
    DeleteSelf never (the ModelService still exists, or nobody would ask)."""
    return {
        Policy.SCALE_TO_ZERO: not deployment_exists or deployment_deleting or deployment_replicas == 0,
        Policy.DELETE_WORKLOAD: deletion_stage == "Released",
        Policy.DELETE_SELF: False,
    }


def next_rule(
    rules: Sequence[Rule],
    clock: IdleClock,
    done: Mapping[Policy, bool],
    status: LifecycleStatus,
    now: float,
    *,
    buffer_secs: float = LIFECYCLE_REQUEUE_BUFFER_SECS,
) -> RuleDecision:
    """The one rule to run this pass, if any. Purely computational function with no side effects.

    A rule is due when ``now >= idleSince + idleSeconds``; of the due rules not yet done, only the most
    impactful runs (DeleteSelf > DeleteWorkload > ScaleToZero), so after controller downtime an
    overdue DeleteSelf is not preceded by a pointless scale-down. Requeue at the next due time plus
    ``buffer_secs`` (:data:`LIFECYCLE_REQUEUE_BUFFER_SECS`, shortened only by tests); while busy, the
    smallest pending ``idleSeconds`` from now.
    """
    new = LifecycleStatus(
        idle_since=clock.idle_since, scaled_to_zero_at=None if clock.woke else status.scaled_to_zero_at
    )
    pending = [r for r in rules if not done.get(r.policy, False)]
    if not clock.known or not pending:
        return RuleDecision(status=new)
    if clock.idle_since is None:
        soonest = min(r.idle_seconds for r in pending)
        return RuleDecision(status=new, requeue_at=now + soonest + buffer_secs)
    idle_since = clock.idle_since
    due = [r for r in pending if now >= idle_since + r.idle_seconds]
    later = [idle_since + r.idle_seconds for r in pending if r not in due]
    requeue = min(later) + buffer_secs if later else None
    if not due:
        return RuleDecision(status=new, requeue_at=requeue)
    rule = max(due, key=lambda r: ORDER.index(r.policy))
    if rule.policy is Policy.SCALE_TO_ZERO:
        new = dataclasses.replace(new, scaled_to_zero_at=now)
    event = Event(
        type="Normal",
        reason=_EVENT[rule.policy],
        message=f"{rule.policy.value}: idle for {now - idle_since:.0f}s (threshold {rule.idle_seconds:g}s)",
    )
    return RuleDecision(status=new, action=rule.policy, events=(event,), requeue_at=requeue)
