"""The daemon's lifecycle pass: validate -> probe every active pod -> ``idle_clock`` -> ``next_rule`` ->
status -> act -> events."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import Any

import aiohttp
import kopf

from router.controller import context, deleting, probe
from router.controller import kube as kube_
from router.controller import status as status_
from router.controller import workload as workload_
from router.decisions import deletion, lifecycle


async def run(
    ctx: context.Context,
    fresh: Mapping[str, Any],
    spec: deletion.ServiceSpec,
    workload: workload_.Workload,
    session: aiohttp.ClientSession,
    logger: Any,
) -> tuple[Mapping[str, Any], float]:
    """Validate -> probe every active pod -> ``idle_clock`` -> ``next_rule`` -> status -> act ->
    events. Returns (the object as stored, when to look again)."""
    meta, raw_spec = fresh["metadata"], fresh.get("spec") or {}
    namespace, name = meta["namespace"], meta["name"]
    settings = ctx.settings
    standard = ctx.clock() + settings.requeue_secs
    raw = raw_spec.get("lifecycle")
    if raw is None:
        return fresh, ctx.clock() + settings.max_sleep_secs
    now = ctx.clock()
    errors = lifecycle.validate(raw.get("rules") or [])
    if errors:
        message = "; ".join(str(e) for e in errors)
        key = (meta.get("uid", ""), int(meta.get("generation") or 0))
        if key not in ctx.invalid_rules_warned:
            ctx.invalid_rules_warned.add(key)
            kopf.warn(
                context.body(fresh), reason="InvalidLifecycleRules", message=f"lifecycle rules ignored: {message}"
            )
        fresh, _ = await status_.write_status(
            ctx, fresh, status_.condition_patch("LifecycleRulesValid", "False", "InvalidRules", message, now), logger
        )
        return fresh, ctx.clock() + settings.max_sleep_secs
    rules = lifecycle.parse(raw["rules"])
    if workload.failures:
        return fresh, standard
    pods = workload.active_pods
    port = workload_.admin_port(raw_spec)
    answers = await asyncio.gather(
        *(probe.probe(session, p.pod_ip, port, timeout=settings.idle_probe_timeout_secs) for p in pods)
    )
    reports = [probe.for_lifecycle(a, p.name) for p, a in zip(pods, answers)]
    for report in reports:
        if isinstance(report, lifecycle.ProbeFailure):
            logger.info(f"idle probe of pod {report.pod} failed, the idle clock is kept: {report.error}")
    exists, being_deleted, replicas = workload.deployment_state()
    status = fresh.get("status") or {}
    stored = status_.lifecycle_status(status.get("lifecycle"))
    now = ctx.clock()
    clock = lifecycle.idle_clock(reports, replicas if exists and not being_deleted else 0, stored, now)
    stage = (status.get("deletion") or {}).get("stage")
    done = lifecycle.done_from(
        deployment_exists=exists, deployment_deleting=being_deleted, deployment_replicas=replicas, deletion_stage=stage
    )
    decision = lifecycle.next_rule(rules, clock, done, stored, now, buffer_secs=settings.lifecycle_buffer_secs)
    new_lifecycle = status_.lifecycle_dict(decision.status)

    def build(current: Mapping[str, Any]) -> dict[str, Any] | None:
        old = status_.condition(current.get("conditions"), "LifecycleRulesValid")
        if (
            status_.compact(current.get("lifecycle") or {}) == status_.compact(new_lifecycle)
            and old is not None
            and old.get("status") == "True"
        ):
            return None
        return {
            "lifecycle": new_lifecycle,
            "conditions": deletion.set_condition(
                current.get("conditions"), "LifecycleRulesValid", "True", "Valid", "lifecycle rules are valid", now
            ),
        }

    # 1. Status first: a crash after this line repeats the action, never loses the record of it.
    fresh, written = await status_.write_status(ctx, fresh, build, logger)
    if not written:
        return fresh, standard
    requeue_at = standard if decision.requeue_at is None else decision.requeue_at
    if decision.action is None:
        return fresh, requeue_at

    # 2. Act (one action per pass), 3. events.
    first = True
    try:
        if decision.action is lifecycle.Policy.SCALE_TO_ZERO:
            assert workload.deployment_ref is not None
            await ctx.kube.scale(workload.deployment_ref, namespace, 0)
        elif decision.action is lifecycle.Policy.DELETE_WORKLOAD:
            first = stage is None  # one event and one count when the teardown starts, not every pass
            step = await deleting.deletion_step(ctx, fresh, logger)
            if step.verdict is not deletion.Verdict.RELEASE:
                requeue_at = min(requeue_at, standard if step.requeue_at is None else step.requeue_at)
        else:
            await ctx.kube.delete_modelservice(namespace, name)
    except kube_.CallFailed as exc:
        logger.warning(f"lifecycle {decision.action.value} failed, retried next pass: {exc.failure}")
        ctx.metrics.action_errors.labels(f"Lifecycle{decision.action.value}").inc()
        if decision.action is lifecycle.Policy.SCALE_TO_ZERO:  # not scaled: the record must not say so
            fresh, _ = await status_.write_status(
                ctx,
                fresh,
                lambda _: {
                    "lifecycle": status_.lifecycle_dict(
                        dataclasses.replace(decision.status, scaled_to_zero_at=stored.scaled_to_zero_at)
                    )
                },
                logger,
            )
        return fresh, standard
    if first:
        ctx.metrics.lifecycle_actions.labels(decision.action.value).inc()
        for event in decision.events:
            kopf.event(context.body(fresh), type=event.type, reason=event.reason.value, message=event.message)
    return fresh, requeue_at
