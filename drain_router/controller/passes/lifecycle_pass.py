"""The daemon's lifecycle pass: validate -> probe every active pod -> ``idle_clock`` -> ``next_rule`` ->
(with ``--activator-service``: the activator's endpoints read, ``activation.step``, :mod:`drain_router.controller.passes.waking`) -> status -> act ->
events."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import Any

import kopf

from drain_router.controller import context, probe
from drain_router.controller import status as status_
from drain_router.controller.kube import client as kube_
from drain_router.controller.kube import observe
from drain_router.controller.kube import workload as workload_
from drain_router.controller.passes import deleting, waking
from drain_router.controller.passes import turn as turn_
from drain_router.decisions import activation, deletion, lifecycle, objects, ownership

CONDITION_TYPE = "LifecycleRulesValid"


async def run(turn: turn_.Turn, fresh: Mapping[str, Any]) -> tuple[Mapping[str, Any], float]:
    """Validate -> probe every active pod -> ``idle_clock`` -> ``next_rule`` -> status -> act ->
    events. Returns (the object as stored, when to look again)."""
    ctx, workload, logger = turn.ctx, turn.workload, turn.logger
    standard = turn.standard_requeue()
    raw = (fresh.get("spec") or {}).get("lifecycle")
    if raw is None:
        return fresh, turn.idle_requeue()
    rules, fresh = await _rules(ctx, fresh, raw.get("rules") or [], logger)
    if rules is None:
        return fresh, turn.idle_requeue()
    if workload.failures:
        return fresh, standard
    reports, answers = await _probe_all(turn, fresh)
    status = fresh.get("status") or {}
    stored = status_.lifecycle_status(status.get("lifecycle"))
    exists, being_deleted, replicas = workload.deployment_state()
    phase = status_.activation_status(status.get("lifecycle")).phase
    waking_ = ctx.settings.activator_service is not None and phase is activation.Phase.WAKING
    clock = lifecycle.idle_clock(
        reports, replicas if exists and not being_deleted else 0, stored, ctx.clock(), waking=waking_
    )
    stage = (status.get("deletion") or {}).get("stage")
    done = lifecycle.done_from(
        deployment_exists=exists, deployment_deleting=being_deleted, deployment_replicas=replicas, deletion_stage=stage
    )
    now = ctx.clock()
    decision = lifecycle.next_rule(rules, clock, done, stored, now, buffer_secs=ctx.settings.lifecycle_buffer_secs)
    valid = objects.Condition(type=CONDITION_TYPE, status="True", reason="Valid", message="lifecycle rules are valid")
    records = status_.lifecycle_dict(decision.status)
    plan = None
    if ctx.settings.activator_service is None:  # the activation record, if any, kept as it is
        kept = status.get("lifecycle") or {}
        records.update({k: kept[k] for k in status_.ACTIVATION_KEYS if k in kept})
    else:
        owned = exists and not being_deleted and stage in (None, "Released")
        plan = await waking.plan(turn, fresh, rules, decision, stored, answers, replicas if owned else None)
        decision = plan.rules
        records = {**status_.lifecycle_dict(decision.status), **plan.records()}
    also = None if plan is None else plan.step.condition
    build = status_.record_patch({"lifecycle": records}, valid, now, also=also)

    # 1. Status first: a crash after this line repeats the action, never loses the record of it.
    read = status
    fresh, written = await status_.write_status(ctx, fresh, build, logger, retry=plan is None)
    if not written:  # with the activator: another writer (a wake asked) since the read: decide again
        return fresh, standard if plan is None else ctx.clock()
    requeue_at = standard if decision.requeue_at is None else decision.requeue_at
    if plan is not None:
        ctx.metrics.set_phase(fresh["metadata"]["namespace"], fresh["metadata"]["name"], plan.step.status.phase.value)
        requeue_at = _waking_requeue(plan, requeue_at, standard)
        if plan.step.action is not None or plan.step.events:
            # 2. Act (the activator's endpoints or the scale), 3. events; a failure puts the record back.
            acted = await waking.act(turn, fresh, plan, workload.deployment_ref, workload.deployment_consent)
            if not acted:
                fresh, _ = await status_.write_status(ctx, fresh, waking.revert(read), logger)
                return fresh, standard
            return fresh, min(requeue_at, standard) if plan.step.action is not None else requeue_at
        await waking.follow(turn, fresh, plan)  # nothing to do: the activator's policy kept in step
    if decision.action is None:
        return fresh, requeue_at
    # 2. Act (one action per pass), 3. events.
    return await _act(turn, fresh, decision, stored, stage is None, requeue_at)


def _waking_requeue(plan: waking.Plan, requeue_at: float, standard: float) -> float:
    """While waking, look again every standard requeue (a router may answer ready at any moment); so
    too while the activator is opening the ports just assigned to the service."""
    waiting = plan.sight.endpoints is not activation.Endpoints.ACTIVATOR and not plan.sight.listening
    if plan.step.status.phase is activation.Phase.WAKING or (plan.sight.assigned and waiting):
        return min(requeue_at, standard)
    return requeue_at


async def _rules(
    ctx: context.Context, fresh: Mapping[str, Any], raw: Any, logger: Any
) -> tuple[tuple[lifecycle.Rule, ...] | None, Mapping[str, Any]]:
    """The parsed rules, or ``None`` after recording why they are invalid: the condition False with
    every problem, one ``InvalidLifecycleRules`` Warning per spec generation."""
    errors = lifecycle.validate(raw)
    if not errors:
        return lifecycle.parse(raw), fresh
    meta = fresh["metadata"]
    message = "; ".join(str(e) for e in errors)
    key = (meta.get("uid", ""), int(meta.get("generation") or 0))
    if key not in ctx.invalid_rules_warned:
        ctx.invalid_rules_warned.add(key)
        kopf.warn(context.body(fresh), reason="InvalidLifecycleRules", message=f"lifecycle rules ignored: {message}")
    invalid = objects.Condition(type=CONDITION_TYPE, status="False", reason="InvalidRules", message=message)
    build = status_.record_patch({}, invalid, ctx.clock(), compare_message=True)
    fresh, _ = await status_.write_status(ctx, fresh, build, logger)
    return None, fresh


async def _probe_all(
    turn: turn_.Turn, fresh: Mapping[str, Any]
) -> tuple[list[lifecycle.RouterReport | lifecycle.ProbeFailure], list[probe.Answer]]:
    """Ask every active pod's router whether it is idle (and, for a wake, whether it serves); a failed
    probe is logged and reported. Returns the reports and the answers, one per active pod."""
    pods = turn.workload.active_pods
    port = workload_.admin_port(fresh.get("spec") or {})
    timeout = turn.ctx.settings.idle_probe_timeout_secs
    answers = await asyncio.gather(*(probe.probe(turn.session, p.pod_ip, port, timeout=timeout) for p in pods))
    reports = [probe.for_lifecycle(a, p.name) for p, a in zip(pods, answers)]
    for report in reports:
        if isinstance(report, lifecycle.ProbeFailure):
            turn.logger.info(f"idle probe of pod {report.pod} failed, the idle clock is kept: {report.error}")
    return reports, list(answers)


async def _act(
    turn: turn_.Turn,
    fresh: Mapping[str, Any],
    decision: lifecycle.RuleDecision,
    stored: lifecycle.LifecycleStatus,
    teardown_starts: bool,
    requeue_at: float,
) -> tuple[Mapping[str, Any], float]:
    """Carry out ``decision.action``, then count it and post its events (a DeleteWorkload teardown
    only when it starts, not on every pass it runs)."""
    assert decision.action is not None
    ctx, workload, logger = turn.ctx, turn.workload, turn.logger
    standard = turn.standard_requeue()
    first = True
    try:
        if decision.action is lifecycle.Policy.SCALE_TO_ZERO:
            assert workload.deployment_ref is not None and workload.deployment_consent is not None
            await ctx.kube.scale(workload.deployment_ref, workload.deployment_consent, 0)
        elif decision.action is lifecycle.Policy.DELETE_WORKLOAD:
            first = teardown_starts
            step = await deleting.deletion_step(ctx, fresh, logger)
            if step.verdict is not deletion.Verdict.RELEASE:
                requeue_at = min(requeue_at, standard if step.requeue_at is None else step.requeue_at)
        else:
            await ctx.kube.delete_modelservice(ownership.itself(observe.owner(fresh)))
    except kube_.CallFailed as exc:
        logger.warning(f"lifecycle {decision.action.value} failed, retried next pass: {exc.failure}")
        ctx.metrics.action_errors.labels(f"Lifecycle{decision.action.value}").inc()
        if decision.action is lifecycle.Policy.SCALE_TO_ZERO:  # not scaled: the record must not say so
            unscaled = dataclasses.replace(decision.status, scaled_to_zero_at=stored.scaled_to_zero_at)
            fresh, _ = await status_.write_status(
                ctx, fresh, lambda _: {"lifecycle": status_.lifecycle_dict(unscaled)}, logger
            )
        return fresh, standard
    if first:
        ctx.metrics.lifecycle_actions.labels(decision.action.value).inc()
        for event in decision.events:
            context.post(fresh, event)
    return fresh, requeue_at
