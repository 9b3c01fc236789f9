"""What a stage of the state machine returns, and the moves every stage is made of.

Purely computational, no side effects. :class:`Pass` holds one pass's inputs (with the pod count made
once); a stage returns :class:`Advance` (run the next stage in the same pass) or :class:`Stop` (the
pass ends with this decision). The helpers build those: ``enter`` a stage, ``wait`` in it, ``blocked``
on a failed read, ``timed_out`` and ``release``, and the status message of each stage. The stage
functions and the driver that chains them are in ``stages``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from drain_router.decisions import durations
from drain_router.decisions.deletion.decision import Decision
from drain_router.decisions.deletion.enums import Outcome, Reason, Stage, Verdict
from drain_router.decisions.deletion.knobs import Knobs
from drain_router.decisions.deletion.observations import ApiFailure, Observations
from drain_router.decisions.deletion.pods import PodCount, plural
from drain_router.decisions.deletion.status import MAX_LISTED_PODS, DeletionStatus
from drain_router.decisions.objects import Event, Pod


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Pass:
    """The inputs of one pass, with what is derived from them computed once."""

    obs: Observations
    knobs: Knobs
    now: float
    deadline: float
    pods: PodCount
    """The pods counted at ``now``: once per pass, whatever stages the pass goes through."""

    def pod_fields(self) -> dict[str, Any]:
        return {
            "pods_remaining": self.pods.count,
            "pods": tuple(p.as_dict() for p in self.pods.remaining[:MAX_LISTED_PODS]),
        }


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Advance:
    """Enter ``status.stage`` and run it in the same pass; ``event`` records the transition."""

    status: DeletionStatus
    event: Event


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Stop:
    """The pass ends with ``decision`` (its events follow the transitions already made)."""

    decision: Decision


Step = Callable[[DeletionStatus, Pass], "Advance | Stop"]


def enter(
    status: DeletionStatus,
    p: Pass,
    stage: Stage,
    reason: Reason,
    event_type: str = "Normal",
    prefix: str = "",
    message: str | None = None,
    **changes: Any,
) -> Advance:
    """Move to ``stage`` with ``changes``; the transition's event carries the new stage's message."""
    moved = dataclasses.replace(status, stage=stage, **changes)
    moved = dataclasses.replace(moved, message=stage_message(moved, p) if message is None else message)
    return Advance(status=moved, event=Event(type=event_type, reason=reason, message=prefix + moved.message))


def wait(status: DeletionStatus, p: Pass, *, actions: Any = (), requeue_at: float | None = None) -> Stop:
    """Stay in the stage: write the status (with a fresh message), act, requeue."""
    message = stage_message(status, p)
    if p.obs.failed_actions:
        message += f"; last attempt failed: {named(p.obs.failed_actions)}"
    status = dataclasses.replace(status, message=message)
    return Stop(
        decision=Decision(verdict=Verdict.CONTINUE, status=status, actions=tuple(actions), requeue_at=requeue_at)
    )


def named(failures: Sequence[ApiFailure]) -> str:
    return "; ".join(str(f) for f in failures)


def blocked(status: DeletionStatus, p: Pass, unread: Sequence[ApiFailure]) -> Stop:
    """A read this stage needs failed: wait without acting (nothing is decided on unknown state);
    at the deadline, TimedOut naming the calls."""
    if p.now >= p.deadline:
        return timed_out(
            status, p, f"in {status.stage.value if status.stage else 'the first pass'}, cannot read {named(unread)}"
        )
    message = f"cannot read {named(unread)}; retrying until the deadline {durations.format_time(p.deadline)}"
    if status.stage is not None:
        message = f"{stage_message(status, p)}; {message}"
    return Stop(decision=Decision(verdict=Verdict.CONTINUE, status=dataclasses.replace(status, message=message)))


def timed_out(status: DeletionStatus, p: Pass, detail: str, failures: Sequence[ApiFailure] = ()) -> Stop:
    last = f" (last failure: {named(failures)})" if failures else ""
    message = f"timed out after {durations.format_duration(p.knobs.max_wait)} {detail}{last}; finalizer dropped"
    return release(status, p, Reason.TIMED_OUT, "Warning", outcome=Outcome.TIMED_OUT, message=message)


def release(status: DeletionStatus, p: Pass, reason: Reason, event_type: str, **changes: Any) -> Stop:
    entered = enter(status, p, Stage.RELEASED, reason, event_type, **changes)
    return Stop(decision=Decision(verdict=Verdict.RELEASE, status=entered.status, events=(entered.event,)))


def pods_gone_or_timed_out(status: DeletionStatus, p: Pass) -> Stop | None:
    if p.pods.count == 0:
        return release(
            status, p, Reason.RELEASED, "Normal", pods_gone_at=p.now, outcome=status.outcome or Outcome.CLEAN
        )
    if p.now >= p.deadline:
        return timed_out(status, p, f"with {plural(p.pods.count, 'pod')} remaining", p.obs.failed_actions)
    return None


def force_delete_targets(status: DeletionStatus, p: Pass) -> list[Pod]:
    """Counted pods terminating for at least ``force_delete_after``: since their deletion was
    requested (deletionTimestamp - grace), or, when not yet marked, since the workload was deleted."""
    if p.knobs.force_delete_after is None:
        return []
    names = {entry.name for entry in p.pods.remaining}
    targets = []
    for pod in sorted(p.obs.pods, key=lambda pod: pod.name):
        if pod.name not in names or pod.name in status.force_deleted:
            continue
        if pod.deletion_timestamp is not None:
            since = pod.deletion_timestamp - (pod.grace or 0)
        else:
            since = status.uninstalled_at if status.uninstalled_at is not None else p.now
        if p.now - since >= p.knobs.force_delete_after:
            targets.append(pod)
    return targets


def stage_message(status: DeletionStatus, p: Pass) -> str:
    stage, obs = status.stage, p.obs
    route = "" if obs.route is None else str(obs.route.ref)
    if stage is Stage.ROUTE_REMOVING:
        refused = None if obs.route is None else obs.route.not_owned
        if refused is not None:
            return f"route {route} not owned ({refused.refusal.value}), left in place; RouteStuck at the deadline"
        return f"deleting route {route}"
    if stage is Stage.ROUTE_SETTLING:
        assert status.route_removed_at is not None
        end = min(status.route_removed_at + p.knobs.route_settle, p.deadline)
        return f"route {route} removed; settling until {durations.format_time(end)}"
    if stage is Stage.UNINSTALLING:
        route_ref = None if obs.route is None else obs.route.ref
        names = ", ".join(str(o.ref) for o in obs.workload if o.ref != route_ref and o.not_owned is None)
        left = ", ".join(str(o.ref) for o in obs.workload if o.ref != route_ref and o.not_owned is not None)
        prefix = {
            Outcome.NO_ROUTE: "no route configured; ",
            Outcome.ROUTE_STUCK: f"route {route} still present at the deadline, its finalizers left alone; ",
        }.get(status.outcome, "")  # type: ignore[arg-type]
        return f"{prefix}deleting workload: {names or 'nothing'}" + (f"; not owned, left alone: {left}" if left else "")
    if stage in (Stage.PODS_TERMINATING, Stage.FORCE_DELETING):
        return p.pods.message
    if stage is Stage.RELEASED:
        return f"released: all pods gone (outcome {status.outcome.value if status.outcome else 'Clean'})"
    return ""
