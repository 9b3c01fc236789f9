"""The state machine: one function per stage, and a short driver that chains them within a pass.

Purely computational, no side effects. Each stage function takes the status so far and the pass's
inputs and returns either :class:`Advance` (the next stage needs no action and no wait: run it in the
same pass) or :class:`Stop` (the pass ends here with this decision). Stages only move forward, so the
driver ends after at most one visit per stage.

``maxWait`` is an overall budget: a stage whose reads failed (see ``_NEEDS``) waits without acting
and ends in TimedOut at the deadline, and so does a workload whose deletes keep failing. The
TimedOut warning names the failing calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from router.decisions import durations
from router.decisions.deletion.decision import Action, Decision, Event
from router.decisions.deletion.enums import ActionKind, Outcome, Reason, Stage, Subject, Verdict
from router.decisions.deletion.knobs import Knobs
from router.decisions.deletion.observations import ApiFailure, Observations, PodObservation
from router.decisions.deletion.pods import PodCount, count_pods, plural
from router.decisions.deletion.refs import SERVICE_LABEL
from router.decisions.deletion.status import MAX_LISTED_PODS, DeletionStatus


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


def next_stage(status: DeletionStatus | None, obs: Observations, knobs: Knobs, now: float) -> Decision:
    """One pass of the staged deletion. Purely computational function with no side effects: same
    inputs, same decision; ``now`` is Unix seconds.

    Transitions that need no action and no wait are chained within the pass (each still emits its
    own event); the pass stops at the first stage that has to act or wait.
    """
    current = status or DeletionStatus()
    early = _before_stages(current, obs, knobs)
    if early is not None:
        return early
    started_at = current.started_at if current.started_at is not None else now
    deadline = started_at + knobs.max_wait
    current = dataclasses.replace(current, started_at=started_at, deadline=deadline)
    step = Pass(obs=obs, knobs=knobs, now=now, deadline=deadline, pods=count_pods(obs.pods, obs.nodes, now))
    events: list[Event] = []
    while True:
        unread = obs.unread(*_NEEDS[current.stage])
        result = _blocked(current, step, unread) if unread else _STEPS[current.stage](current, step)
        if isinstance(result, Stop):
            return dataclasses.replace(result.decision, events=(*events, *result.decision.events))
        assert _order(result.status.stage) > _order(current.stage), "stages only move forward"
        current = result.status
        events.append(result.event)


def _before_stages(current: DeletionStatus, obs: Observations, knobs: Knobs) -> Decision | None:
    """Suspend, an earlier release and the Orphan policy end a pass before any stage."""
    if obs.suspend:
        return Decision(verdict=Verdict.HOLD)
    if current.stage is Stage.RELEASED:
        return Decision(verdict=Verdict.RELEASE, status=current)
    if knobs.orphan:
        return Decision(
            verdict=Verdict.SKIP,
            events=(
                Event(
                    type="Normal",
                    reason=Reason.ORPHANED,
                    message="deletion-policy Orphan: route, workload and pods left in place",
                ),
            ),
        )
    return None


# --- the stages -----------------------------------------------------------------------------------


def _start(status: DeletionStatus, p: Pass) -> Advance | Stop:
    """A route or workload object labelled for another service stops everything; otherwise the first
    stage is RouteRemoving, or Uninstalling when no route is configured (NoRoute)."""
    foreign = [o for o in (p.obs.route, *p.obs.workload) if o is not None and o.foreign_to(p.obs.service)]
    if foreign:
        names = ", ".join(f"{o.ref} ({SERVICE_LABEL}={o.service_label})" for o in foreign)
        return Stop(
            decision=Decision(
                verdict=Verdict.SKIP,
                events=(
                    Event(
                        type="Warning",
                        reason=Reason.FOREIGN_WORKLOAD,
                        message=f"belongs to another service, nothing deleted: {names}",
                    ),
                ),
            )
        )
    if p.obs.route is None:
        return _enter(status, p, Stage.UNINSTALLING, Reason.NO_ROUTE, outcome=Outcome.NO_ROUTE, uninstalled_at=p.now)
    return _enter(status, p, Stage.ROUTE_REMOVING, Reason.ROUTE_REMOVING)


def _route_removing(status: DeletionStatus, p: Pass) -> Advance | Stop:
    route = p.obs.route
    if route is None or not route.exists:
        return _enter(status, p, Stage.ROUTE_SETTLING, Reason.ROUTE_SETTLING, route_removed_at=p.now)
    if p.now >= p.deadline:
        return _enter(
            status,
            p,
            Stage.UNINSTALLING,
            Reason.ROUTE_STUCK,
            "Warning",
            outcome=Outcome.ROUTE_STUCK,
            uninstalled_at=p.now,
        )
    # Ask again until it is gone (a failed delete is retried); never touch its finalizers.
    deletes = (
        ()
        if route.deleting or route.foreign_to(p.obs.service)
        else (Action(kind=ActionKind.DELETE_ROUTE, ref=route.ref),)
    )
    return _wait(status, p, actions=deletes)


def _route_settling(status: DeletionStatus, p: Pass) -> Advance | Stop:
    removed = status.route_removed_at if status.route_removed_at is not None else p.now
    settle_end = min(removed + p.knobs.route_settle, p.deadline)
    if p.now >= settle_end:
        return _enter(status, p, Stage.UNINSTALLING, Reason.UNINSTALLING, uninstalled_at=p.now)
    return _wait(status, p, requeue_at=settle_end)


def _uninstalling(status: DeletionStatus, p: Pass) -> Advance | Stop:
    route_ref = None if p.obs.route is None else p.obs.route.ref
    pending = [
        o
        for o in p.obs.workload
        if o.exists and not o.deleting and o.ref != route_ref and not o.foreign_to(p.obs.service)
    ]
    if pending:
        # One pass after entering (the deletes were asked for at least once), the deadline ends it.
        tried = status.uninstalled_at is None or status.uninstalled_at < p.now
        if tried and p.now >= p.deadline:
            names = ", ".join(str(o.ref) for o in pending)
            return _timed_out(status, p, f"in Uninstalling, not deleted: {names}", p.obs.failed_actions)
        return _wait(status, p, actions=[Action(kind=ActionKind.DELETE_WORKLOAD, ref=o.ref) for o in pending])
    return _enter(status, p, Stage.PODS_TERMINATING, Reason.UNINSTALLED, prefix="workload deleted; ", **p.pod_fields())


def _pods_terminating(status: DeletionStatus, p: Pass) -> Advance | Stop:
    status = dataclasses.replace(status, **p.pod_fields())
    over = _pods_gone_or_timed_out(status, p)
    if over is not None:
        return over
    if _force_delete_targets(status, p):
        return _enter(
            status, p, Stage.FORCE_DELETING, Reason.PODS_FORCE_DELETED, "Warning", outcome=Outcome.PODS_FORCE_DELETED
        )
    return _wait(status, p)


def _force_deleting(status: DeletionStatus, p: Pass) -> Advance | Stop:
    status = dataclasses.replace(status, **p.pod_fields())
    over = _pods_gone_or_timed_out(status, p)
    if over is not None:
        return over
    targets = _force_delete_targets(status, p)
    if not targets:
        return _wait(status, p)
    names = tuple(pod.name for pod in targets)
    status = dataclasses.replace(
        status, outcome=Outcome.PODS_FORCE_DELETED, force_deleted=(status.force_deleted + names)[:MAX_LISTED_PODS]
    )
    events = tuple(
        Event(
            type="Warning",
            reason=Reason.POD_FORCE_DELETED,
            message=f"pod {pod.name} on node {pod.node or '<none>'} terminating "
            f"past force-delete-after; deleted with grace 0",
        )
        for pod in targets
    )
    actions = [Action(kind=ActionKind.FORCE_DELETE_POD, pod=pod.name, uid=pod.uid) for pod in targets]
    stop = _wait(status, p, actions=actions)
    return Stop(decision=dataclasses.replace(stop.decision, events=events))


_NEEDS: dict[Stage | None, tuple[Subject, ...]] = {
    None: (Subject.ROUTE, Subject.WORKLOAD),  # the foreign check
    Stage.ROUTE_REMOVING: (Subject.ROUTE,),
    Stage.ROUTE_SETTLING: (),
    Stage.UNINSTALLING: (Subject.WORKLOAD,),
    Stage.PODS_TERMINATING: (Subject.PODS, Subject.NODES),
    Stage.FORCE_DELETING: (Subject.PODS, Subject.NODES),
}
"""What each stage cannot decide without: when one of these reads failed, the stage is blocked."""

_STEPS: dict[Stage | None, Step] = {
    None: _start,
    Stage.ROUTE_REMOVING: _route_removing,
    Stage.ROUTE_SETTLING: _route_settling,
    Stage.UNINSTALLING: _uninstalling,
    Stage.PODS_TERMINATING: _pods_terminating,
    Stage.FORCE_DELETING: _force_deleting,
}


# --- helpers --------------------------------------------------------------------------------------


def _order(stage: Stage | None) -> int:
    return -1 if stage is None else list(Stage).index(stage)


def _enter(
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
    moved = dataclasses.replace(moved, message=_stage_message(moved, p) if message is None else message)
    return Advance(status=moved, event=Event(type=event_type, reason=reason, message=prefix + moved.message))


def _wait(status: DeletionStatus, p: Pass, *, actions: Any = (), requeue_at: float | None = None) -> Stop:
    """Stay in the stage: write the status (with a fresh message), act, requeue."""
    message = _stage_message(status, p)
    if p.obs.failed_actions:
        message += f"; last attempt failed: {_named(p.obs.failed_actions)}"
    status = dataclasses.replace(status, message=message)
    return Stop(
        decision=Decision(verdict=Verdict.CONTINUE, status=status, actions=tuple(actions), requeue_at=requeue_at)
    )


def _named(failures: Sequence[ApiFailure]) -> str:
    return "; ".join(str(f) for f in failures)


def _blocked(status: DeletionStatus, p: Pass, unread: Sequence[ApiFailure]) -> Stop:
    """A read this stage needs failed: wait without acting (nothing is decided on unknown state);
    at the deadline, TimedOut naming the calls."""
    if p.now >= p.deadline:
        return _timed_out(
            status, p, f"in {status.stage.value if status.stage else 'the first pass'}, cannot read {_named(unread)}"
        )
    message = f"cannot read {_named(unread)}; retrying until the deadline {durations.format_time(p.deadline)}"
    if status.stage is not None:
        message = f"{_stage_message(status, p)}; {message}"
    return Stop(decision=Decision(verdict=Verdict.CONTINUE, status=dataclasses.replace(status, message=message)))


def _timed_out(status: DeletionStatus, p: Pass, detail: str, failures: Sequence[ApiFailure] = ()) -> Stop:
    last = f" (last failure: {_named(failures)})" if failures else ""
    message = f"timed out after {durations.format_duration(p.knobs.max_wait)} {detail}{last}; finalizer dropped"
    return _release(status, p, Reason.TIMED_OUT, "Warning", outcome=Outcome.TIMED_OUT, message=message)


def _release(status: DeletionStatus, p: Pass, reason: Reason, event_type: str, **changes: Any) -> Stop:
    entered = _enter(status, p, Stage.RELEASED, reason, event_type, **changes)
    return Stop(decision=Decision(verdict=Verdict.RELEASE, status=entered.status, events=(entered.event,)))


def _pods_gone_or_timed_out(status: DeletionStatus, p: Pass) -> Stop | None:
    if p.pods.count == 0:
        return _release(
            status, p, Reason.RELEASED, "Normal", pods_gone_at=p.now, outcome=status.outcome or Outcome.CLEAN
        )
    if p.now >= p.deadline:
        return _timed_out(status, p, f"with {plural(p.pods.count, 'pod')} remaining", p.obs.failed_actions)
    return None


def _force_delete_targets(status: DeletionStatus, p: Pass) -> list[PodObservation]:
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


def _stage_message(status: DeletionStatus, p: Pass) -> str:
    stage, obs = status.stage, p.obs
    route = "" if obs.route is None else str(obs.route.ref)
    if stage is Stage.ROUTE_REMOVING:
        return f"deleting route {route}"
    if stage is Stage.ROUTE_SETTLING:
        assert status.route_removed_at is not None
        end = min(status.route_removed_at + p.knobs.route_settle, p.deadline)
        return f"route {route} removed; settling until {durations.format_time(end)}"
    if stage is Stage.UNINSTALLING:
        names = ", ".join(str(o.ref) for o in obs.workload if obs.route is None or o.ref != obs.route.ref)
        prefix = {
            Outcome.NO_ROUTE: "no route configured; ",
            Outcome.ROUTE_STUCK: f"route {route} still present at the deadline, its finalizers left alone; ",
        }.get(status.outcome, "")  # type: ignore[arg-type]
        return f"{prefix}deleting workload: {names or 'nothing'}"
    if stage in (Stage.PODS_TERMINATING, Stage.FORCE_DELETING):
        return p.pods.message
    if stage is Stage.RELEASED:
        return f"released: all pods gone (outcome {status.outcome.value if status.outcome else 'Clean'})"
    return ""
