"""The kopf handlers: observe -> ``deletion.next_stage`` -> write status -> act -> events -> requeue.

Handlers are registered on a registry passed in (never kopf's global one), so every operator run,
including the ones tests start and stop, gets its own.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from router.controller import crd, kube as kube_, metrics as metrics_, observe, settings as settings_
from router.decisions import deletion

PREFIX = "drainrouter.dev"
HANDLER_ID = "staged_delete"
_REQUEUE_MARK = "requeue: "


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
            prefix=PREFIX, key="last-handled-configuration")
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


async def run_pass(ctx: Context, body: Mapping[str, Any], logger: Any) -> None:
    """One pass. Returns to release the finalizer, raises ``kopf.TemporaryError`` to requeue."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    fresh = await ctx.kube.get_modelservice(namespace, name)  # annotations and status as of now
    if fresh is None:
        return
    meta = fresh["metadata"]
    now = ctx.clock()
    spec = observe.service_spec(fresh.get("spec") or {})
    resolution = deletion.resolve_knobs(meta.get("annotations") or {}, spec.deletion)
    for invalid in resolution.invalid:
        key = (meta.get("uid", ""), invalid.key, str(invalid.value))
        if key not in ctx.warned:
            ctx.warned.add(key)
            kopf.warn(body, reason=invalid.event_reason.value, message=invalid.message)

    uid = meta.get("uid", "")
    obs = await observe.observe(ctx.kube, fresh, spec)
    obs = dataclasses.replace(obs, failed_actions=ctx.failed_actions.pop(uid, ()))
    for failed in obs.failed_reads:
        logger.warning(f"read failed, nothing decided on it this pass: {failed.failure}")
    status = fresh.get("status") or {}
    recorded = status.get("deletion") or {}
    # A status without a stage but with startedAt: a first pass whose reads failed started the clock.
    previous = deletion.DeletionStatus.from_dict(recorded) if recorded.get("stage") or recorded.get(
        "startedAt") else None
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
        kopf.event(body, type=event.type, reason=event.reason.value, message=event.message)
        if decision.status is not None and decision.status.stage is not None and event.reason.value not in (
                deletion.Reason.POD_FORCE_DELETED.value,):
            ctx.metrics.deletion_transitions.labels(decision.status.stage.value, event.reason.value).inc()

    # 4. Requeue or release.
    if decision.verdict in (deletion.Verdict.HOLD, deletion.Verdict.CONTINUE):
        delay = ctx.settings.requeue_secs if decision.requeue_at is None else max(decision.requeue_at - now, 0.0)
        message = "suspended" if decision.verdict is deletion.Verdict.HOLD else (
            decision.status.message if decision.status else "")
        raise kopf.TemporaryError(f"{_REQUEUE_MARK}{message}", delay=delay)
    outcome = (decision.events[0].reason.value if decision.verdict is deletion.Verdict.SKIP and decision.events
               else decision.status.outcome.value if decision.status and decision.status.outcome else "Clean")
    ctx.metrics.deletions_finished.labels(outcome).inc()
    ctx.metrics.pods_remaining.remove(namespace, name) if decision.status else None


def _status_patch(current: Mapping[str, Any], decision: deletion.Decision, now: float) -> dict[str, Any] | None:
    """The merge patch for ``status``, or ``None`` when nothing would change."""
    assert decision.status is not None and decision.condition is not None
    new_deletion = decision.status.as_dict()
    conditions = deletion.merge_condition(current.get("conditions"), decision.condition, now)
    old_deletion = current.get("deletion") or {}
    same = (current.get("phase") == "Deleting"
            and _compact(old_deletion) == _compact(new_deletion)
            and current.get("conditions") == conditions)
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
