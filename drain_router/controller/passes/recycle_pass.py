"""The daemon's recycling pass: observe -> ``next_recycle`` (probe if asked, decide again) -> evict ->
status -> events."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from drain_router.controller import context, probe
from drain_router.controller import status as status_
from drain_router.controller.kube import workload as workload_
from drain_router.controller.passes import turn as turn_
from drain_router.decisions import activation, recycling


async def run(turn: turn_.Turn, fresh: Mapping[str, Any]) -> tuple[Mapping[str, Any], float]:
    """Observe -> ``next_recycle`` (probe if asked, decide again) -> evict if decided -> status ->
    events. Returns (the object as stored, when to look again)."""
    ctx, workload, logger = turn.ctx, turn.workload, turn.logger
    namespace, name = fresh["metadata"]["namespace"], fresh["metadata"]["name"]
    raw_spec = fresh.get("spec") or {}
    spec = workload_.recycling_spec(raw_spec.get("recycling"))
    standard = turn.standard_requeue()
    if spec is None:
        ctx.metrics.set_recycle_held(namespace, name, None)
        return fresh, turn.idle_requeue()
    if workload.failures:
        return fresh, standard
    status = fresh.get("status") or {}
    if ctx.settings.activator_service is not None and activation.holds_rules(
        status_.activation_status(status.get("lifecycle"))
    ):
        return fresh, standard  # waking: no eviction until it is awake

    stored = status.get("recycling") or {}
    held = status_.held_record(stored.get("held"))
    s = ctx.settings
    last = status_.evicted_record(stored.get("lastEvicted"))
    decide = functools.partial(
        recycling.next_recycle,
        spec,
        workload.observation,
        last_evicted=last,
        recheck_secs=s.idle_recheck_secs,
        settle_secs=s.recycle_settle_secs,
    )
    now = ctx.clock()
    decision = decide(None, held, now)
    if decision.kind is recycling.Kind.PROBE:
        assert decision.pod is not None
        answer = await probe.probe(
            turn.session, decision.pod.pod_ip, workload_.admin_port(raw_spec), timeout=s.idle_probe_timeout_secs
        )
        now = ctx.clock()
        result = probe.for_recycling(answer, decision.pod.uid)
        if result.failed:
            logger.info(f"idle probe of pod {decision.pod.name} failed: {answer.error}")
        decision = decide(result, held, now)
    if decision.kind is recycling.Kind.EVICT:
        assert decision.pod is not None
        pod = decision.pod
        assert pod.consent is not None, "only owned pods are observed"
        evicted = await ctx.kube.evict_pod(pod.consent)
        now = ctx.clock()
        decision = recycling.after_eviction(decision, evicted, now, retry_secs=s.recycle_retry_secs)
        if 200 <= evicted.code < 300 and not evicted.failure:
            ctx.metrics.pods_recycled.inc()
            logger.info(f"pod {pod.name} evicted: past its maximum lifetime")
        else:
            reason = decision.reason.value if decision.reason is not None else (evicted.reason or str(evicted.code))
            ctx.metrics.eviction_rejections.labels(reason).inc()
            logger.warning(f"eviction answered {evicted.code} {evicted.reason or ''}: {evicted.message}")

    condition = recycling.condition_for(decision.held, now, decision.last_evicted)
    records = {"held": status_.held_dict(decision.held), "lastEvicted": status_.evicted_dict(decision.last_evicted)}
    build = status_.record_patch(records, condition, now, section="recycling")
    fresh, _ = await status_.write_status(ctx, fresh, build, logger)
    ctx.metrics.set_recycle_held(namespace, name, None if decision.held is None else decision.held.since)
    for event in decision.events:
        context.post(fresh, event)
    return fresh, standard if decision.requeue_at is None else decision.requeue_at
