"""The staged deletion's pass: observe -> ``deletion.next_stage`` -> write status -> act -> events -> requeue.

A pass returns to release the finalizer and raises :class:`Requeue` (a ``kopf.TemporaryError``) to
requeue; the lifecycle rule DeleteWorkload runs the same step from the daemon.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import kopf

from drain_router.controller import context
from drain_router.controller import status as status_
from drain_router.controller.kube import client as kube_
from drain_router.controller.kube import observe
from drain_router.controller.passes import waking
from drain_router.decisions import deletion, durations, objects, ownership, spans


class Requeue(kopf.TemporaryError):
    """The staged deletion waiting, not failing: run the pass again after ``delay`` seconds. A type
    of its own, so the log filter (:mod:`drain_router.controller.handlers`) tells a requeue from a
    failure by the exception kopf is handling, not by the words kopf logs it with. The message
    starts with ``requeue:`` for whoever reads it in the log or in kopf's progress annotation."""

    def __init__(self, message: str, *, delay: float) -> None:
        super().__init__(f"requeue: {message}", delay=delay)


async def run_pass(ctx: context.Context, body: Mapping[str, Any], logger: Any) -> None:
    """One pass. Returns to release the finalizer, raises :class:`Requeue` to requeue."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    fresh = await ctx.kube.get_modelservice(namespace, name)  # annotations and status as of now
    if fresh is None:
        return
    with ctx.span(spans.DELETION_PASS, fresh) as span:
        decision = await deletion_step(ctx, fresh, logger)
        if span is not None:
            span.set_attribute("drain_router.deletion.verdict", decision.verdict.value)
            if decision.status is not None:
                span.set_attribute(
                    "drain_router.deletion.stage", str(decision.status.stage and decision.status.stage.value)
                )
    namespace, name = fresh["metadata"]["namespace"], fresh["metadata"]["name"]

    # 4. Requeue or release.
    if decision.verdict in (deletion.Verdict.HOLD, deletion.Verdict.CONTINUE):
        delay = (
            ctx.settings.requeue_secs if decision.requeue_at is None else max(decision.requeue_at - ctx.clock(), 0.0)
        )
        message = (
            "suspended"
            if decision.verdict is deletion.Verdict.HOLD
            else (decision.status.message if decision.status else "")
        )
        raise Requeue(message, delay=delay)
    outcome = (
        str(decision.events[0].reason)
        if decision.verdict is deletion.Verdict.SKIP and decision.events
        else decision.status.outcome.value
        if decision.status and decision.status.outcome
        else "Clean"
    )
    await waking.release(ctx, fresh, logger)  # the activator's ports and policy of this service
    ctx.metrics.deletions_finished.labels(outcome).inc()
    ctx.metrics.pods_remaining.remove(namespace, name) if decision.status else None
    ctx.metrics.set_deletion_stage(namespace, name, None, None)


async def deletion_step(ctx: context.Context, fresh: Mapping[str, Any], logger: Any) -> deletion.Decision:
    """Observe -> ``next_stage`` -> write status -> act -> events, for the ModelService as read
    (``fresh``). Shared by the finalizer's handler and the lifecycle rule DeleteWorkload."""
    body = fresh
    namespace, name = fresh["metadata"]["namespace"], fresh["metadata"]["name"]
    meta = fresh["metadata"]
    now = ctx.clock()
    spec = observe.service_spec(fresh.get("spec") or {})
    resolution = deletion.resolve_knobs(meta.get("annotations") or {}, spec.deletion)
    for invalid in resolution.invalid:
        key = (meta.get("uid", ""), invalid.key, str(invalid.value))
        if key not in ctx.warned:
            ctx.warned.add(key)
            kopf.warn(context.body(body), reason=invalid.event_reason.value, message=invalid.message)

    uid = meta.get("uid", "")
    obs = await observe.observe(ctx.kube, fresh, spec, read_nodes=ctx.settings.read_nodes)
    obs = dataclasses.replace(obs, failed_actions=ctx.failed_actions.pop(uid, ()))
    for failed in obs.failed_reads:
        logger.warning(f"read failed, nothing decided on it this pass: {failed.failure}")
    status = fresh.get("status") or {}
    recorded = status.get("deletion") or {}
    # A status without a stage but with startedAt: a first pass whose reads failed started the clock.
    previous = (
        deletion.DeletionStatus.from_dict(recorded) if recorded.get("stage") or recorded.get("startedAt") else None
    )
    decision = deletion.next_stage(previous, obs, resolution.knobs, now)
    ctx.metrics.deletion_passes.labels(decision.verdict.value).inc()

    # 1. Status first: a crash after this line repeats the action, never loses the record of it.
    # Conditional on the resourceVersion read: the daemon (recycling, lifecycle) writes conditions of
    # the same list concurrently, and an unconditional merge patch of ``conditions`` would drop
    # theirs. A conflict re-reads and rebuilds on what is stored, unless the deletion record itself
    # changed meanwhile (then this decision is stale); not written, nothing is acted on this pass.
    if decision.status is not None:

        def build(current: Mapping[str, Any]) -> dict[str, Any] | None:
            if (current.get("deletion") or {}) != recorded:
                raise _Superseded
            return _status_patch(current, decision, now)

        try:
            stored, written = await status_.write_status(ctx, fresh, build, logger)
        except _Superseded:
            written = False
        if not written:
            logger.warning("status write conflicted; nothing acted on this pass, decided again on the next")
            return dataclasses.replace(
                decision, verdict=deletion.Verdict.CONTINUE, actions=(), events=(), requeue_at=None
            )
        ctx.metrics.pods_remaining.labels(namespace, name).set(decision.status.pods_remaining or 0)
        _stage_metric(ctx, namespace, name, decision.status, stored)

    # 2. Act. Failures are counted, logged and handed to the next pass, which decides again.
    failures = []
    context.warn_not_owned(ctx, fresh, (*obs.unowned(), *obs.ignored_pods), logger)
    for action in decision.actions:
        try:
            await _act(ctx, obs, action, logger)
        except kube_.CallFailed as exc:
            failures.append(exc.failure)
            ctx.metrics.action_errors.labels(action.kind.value).inc()
            logger.warning(f"{action.kind.value} failed, retried next pass: {exc.failure}")
    if failures and decision.verdict is deletion.Verdict.CONTINUE:
        ctx.failed_actions[uid] = tuple(failures)

    # 3. Events: one per transition, one PodForceDeleted per pod.
    for event in decision.events:
        context.post(body, event)
        if (
            decision.status is not None
            and decision.status.stage is not None
            and event.reason != deletion.Reason.POD_FORCE_DELETED
        ):
            ctx.metrics.deletion_transitions.labels(decision.status.stage.value, str(event.reason)).inc()
    return decision


def _stage_metric(
    ctx: context.Context, namespace: str, name: str, status: deletion.DeletionStatus, stored: Mapping[str, Any]
) -> None:
    """The stage and since when (the stored ``Deleting`` condition's lastTransitionTime: its reason
    names the stage, so it moves with each stage and survives a restart); none once Released."""
    if status.stage is deletion.Stage.RELEASED:
        ctx.metrics.set_deletion_stage(namespace, name, None, None)
        return
    found = status_.condition((stored.get("status") or {}).get("conditions"), deletion.CONDITION_TYPE)
    since = durations.parse_time(found["lastTransitionTime"]) if found and found.get("lastTransitionTime") else None
    stage = "Starting" if status.stage is None else status.stage.value
    ctx.metrics.set_deletion_stage(namespace, name, stage, since)


class _Superseded(Exception):
    """The deletion record changed between the read this pass decided on and its status write."""


def _status_patch(current: Mapping[str, Any], decision: deletion.Decision, now: float) -> dict[str, Any] | None:
    """The merge patch for ``status``, or ``None`` when nothing would change."""
    assert decision.status is not None and decision.condition is not None
    new_deletion = decision.status.as_dict()
    conditions = objects.set_condition(current.get("conditions"), decision.condition, now)
    old_deletion = current.get("deletion") or {}
    not_owned = list(decision.status.not_owned) or None
    same = (
        current.get("phase") == "Deleting"
        and status_.compact(old_deletion) == status_.compact(new_deletion)
        and current.get("conditions") == conditions
        and current.get("notOwned") == not_owned
    )
    if same:
        return None
    return {"phase": "Deleting", "conditions": conditions, "deletion": new_deletion, "notOwned": not_owned}


async def _act(ctx: context.Context, obs: deletion.Observations, action: deletion.Action, logger: Any) -> None:
    """Carry out one action on the object it names, with the consent its observation carries; an
    object without one (never decided on, but checked here too) is left alone."""
    if action.kind in (deletion.ActionKind.DELETE_ROUTE, deletion.ActionKind.DELETE_WORKLOAD):
        assert action.ref is not None
        seen = [o for o in (obs.route, *obs.workload) if o is not None and o.ref == action.ref]
        consent = next((o.verdict for o in seen if isinstance(o.verdict, ownership.Consent)), None)
        if consent is None:
            logger.warning(f"{action.kind.value} {action.ref} not sent: not owned by this service")
            return
        await ctx.kube.delete(action.ref, consent)
    elif action.kind is deletion.ActionKind.FORCE_DELETE_POD:
        assert action.pod is not None and action.uid is not None
        pod = next((p for p in obs.pods if p.uid == action.uid and p.name == action.pod), None)
        if pod is None or pod.consent is None:
            logger.warning(f"{action.kind.value} {action.pod} not sent: not owned by this service")
            return
        code = await ctx.kube.force_delete_pod(pod.consent)
        if code == 200:
            ctx.metrics.pods_force_deleted.inc()
