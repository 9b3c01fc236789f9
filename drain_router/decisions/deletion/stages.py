"""The state machine: one function per stage, and a short driver that chains them within a pass.

Purely computational, no side effects. Each stage function takes the status so far and the pass's
inputs and returns either :class:`Advance` (the next stage needs no action and no wait: run it in the
same pass) or :class:`Stop` (the pass ends here with this decision). An ``Advance`` only moves
forward, so the driver ends after at most one visit per stage; the one way back (ForceDeleting ->
PodsTerminating) is a ``Stop``.

``maxWait`` is an overall budget: a stage whose reads failed (see ``_NEEDS``) waits without acting
and ends in TimedOut at the deadline, and so does a workload whose deletes keep failing. The
TimedOut warning names the failing calls.

The pass's inputs, the two results and the moves the stages share (enter, wait, time out, release,
the stage messages) are in ``transitions``.
"""

from __future__ import annotations

import dataclasses

from drain_router.decisions.deletion.decision import Action, Decision
from drain_router.decisions.deletion.enums import ActionKind, Outcome, Reason, Stage, Subject, Verdict
from drain_router.decisions.deletion.knobs import Knobs
from drain_router.decisions.deletion.observations import Observations
from drain_router.decisions.deletion.pods import count_pods, plural
from drain_router.decisions.deletion.refs import SERVICE_LABEL
from drain_router.decisions.deletion.status import MAX_LISTED_PODS, DeletionStatus
from drain_router.decisions.deletion.transitions import (
    Advance,
    Pass,
    Step,
    Stop,
    blocked,
    enter,
    force_delete_targets,
    pods_gone_or_timed_out,
    timed_out,
    wait,
)
from drain_router.decisions.objects import Event


def next_stage(status: DeletionStatus | None, obs: Observations, knobs: Knobs, now: float) -> Decision:
    """One pass of the staged deletion. Purely computational function with no side effects: same
    inputs, same decision; ``now`` is Unix seconds.

    Transitions that need no action and no wait are chained within the pass (each still emits its
    own event); the pass stops at the first stage that has to act or wait. The one move backwards,
    ForceDeleting -> PodsTerminating once nothing is left to force-delete, ends its pass.
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
        result = blocked(current, step, unread) if unread else _STEPS[current.stage](current, step)
        if isinstance(result, Stop):
            return _report(dataclasses.replace(result.decision, events=(*events, *result.decision.events)), obs)
        assert _order(result.status.stage) > _order(current.stage), "stages only move forward"
        current = result.status
        events.append(result.event)


def _report(decision: Decision, obs: Observations) -> Decision:
    """Every status written lists what the pass left alone because the service does not own it."""
    if decision.status is None:
        return decision
    not_owned = tuple(str(n) for n in (*obs.unowned(), *obs.ignored_pods))[:MAX_LISTED_PODS]
    return dataclasses.replace(decision, status=dataclasses.replace(decision.status, not_owned=not_owned))


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
        return enter(status, p, Stage.UNINSTALLING, Reason.NO_ROUTE, outcome=Outcome.NO_ROUTE, uninstalled_at=p.now)
    return enter(status, p, Stage.ROUTE_REMOVING, Reason.ROUTE_REMOVING)


def _route_removing(status: DeletionStatus, p: Pass) -> Advance | Stop:
    route = p.obs.route
    if route is None or not route.exists:
        return enter(status, p, Stage.ROUTE_SETTLING, Reason.ROUTE_SETTLING, route_removed_at=p.now)
    if p.now >= p.deadline:
        return enter(
            status,
            p,
            Stage.UNINSTALLING,
            Reason.ROUTE_STUCK,
            "Warning",
            outcome=Outcome.ROUTE_STUCK,
            uninstalled_at=p.now,
        )
    # Ask again until it is gone (a failed delete is retried); never touch its finalizers. A route
    # the service does not own is waited for like one held by a foreign finalizer: RouteStuck at the
    # deadline, so no workload goes under live traffic sooner than with the route removed.
    deletes = () if route.deleting or not route.owned else (Action(kind=ActionKind.DELETE_ROUTE, ref=route.ref),)
    return wait(status, p, actions=deletes)


def _route_settling(status: DeletionStatus, p: Pass) -> Advance | Stop:
    removed = status.route_removed_at if status.route_removed_at is not None else p.now
    settle_end = min(removed + p.knobs.route_settle, p.deadline)
    if p.now >= settle_end:
        return enter(status, p, Stage.UNINSTALLING, Reason.UNINSTALLING, uninstalled_at=p.now)
    return wait(status, p, requeue_at=settle_end)


def _uninstalling(status: DeletionStatus, p: Pass) -> Advance | Stop:
    route_ref = None if p.obs.route is None else p.obs.route.ref
    pending = [o for o in p.obs.workload if o.exists and not o.deleting and o.ref != route_ref and o.owned]
    if pending:
        # One pass after entering (the deletes were asked for at least once), the deadline ends it.
        tried = status.uninstalled_at is None or status.uninstalled_at < p.now
        if tried and p.now >= p.deadline:
            names = ", ".join(str(o.ref) for o in pending)
            return timed_out(status, p, f"in Uninstalling, not deleted: {names}", p.obs.failed_actions)
        return wait(status, p, actions=[Action(kind=ActionKind.DELETE_WORKLOAD, ref=o.ref) for o in pending])
    return enter(status, p, Stage.PODS_TERMINATING, Reason.UNINSTALLED, prefix="workload deleted; ", **p.pod_fields())


def _pods_terminating(status: DeletionStatus, p: Pass) -> Advance | Stop:
    status = dataclasses.replace(status, **p.pod_fields())
    over = pods_gone_or_timed_out(status, p)
    if over is not None:
        return over
    if force_delete_targets(status, p):
        return enter(
            status, p, Stage.FORCE_DELETING, Reason.PODS_FORCE_DELETED, "Warning", outcome=Outcome.PODS_FORCE_DELETED
        )
    return wait(status, p)


def _force_deleting(status: DeletionStatus, p: Pass) -> Advance | Stop:
    status = dataclasses.replace(status, **p.pod_fields())
    over = pods_gone_or_timed_out(status, p)
    if over is not None:
        return over
    targets = force_delete_targets(status, p)
    if not targets:  # seed 000's arrow back: the force-deleted pods are dealt with, wait for the rest
        done = f"{plural(status.force_deleted_count, 'pod')} force-deleted; "
        back = enter(status, p, Stage.PODS_TERMINATING, Reason.WAITING_FOR_PODS, prefix=done)
        stop = wait(back.status, p)
        return Stop(decision=dataclasses.replace(stop.decision, events=(back.event,)))
    names = tuple(pod.name for pod in targets)
    status = dataclasses.replace(
        status,
        outcome=Outcome.PODS_FORCE_DELETED,
        force_deleted=(status.force_deleted + names)[:MAX_LISTED_PODS],
        force_deleted_count=max(status.force_deleted_count, len(status.force_deleted)) + len(names),
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
    stop = wait(status, p, actions=actions)
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


def _order(stage: Stage | None) -> int:
    return -1 if stage is None else list(Stage).index(stage)
