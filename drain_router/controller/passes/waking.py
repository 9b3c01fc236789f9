"""The lifecycle pass's side of scale to zero and wake on a request (``--activator-service``): read the
route and whether a router answered ready, ask :func:`activation.step` what to do alongside the
lifecycle rules' decision (:func:`plan`), and carry it out (:func:`act`): a route switch
(:mod:`drain_router.decisions.route_switch`) or a scale of the Deployment. The lifecycle pass writes
the plan's status first, then calls :func:`act`, which posts the events last.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from drain_router.controller import context, probe
from drain_router.controller import status as status_
from drain_router.controller.kube import client as kube_
from drain_router.controller.kube import observe
from drain_router.controller.passes import turn as turn_
from drain_router.decisions import activation, deletion, lifecycle, objects, ownership, recycling, route_switch

DEFAULT_ACTIVATION_TIMEOUT = int(activation.DEFAULT_ACTIVATION_TIMEOUT_SECS)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    rules: lifecycle.RuleDecision
    """The lifecycle rules' decision as the pass carries it out: its ScaleToZero is the step's to do
    (the route first), and nothing of it runs while the service wakes or the step acts."""
    step: activation.Step
    stored: activation.ActivationStatus
    """``status.lifecycle``'s activation fields as read: what a failed action puts back."""
    route: Mapping[str, Any] | None
    """The route as read this pass (what a switch rewrites)."""
    route_consent: ownership.Consent | None = None
    """The route's ownership proof; a route the service does not own is never switched."""
    slept: bool = False
    """The step's scale-down carries out the ScaleToZero rule: the rule's event and count go with it."""
    events: tuple[objects.Event, ...] = ()
    """The rules' events (posted only with ``slept``)."""

    def records(self) -> dict[str, Any]:
        return status_.activation_dict(self.step.status)


def activation_timeout(spec: Mapping[str, Any]) -> float:
    """``spec.lifecycle.activationTimeoutSeconds`` (default 600, at least 1)."""
    value = (spec.get("lifecycle") or {}).get("activationTimeoutSeconds")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return float(value)
    return float(DEFAULT_ACTIVATION_TIMEOUT)


def router_ready(pods: Sequence[objects.Pod], answers: Sequence[probe.Answer]) -> bool:
    """A pod Ready (its condition: the Service has it as an endpoint) and not terminating, whose
    router answered ``state: serving``."""
    return any(
        p.ready and not p.terminating and a.error is None and a.state == recycling.SERVING
        for p, a in zip(pods, answers)
    )


async def read_route(
    turn: turn_.Turn, fresh: Mapping[str, Any]
) -> tuple[activation.Route, Mapping[str, Any] | None, deletion.ObjectRef | None, ownership.Consent | None]:
    """Where ``spec.route`` points: NONE without one (or when it does not exist), UNKNOWN when the read
    fails, its shape is not one this controller switches, or the service does not own it; with the
    route as read and its consent (what a switch writes with)."""
    raw = (fresh.get("spec") or {}).get("route")
    activator = turn.ctx.settings.activator_service
    if not raw or activator is None:
        return activation.Route.NONE, None, None, None
    ref = observe.object_ref(raw)
    route, failure = await observe.try_read(turn.ctx.kube.get(ref, fresh["metadata"]["namespace"]))
    if failure is not None:
        turn.logger.info(f"route read failed, nothing is switched this pass: {failure}")
        return activation.Route.UNKNOWN, None, ref, None
    if route is None or (route.get("metadata") or {}).get("deletionTimestamp"):
        return activation.Route.NONE, None, ref, None
    verdict = ownership.check(observe.owner(fresh), observe.claim(ref.kind, route))
    if isinstance(verdict, ownership.NotOwned):
        context.warn_not_owned(turn.ctx, fresh, (verdict,), turn.logger)
        return activation.Route.UNKNOWN, None, ref, None
    where = route_switch.classify(route, activator)
    if where is activation.Route.UNKNOWN:
        turn.logger.info(f"route {ref.kind}/{ref.name} has a shape this controller does not switch: left alone")
    return where, route, ref, verdict


async def plan(
    turn: turn_.Turn,
    fresh: Mapping[str, Any],
    rules: Sequence[lifecycle.Rule],
    decision: lifecycle.RuleDecision,
    stored_rules: lifecycle.LifecycleStatus,
    answers: Sequence[probe.Answer],
    replicas: int | None,
) -> tuple[Plan, deletion.ObjectRef | None]:
    """The step of this pass next to the rules' ``decision``. ``replicas``: the Deployment's
    ``spec.replicas``, ``None`` when it is absent or the staged deletion owns it."""
    lifecycle_raw = (fresh.get("status") or {}).get("lifecycle")
    stored = status_.activation_status(lifecycle_raw)
    route, obj, ref, consent = await read_route(turn, fresh)
    observed = activation.Observed(
        route=route, replicas=replicas, router_ready=router_ready(turn.workload.active_pods, answers)
    )
    holds = activation.holds_rules(stored)
    scale_rule = decision.action is lifecycle.Policy.SCALE_TO_ZERO
    # Already at 0 with a ScaleToZero rule (slept before the activator was enabled, or scaled down by
    # hand): asleep all the same, so the route goes to the activator and a request wakes it.
    asleep = replicas == 0 and any(r.policy is lifecycle.Policy.SCALE_TO_ZERO for r in rules)
    now = turn.ctx.clock()
    step = activation.step(
        observed,
        stored,
        sleep_due=(scale_rule or asleep) and not holds,
        now=now,
        activation_timeout=activation_timeout(fresh.get("spec") or {}),
    )
    scaled_at = decision.status.scaled_to_zero_at
    if step.action is activation.Action.SCALE_TO_ZERO:
        scaled_at = now if scaled_at is None or scale_rule else scaled_at
    elif scale_rule:
        scaled_at = stored_rules.scaled_to_zero_at  # not scaled (yet): the record must not say so
    kept = dataclasses.replace(decision, status=dataclasses.replace(decision.status, scaled_to_zero_at=scaled_at))
    if scale_rule or holds or step.action is not None:
        kept = dataclasses.replace(kept, action=None, events=())
    slept = scale_rule and step.action is activation.Action.SCALE_TO_ZERO
    plan_ = Plan(
        rules=kept, step=step, stored=stored, route=obj, route_consent=consent, slept=slept, events=decision.events
    )
    return plan_, ref


async def act(
    turn: turn_.Turn,
    fresh: Mapping[str, Any],
    plan_: Plan,
    route_ref: deletion.ObjectRef | None,
    deployment: deletion.ObjectRef | None,
    deployment_consent: ownership.Consent | None,
) -> bool:
    """Carry out the step's action (if any), then post its events (and the ScaleToZero rule's, when
    the step carried it out). ``False`` when the action failed: the caller puts the record back."""
    ctx, step = turn.ctx, plan_.step
    meta = fresh["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    activator = ctx.settings.activator_service
    assert activator is not None
    try:
        if step.action is None:  # a person's scale-up: nothing to do but say so
            pass
        elif step.action is activation.Action.ROUTE_TO_ACTIVATOR:
            assert plan_.route is not None and route_ref is not None and plan_.route_consent is not None
            patch = route_switch.to_activator(plan_.route, activator, f"{namespace}/{name}")
            await ctx.kube.patch(route_ref, plan_.route_consent, patch)
        elif step.action is activation.Action.ROUTE_TO_SERVICE:
            assert plan_.route is not None and route_ref is not None and plan_.route_consent is not None
            await ctx.kube.patch(route_ref, plan_.route_consent, route_switch.to_service(plan_.route))
        elif step.action is activation.Action.SCALE_UP:
            assert step.replicas is not None and deployment is not None and deployment_consent is not None
            await ctx.kube.scale(deployment, deployment_consent, step.replicas)
        else:
            assert deployment is not None and deployment_consent is not None
            await ctx.kube.scale(deployment, deployment_consent, 0)
    except kube_.CallFailed as exc:
        assert step.action is not None
        turn.logger.warning(f"{step.action.value} failed, retried next pass: {exc.failure}")
        ctx.metrics.action_errors.labels(step.action.value).inc()
        return False
    if step.action is not None:
        turn.logger.info(f"{step.action.value}: phase {step.status.phase.value}")
    if plan_.slept:
        ctx.metrics.lifecycle_actions.labels(lifecycle.Policy.SCALE_TO_ZERO.value).inc()
    for event in (*(plan_.events if plan_.slept else ()), *step.events):
        if event.reason == activation.EventReason.AWOKEN:
            ctx.metrics.wakes.labels("awoken").inc()
        elif event.reason == activation.EventReason.WAKE_FAILED:
            ctx.metrics.wakes.labels("failed").inc()
        context.post(fresh, event)
    return True


def revert(read: Mapping[str, Any]) -> Any:
    """A ``write_status`` builder putting ``status.lifecycle`` and ``status.conditions`` back as
    ``read`` (the status at the start of the pass) had them: a failed action is retried next pass
    from the same record, its events posted then."""
    lifecycle_read = dict(read.get("lifecycle") or {})
    written = ("idleSince", "scaledToZeroAt", *status_.ACTIVATION_KEYS)

    def build(_: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "lifecycle": {**dict.fromkeys(written), **lifecycle_read},
            "conditions": list(read.get("conditions") or ()),
        }

    return build
