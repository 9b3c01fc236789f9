"""The kopf handlers: observe -> ``deletion.next_stage`` -> write status -> act -> events -> requeue.

The staged deletion is an ``on.delete`` handler. Recycling and lifecycle rules are one
``@kopf.daemon`` per ModelService that has either: a recycling pass, then a lifecycle pass, then a
sleep until the earlier of their requeue times (at most ``max_sleep_secs``). The daemon does nothing
while ``spec.suspend`` or a deletionTimestamp is set, writes status with ``metadata.resourceVersion``
(a 409 re-reads and retries once) and never raises into kopf: every expected API answer is data.

Handlers are registered on a registry passed in (never kopf's global one), so every operator run,
including the ones tests start and stop, gets its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

import aiohttp
import kopf
from kubernetes_asyncio.client.exceptions import ApiException

from router.controller import crd, observe, probe
from router.controller import kube as kube_
from router.controller import metrics as metrics_
from router.controller import settings as settings_
from router.decisions import deletion, lifecycle, recycling

PREFIX = "drainrouter.dev"
HANDLER_ID = "staged_delete"
DAEMON_ID = "recycle_and_lifecycle"
_REQUEUE_MARK = "requeue: "
MIN_SLEEP_SECS = 0.05
"""The daemon's shortest sleep, so a requeue time already past never spins the loop."""


def _body(obj: Mapping[str, Any]) -> kopf.Body:
    """A resource as kopf's event API types it (it reads only ``metadata`` and ``kind``)."""
    return cast(kopf.Body, obj)


@dataclasses.dataclass(kw_only=True)
class Context:
    """What the handlers share for one operator run."""

    settings: settings_.ControllerSettings
    kube: kube_.Kube
    metrics: metrics_.ControllerMetrics
    connection: kopf.ConnectionInfo | None = None
    """Credentials for kopf's own client; ``None``: kopf's in-cluster / kubeconfig login."""
    clock: Callable[[], float] = time.time
    """Wall clock (Unix seconds): status timestamps must survive a restart on another machine."""
    warned: set[tuple[str, str, str]] = dataclasses.field(default_factory=set)
    """(uid, key, value) of invalid knobs already warned about, so a 5 s requeue does not repeat them."""
    failed_actions: dict[str, tuple[deletion.ApiFailure, ...]] = dataclasses.field(default_factory=dict)
    """uid -> the actions of its last pass that failed, fed to the next pass as observations (lost on
    a restart: the next pass then tries again and fails again, which is observed the same way)."""
    session: aiohttp.ClientSession | None = None
    """The idle probe's HTTP client (one per run; ``None``: the daemon opens its own)."""
    invalid_rules_warned: set[tuple[str, int]] = dataclasses.field(default_factory=set)
    """(uid, generation) already warned about with ``InvalidLifecycleRules``: once per spec generation."""


class _QuietRequeue(logging.Filter):
    """kopf logs every TemporaryError at ERROR ("failed temporarily"). Our requeues are the normal
    way a staged deletion waits, so they are logged at DEBUG instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.ERROR and f"failed temporarily: {_REQUEUE_MARK}" in record.getMessage():
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def register(registry: kopf.OperatorRegistry, ctx: Context) -> None:
    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = ctx.settings.finalizer
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=PREFIX, key="last-handled-configuration"
        )
        settings.posting.loggers = False  # only the events we post on purpose, not log lines
        # Namespaces are exact names (or the whole cluster): no namespace or CRD watching at runtime,
        # so the RBAC needs no cluster-wide list on namespaces or CRDs.
        settings.scanning.disabled = True
        logging.getLogger("kopf.objects").addFilter(_QuietRequeue())

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        if ctx.connection is not None:
            return ctx.connection
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.delete(crd.group(), crd.version(), crd.plural(), id=HANDLER_ID, registry=registry)
    async def staged_delete(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
        await run_pass(ctx, body, logger)

    @kopf.daemon(
        crd.group(),
        crd.version(),
        crd.plural(),
        id=DAEMON_ID,
        registry=registry,
        cancellation_timeout=10.0,
        when=has_rules,
    )
    async def recycle_and_lifecycle(
        stopped: kopf.DaemonStopped, body: kopf.Body, logger: kopf.Logger, **_: Any
    ) -> None:
        await service_loop(ctx, body["metadata"]["namespace"], body["metadata"]["name"], stopped, logger)


def has_rules(spec: Mapping[str, Any], **_: Any) -> bool:
    """The daemon runs only for ModelServices with ``spec.recycling`` or ``spec.lifecycle``."""
    return spec.get("recycling") is not None or spec.get("lifecycle") is not None


async def run_pass(ctx: Context, body: Mapping[str, Any], logger: Any) -> None:
    """One pass. Returns to release the finalizer, raises ``kopf.TemporaryError`` to requeue."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    fresh = await ctx.kube.get_modelservice(namespace, name)  # annotations and status as of now
    if fresh is None:
        return
    decision = await deletion_step(ctx, fresh, logger)
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
        raise kopf.TemporaryError(f"{_REQUEUE_MARK}{message}", delay=delay)
    outcome = (
        decision.events[0].reason.value
        if decision.verdict is deletion.Verdict.SKIP and decision.events
        else decision.status.outcome.value
        if decision.status and decision.status.outcome
        else "Clean"
    )
    ctx.metrics.deletions_finished.labels(outcome).inc()
    ctx.metrics.pods_remaining.remove(namespace, name) if decision.status else None


async def deletion_step(ctx: Context, fresh: Mapping[str, Any], logger: Any) -> deletion.Decision:
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
            kopf.warn(_body(body), reason=invalid.event_reason.value, message=invalid.message)

    uid = meta.get("uid", "")
    obs = await observe.observe(ctx.kube, fresh, spec)
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
    if decision.status is not None:
        written = _status_patch(status, decision, now)
        if written is not None:
            await ctx.kube.patch_modelservice_status(namespace, name, written)
        ctx.metrics.pods_remaining.labels(namespace, name).set(decision.status.pods_remaining or 0)

    # 2. Act. Failures are counted, logged and handed to the next pass, which decides again.
    failures = []
    for action in decision.actions:
        try:
            await _act(ctx, namespace, action)
        except kube_.CallFailed as exc:
            failures.append(exc.failure)
            ctx.metrics.action_errors.labels(action.kind.value).inc()
            logger.warning(f"{action.kind.value} failed, retried next pass: {exc.failure}")
    if failures and decision.verdict is deletion.Verdict.CONTINUE:
        ctx.failed_actions[uid] = tuple(failures)

    # 3. Events: one per transition, one PodForceDeleted per pod.
    for event in decision.events:
        kopf.event(_body(body), type=event.type, reason=event.reason.value, message=event.message)
        if (
            decision.status is not None
            and decision.status.stage is not None
            and event.reason.value not in (deletion.Reason.POD_FORCE_DELETED.value,)
        ):
            ctx.metrics.deletion_transitions.labels(decision.status.stage.value, event.reason.value).inc()
    return decision


def _status_patch(current: Mapping[str, Any], decision: deletion.Decision, now: float) -> dict[str, Any] | None:
    """The merge patch for ``status``, or ``None`` when nothing would change."""
    assert decision.status is not None and decision.condition is not None
    new_deletion = decision.status.as_dict()
    conditions = deletion.merge_condition(current.get("conditions"), decision.condition, now)
    old_deletion = current.get("deletion") or {}
    same = (
        current.get("phase") == "Deleting"
        and _compact(old_deletion) == _compact(new_deletion)
        and current.get("conditions") == conditions
    )
    if same:
        return None
    return {"phase": "Deleting", "conditions": conditions, "deletion": new_deletion}


def _compact(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if v not in (None, [], "")}


async def _act(ctx: Context, namespace: str, action: deletion.Action) -> None:
    if action.kind in (deletion.ActionKind.DELETE_ROUTE, deletion.ActionKind.DELETE_WORKLOAD):
        assert action.ref is not None
        await ctx.kube.delete(action.ref, namespace)
    elif action.kind is deletion.ActionKind.FORCE_DELETE_POD:
        assert action.pod is not None and action.uid is not None
        code = await ctx.kube.force_delete_pod(namespace, action.pod, action.uid)
        if code == 200:
            ctx.metrics.pods_force_deleted.inc()


# --- recycling and lifecycle rules: one daemon per ModelService -------------------------------------

#: Kubernetes API failures a daemon pass survives (logged, retried after the standard requeue).
_API_FAILURES = (ApiException, kube_.CallFailed, aiohttp.ClientError, asyncio.TimeoutError)


async def service_loop(ctx: Context, namespace: str, name: str, stopped: Any, logger: Any) -> None:
    """Pass, sleep until the pass's requeue time (``stopped.wait``: returns at once on deletion or
    operator exit), repeat. Never raises into kopf: an unexpected error is logged and retried after
    the standard requeue."""
    while not stopped:
        try:
            delay = await service_pass(ctx, namespace, name, logger)
        except _API_FAILURES as exc:
            logger.warning(f"recycling/lifecycle pass failed, retried in {ctx.settings.requeue_secs:g}s: {exc}")
            delay = ctx.settings.requeue_secs
        except Exception as exc:
            logger.exception(f"recycling/lifecycle pass crashed, retried in {ctx.settings.requeue_secs:g}s: {exc}")
            delay = ctx.settings.requeue_secs
        if delay is None:
            return
        await stopped.wait(min(max(delay, MIN_SLEEP_SECS), ctx.settings.max_sleep_secs))


async def service_pass(ctx: Context, namespace: str, name: str, logger: Any) -> float | None:
    """One recycling pass, then one lifecycle pass. Returns the seconds to sleep, ``None`` when the
    ModelService is gone."""
    fresh: Mapping[str, Any] | None = await ctx.kube.get_modelservice(namespace, name)
    if fresh is None:
        with contextlib.suppress(KeyError):  # no series left behind for a ModelService that is gone
            ctx.metrics.recycle_held_pods.remove(namespace, name)
        return None
    if fresh["metadata"].get("deletionTimestamp") or (fresh.get("spec") or {}).get("suspend"):
        return ctx.settings.max_sleep_secs  # the staged deletion owns it now, or a person said hold
    spec = observe.service_spec(fresh.get("spec") or {})
    workload = await observe.observe_workload(ctx.kube, fresh, spec)
    for failure in workload.failures:
        logger.warning(f"read failed, recycling and lifecycle rules wait for the next pass: {failure}")
    requeues: list[float] = []
    session = ctx.session
    owned = session is None
    if session is None:
        session = aiohttp.ClientSession()
    try:
        fresh, at = await _recycling_pass(ctx, fresh, workload, session, logger)
        requeues.append(at)
        fresh, at = await _lifecycle_pass(ctx, fresh, spec, workload, session, logger)
        requeues.append(at)
    finally:
        if owned:
            await session.close()
    return min(requeues) - ctx.clock()


async def _write_status(
    ctx: Context, fresh: Mapping[str, Any], build: Callable[[Mapping[str, Any]], dict[str, Any] | None], logger: Any
) -> tuple[Mapping[str, Any], bool]:
    """Write the status patch ``build(current status)`` with ``metadata.resourceVersion``; on 409
    re-read, rebuild and retry once. Returns (the object as now stored, whether the status holds
    what ``build`` asked: nothing to write counts as written)."""
    for attempt in (1, 2):
        patch = build(fresh.get("status") or {})
        if patch is None:
            return fresh, True
        meta = fresh["metadata"]
        try:
            written = await ctx.kube.patch_modelservice_status(
                meta["namespace"], meta["name"], patch, meta.get("resourceVersion")
            )
            return written or fresh, True
        except kube_.Conflict:
            reread = await ctx.kube.get_modelservice(meta["namespace"], meta["name"])
            if reread is None:
                return fresh, False
            fresh = reread
            if attempt == 2:
                logger.warning("status write conflicted twice; nothing acted on this pass")
    return fresh, False


def _condition(conditions: Any, type_: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions or () if c.get("type") == type_), None)


async def _recycling_pass(
    ctx: Context, fresh: Mapping[str, Any], workload: observe.Workload, session: aiohttp.ClientSession, logger: Any
) -> tuple[Mapping[str, Any], float]:
    """Observe -> ``next_recycle`` (probe if asked, decide again) -> evict if decided -> status ->
    events. Returns (the object as stored, when to look again)."""
    namespace, name = fresh["metadata"]["namespace"], fresh["metadata"]["name"]
    raw_spec = fresh.get("spec") or {}
    spec = observe.recycling_spec(raw_spec.get("recycling"))
    standard = ctx.clock() + ctx.settings.requeue_secs
    if spec is None:
        ctx.metrics.recycle_held_pods.labels(namespace, name).set(0)
        return fresh, ctx.clock() + ctx.settings.max_sleep_secs
    if workload.failures:
        return fresh, standard
    status = fresh.get("status") or {}
    held = observe.held_record((status.get("recycling") or {}).get("held"))
    now = ctx.clock()
    s = ctx.settings
    decision = recycling.next_recycle(spec, workload.observation, None, held, now, recheck_secs=s.idle_recheck_secs)
    if decision.kind is recycling.Kind.PROBE:
        assert decision.pod is not None
        answer = await probe.probe(
            session, decision.pod.pod_ip, observe.admin_port(raw_spec), timeout=s.idle_probe_timeout_secs
        )
        now = ctx.clock()
        result = probe.for_recycling(answer, decision.pod.uid)
        if result.failed:
            logger.info(f"idle probe of pod {decision.pod.name} failed: {answer.error}")
        decision = recycling.next_recycle(
            spec, workload.observation, result, held, now, recheck_secs=s.idle_recheck_secs
        )
    if decision.kind is recycling.Kind.EVICT:
        assert decision.pod is not None
        evicted = await ctx.kube.evict_pod(namespace, decision.pod.name, decision.pod.uid)
        now = ctx.clock()
        decision = recycling.after_eviction(decision, evicted, now, retry_secs=s.recycle_retry_secs)
        if 200 <= evicted.code < 300 and not evicted.failure:
            ctx.metrics.pods_recycled.inc()
            logger.info(f"pod {decision.pod.name if decision.pod else ''} evicted: past its maximum lifetime")
        else:
            reason = decision.reason.value if decision.reason is not None else (evicted.reason or str(evicted.code))
            ctx.metrics.eviction_rejections.labels(reason).inc()
            logger.warning(f"eviction answered {evicted.code} {evicted.reason or ''}: {evicted.message}")

    condition = recycling.condition_for(decision.held, now)

    def build(current: Mapping[str, Any]) -> dict[str, Any] | None:
        new_held = observe.held_dict(decision.held)
        old = _condition(current.get("conditions"), condition.type)
        same_condition = old is not None and (old.get("status"), old.get("reason")) == (
            condition.status,
            condition.reason,
        )
        if _compact((current.get("recycling") or {}).get("held") or {}) == _compact(new_held or {}) and same_condition:
            return None
        return {
            "recycling": {"held": new_held},
            "conditions": deletion.set_condition(
                current.get("conditions"), condition.type, condition.status, condition.reason, condition.message, now
            ),
        }

    fresh, _ = await _write_status(ctx, fresh, build, logger)
    ctx.metrics.recycle_held_pods.labels(namespace, name).set(0 if decision.held is None else 1)
    for event in decision.events:
        kopf.event(_body(fresh), type=event.type, reason=event.reason.value, message=event.message)
    return fresh, standard if decision.requeue_at is None else decision.requeue_at


async def _lifecycle_pass(
    ctx: Context,
    fresh: Mapping[str, Any],
    spec: deletion.ServiceSpec,
    workload: observe.Workload,
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
            kopf.warn(_body(fresh), reason="InvalidLifecycleRules", message=f"lifecycle rules ignored: {message}")
        fresh, _ = await _write_status(
            ctx, fresh, _condition_patch("LifecycleRulesValid", "False", "InvalidRules", message, now), logger
        )
        return fresh, ctx.clock() + settings.max_sleep_secs
    rules = lifecycle.parse(raw["rules"])
    if workload.failures:
        return fresh, standard
    pods = workload.active_pods
    port = observe.admin_port(raw_spec)
    answers = await asyncio.gather(
        *(probe.probe(session, p.pod_ip, port, timeout=settings.idle_probe_timeout_secs) for p in pods)
    )
    reports = [probe.for_lifecycle(a, p.name) for p, a in zip(pods, answers)]
    for report in reports:
        if isinstance(report, lifecycle.ProbeFailure):
            logger.info(f"idle probe of pod {report.pod} failed, the idle clock is kept: {report.error}")
    exists, deleting, replicas = workload.deployment_state()
    status = fresh.get("status") or {}
    stored = observe.lifecycle_status(status.get("lifecycle"))
    now = ctx.clock()
    clock = lifecycle.idle_clock(reports, replicas if exists and not deleting else 0, stored, now)
    stage = (status.get("deletion") or {}).get("stage")
    done = lifecycle.done_from(
        deployment_exists=exists, deployment_deleting=deleting, deployment_replicas=replicas, deletion_stage=stage
    )
    decision = lifecycle.next_rule(rules, clock, done, stored, now, buffer_secs=settings.lifecycle_buffer_secs)
    new_lifecycle = observe.lifecycle_dict(decision.status)

    def build(current: Mapping[str, Any]) -> dict[str, Any] | None:
        old = _condition(current.get("conditions"), "LifecycleRulesValid")
        if (
            _compact(current.get("lifecycle") or {}) == _compact(new_lifecycle)
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
    fresh, written = await _write_status(ctx, fresh, build, logger)
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
            step = await deletion_step(ctx, fresh, logger)
            if step.verdict is not deletion.Verdict.RELEASE:
                requeue_at = min(requeue_at, standard if step.requeue_at is None else step.requeue_at)
        else:
            await ctx.kube.delete_modelservice(namespace, name)
    except kube_.CallFailed as exc:
        logger.warning(f"lifecycle {decision.action.value} failed, retried next pass: {exc.failure}")
        ctx.metrics.action_errors.labels(f"Lifecycle{decision.action.value}").inc()
        if decision.action is lifecycle.Policy.SCALE_TO_ZERO:  # not scaled: the record must not say so
            fresh, _ = await _write_status(
                ctx,
                fresh,
                lambda _: {
                    "lifecycle": observe.lifecycle_dict(
                        dataclasses.replace(decision.status, scaled_to_zero_at=stored.scaled_to_zero_at)
                    )
                },
                logger,
            )
        return fresh, standard
    if first:
        ctx.metrics.lifecycle_actions.labels(decision.action.value).inc()
        for event in decision.events:
            kopf.event(_body(fresh), type=event.type, reason=event.reason.value, message=event.message)
    return fresh, requeue_at


def _condition_patch(
    type_: str, status: str, reason: str, message: str, now: float
) -> Callable[[Mapping[str, Any]], dict[str, Any] | None]:
    def build(current: Mapping[str, Any]) -> dict[str, Any] | None:
        old = _condition(current.get("conditions"), type_)
        if old is not None and (old.get("status"), old.get("reason"), old.get("message")) == (status, reason, message):
            return None
        return {"conditions": deletion.set_condition(current.get("conditions"), type_, status, reason, message, now)}

    return build
