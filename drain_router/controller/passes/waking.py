"""The lifecycle pass's side of scale to zero and wake on a request (``--activator-service``): read
the activator's endpoints on the ModelService's Services (:func:`observe_wake`: its EndpointSlices,
and while it sleeps the port map, the activator's pods and the ports each listens on), ask
:func:`activation.step` what to do alongside the lifecycle rules' decision (:func:`plan`), and carry it
out (:func:`act`): the activator's EndpointSlices written or removed
(:mod:`drain_router.decisions.wake_endpoints`), or a scale of the Deployment. The lifecycle pass writes
the plan's status first, then calls :func:`act`, which posts the events last. :func:`release` gives
back a deleted ModelService's ports and removes its NetworkPolicy; :func:`sweep` does the same for the
ModelServices that are gone without it (at the leader's start, then every :data:`SWEEP_PERIOD_SECS`).
The user's routes, Services and ReferenceGrants are never written.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from drain_router.controller import context, crd, probe
from drain_router.controller import status as status_
from drain_router.controller.kube import client as kube_
from drain_router.controller.kube import observe
from drain_router.controller.passes import turn as turn_
from drain_router.decisions import (
    activation,
    deletion,
    lifecycle,
    objects,
    ownership,
    recycling,
    service_ports,
    wake_endpoints,
)

SLICES = deletion.ObjectRef(api_version="discovery.k8s.io/v1", kind="EndpointSlice", name="")
POLICIES = deletion.ObjectRef(api_version="networking.k8s.io/v1", kind="NetworkPolicy", name="")
SERVICE_KIND = ("v1", "Service")
NO_WAKE_ON_REQUEST = "NoWakeOnRequest"
SWEEP_PERIOD_SECS = 300.0
"""Between two sweeps of the port map (:func:`sweep_forever`)."""
"""The Warning posted when a ModelService reached through an InferencePool sleeps: an InferencePool
selects pods, not a Service's endpoints, so no request can reach the activator to wake it."""


def _slice_ref(name: str) -> deletion.ObjectRef:
    return dataclasses.replace(SLICES, name=name)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Sight:
    """What the pass read of the wake's objects."""

    endpoints: activation.Endpoints
    services: tuple[Mapping[str, Any], ...] = ()
    """The Services the ModelService owns in ``spec.workload``, as read."""
    slices: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    """Its activator slices as read, by name."""
    assigned: Mapping[int, service_ports.Assignment] = dataclasses.field(default_factory=dict)
    """The service's activator ports (only read while the activator's endpoints may be written)."""
    listening: tuple[str, ...] = ()
    """The activator pods (IPs) that listen on every one of those ports."""

    def desired(self, owner: ownership.Owner) -> dict[str, dict[str, Any]]:
        """Slice name -> the slice that makes :attr:`listening` the endpoints of each Service."""
        by_protocol = {a.protocol: port for port, a in self.assigned.items()}
        out = {}
        for service in self.services:
            body = wake_endpoints.render_slice(
                owner=owner,
                api_version=f"{crd.group()}/{crd.version()}",
                service=service,
                assigned=by_protocol,
                addresses=self.listening,
            )
            out[body["metadata"]["name"]] = body
        return out

    def in_step(self, owner: ownership.Owner) -> bool:
        return all(wake_endpoints.in_step(self.slices.get(n), d) for n, d in self.desired(owner).items())


DEFAULT_ACTIVATION_TIMEOUT = int(activation.DEFAULT_ACTIVATION_TIMEOUT_SECS)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    rules: lifecycle.RuleDecision
    """The lifecycle rules' decision as the pass carries it out: its ScaleToZero is the step's to do
    (the activator's endpoints first), and nothing of it runs while the service wakes or the step acts."""
    step: activation.Step
    stored: activation.ActivationStatus
    """``status.lifecycle``'s activation fields as read: what a failed action puts back."""
    sight: Sight
    """The activator's endpoints as read this pass (what the step's endpoint actions write from)."""
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


async def observe_wake(turn: turn_.Turn, fresh: Mapping[str, Any], *, writing: bool) -> Sight:
    """The activator's endpoints on the ModelService's Services: its Services (``spec.workload``, kind
    Service, owned by the rule) and its slices; UNKNOWN when a read fails. ``writing``: they may be
    written this pass (a sleep due, or not Active): then also the service's ports (assigned in the
    port map first when it has none: :func:`_ports`) and the activator pods that listen on them."""
    ctx = turn.ctx
    owner = observe.owner(fresh)
    refs = [
        observe.object_ref(r)
        for r in (fresh.get("spec") or {}).get("workload") or ()
        if (r.get("apiVersion"), r.get("kind")) == SERVICE_KIND
    ]
    reads = await asyncio.gather(*(observe.try_read(ctx.kube.get(ref, owner.namespace)) for ref in refs))
    listed, listing_failed = await observe.try_read(
        ctx.kube.list(SLICES, owner.namespace, wake_endpoints.selector(owner.name))
    )
    failures = [f for _, f in (*reads, (listed, listing_failed)) if f is not None]
    if failures:
        turn.logger.info(f"read failed, the activator's endpoints are left as they are this pass: {failures[0]}")
        return Sight(endpoints=activation.Endpoints.UNKNOWN)
    services, refused = [], []
    for ref, (obj, _) in zip(refs, reads):
        if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
            continue
        verdict = ownership.check(owner, observe.claim(ref.kind, obj))
        if isinstance(verdict, ownership.NotOwned):
            refused.append(verdict)
        else:
            services.append(obj)
    if refused:
        context.warn_not_owned(ctx, fresh, refused, turn.logger)
    slices = {
        str(s["metadata"]["name"]): s
        for s in listed or ()
        if isinstance(ownership.check(owner, observe.claim(SLICES.kind, s)), ownership.Consent)
    }
    names = [str(s["metadata"]["name"]) for s in services]
    endpoints = wake_endpoints.classify(names, list(slices.values()))
    sight = Sight(endpoints=endpoints, services=tuple(services), slices=slices)
    if not writing or not services:
        return sight
    assigned = await _ports(turn, fresh, services)
    if not assigned:
        return sight
    return dataclasses.replace(sight, assigned=assigned, listening=await _listening(turn, assigned))


async def _ports(
    turn: turn_.Turn, fresh: Mapping[str, Any], services: Sequence[Mapping[str, Any]]
) -> dict[int, service_ports.Assignment]:
    """The service's ports in the activator's port map, assigned (the map written on the
    resourceVersion read) when it has none; empty when they could not be (a conflict: next pass; no
    free port: the service does not sleep)."""
    ctx = turn.ctx
    activator = ctx.settings.activator_service
    assert activator is not None
    meta = fresh["metadata"]
    wanted = wake_endpoints.wanted(meta["namespace"], meta["name"], services)
    if not wanted:
        return {}
    stored, failure = await observe.try_read(ctx.kube.get_configmap(activator.namespace, activator.configmap))
    if failure is not None:
        turn.logger.warning(f"the activator's port map could not be read: {failure}")
        return {}
    table = service_ports.parse((stored or {}).get("data"))
    new, left = service_ports.assign(table, wanted, ctx.settings.activator_ports)
    if left:
        turn.logger.warning(
            f"no free activator port in {ctx.settings.activator_ports.start}-{ctx.settings.activator_ports.stop - 1} "
            f"for {', '.join(map(str, left))}: the service stays up (widen --activator-ports)"
        )
        return {}
    if new != table:
        version = None if stored is None else (stored.get("metadata") or {}).get("resourceVersion")
        added = {str(p): str(a) for p, a in new.items() if p not in table}
        try:
            await ctx.kube.write_configmap(activator.namespace, activator.configmap, dict(added), version)
        except kube_.CallFailed as exc:
            turn.logger.info(f"the activator's port map was not written, next pass: {exc.failure}")
            return {}
        turn.logger.info(f"activator ports assigned: {added}")
    return {p: a for p, a in new.items() if a in wanted}


async def _listening(turn: turn_.Turn, assigned: Mapping[int, service_ports.Assignment]) -> tuple[str, ...]:
    """The activator's pods (the ready endpoints of its Service) whose ``/admin/ports`` says they
    listen on every one of ``assigned``. A pod that does not answer listens on nothing."""
    ctx = turn.ctx
    activator = ctx.settings.activator_service
    assert activator is not None
    ref = dataclasses.replace(SLICES, name="")
    listed, failure = await observe.try_read(
        ctx.kube.list(ref, activator.namespace, f"{wake_endpoints.SERVICE_NAME_LABEL}={activator.name}")
    )
    if failure is not None:
        turn.logger.warning(f"the activator's endpoints could not be read: {failure}")
        return ()
    ips = wake_endpoints.ready_addresses(listed or ())
    answers = await asyncio.gather(
        *(
            probe.listening(turn.session, ip, ctx.settings.activator_admin_port, ctx.settings.idle_probe_timeout_secs)
            for ip in ips
        )
    )
    return tuple(
        ip for ip, body in zip(ips, answers) if wake_endpoints.listens(wake_endpoints.parse_listening(body), assigned)
    )


async def plan(
    turn: turn_.Turn,
    fresh: Mapping[str, Any],
    rules: Sequence[lifecycle.Rule],
    decision: lifecycle.RuleDecision,
    stored_rules: lifecycle.LifecycleStatus,
    answers: Sequence[probe.Answer],
    replicas: int | None,
) -> Plan:
    """The step of this pass next to the rules' ``decision``. ``replicas``: the Deployment's
    ``spec.replicas``, ``None`` when it is absent or the staged deletion owns it."""
    lifecycle_raw = (fresh.get("status") or {}).get("lifecycle")
    stored = status_.activation_status(lifecycle_raw)
    holds = activation.holds_rules(stored)
    scale_rule = decision.action is lifecycle.Policy.SCALE_TO_ZERO
    # Already at 0 with a ScaleToZero rule (slept before the activator was enabled, or scaled down by
    # hand): asleep all the same, so the activator becomes an endpoint and a request wakes it.
    asleep = replicas == 0 and any(r.policy is lifecycle.Policy.SCALE_TO_ZERO for r in rules)
    writing = replicas is not None and (
        ((scale_rule or asleep) and not holds) or stored.phase is not activation.Phase.ACTIVE
    )
    sight = await observe_wake(turn, fresh, writing=writing)
    owner = observe.owner(fresh)
    observed = activation.Observed(
        endpoints=sight.endpoints,
        replicas=replicas,
        router_ready=router_ready(turn.workload.active_pods, answers),
        listening=bool(sight.listening),
        in_step=not sight.listening or sight.in_step(owner),
    )
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
    return Plan(rules=kept, step=step, stored=stored, sight=sight, slept=slept, events=decision.events)


async def act(
    turn: turn_.Turn,
    fresh: Mapping[str, Any],
    plan_: Plan,
    deployment: deletion.ObjectRef | None,
    deployment_consent: ownership.Consent | None,
) -> bool:
    """Carry out the step's action (if any), then post its events (and the ScaleToZero rule's, when
    the step carried it out). ``False`` when the action failed: the caller puts the record back."""
    ctx, step = turn.ctx, plan_.step
    try:
        if step.action is None:  # a person's scale-up: nothing to do but say so
            pass
        elif step.action in (activation.Action.ADD_ACTIVATOR, activation.Action.UPDATE_ACTIVATOR):
            await _write_endpoints(turn, fresh, plan_.sight)
        elif step.action is activation.Action.REMOVE_ACTIVATOR:
            await _remove_endpoints(turn, fresh, plan_.sight)
        elif step.action is activation.Action.SCALE_UP:
            assert step.replicas is not None and deployment is not None and deployment_consent is not None
            await ctx.kube.scale(deployment, deployment_consent, step.replicas)
        else:
            assert deployment is not None and deployment_consent is not None
            await ctx.kube.scale(deployment, deployment_consent, 0)
            _warn_no_wake_on_request(turn, fresh, plan_.sight)
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


async def follow(turn: turn_.Turn, fresh: Mapping[str, Any], plan_: Plan) -> None:
    """A pass with nothing to do while the activator is the Services' endpoint: its NetworkPolicy
    follows the model's own (a person may narrow ``trafficFrom`` while the service sleeps), written
    only when it differs. A refused write is logged and tried again next pass."""
    sight = plan_.sight
    if not sight.assigned or sight.endpoints is not activation.Endpoints.ACTIVATOR:
        return
    try:
        await _write_policy(turn, fresh, sight)
    except kube_.CallFailed as exc:
        turn.logger.warning(f"the activator's NetworkPolicy was not brought in step, next pass: {exc.failure}")
        turn.ctx.metrics.action_errors.labels("UpdateActivatorPolicy").inc()


def _warn_no_wake_on_request(turn: turn_.Turn, fresh: Mapping[str, Any], sight: Sight) -> None:
    """Asleep behind an InferencePool (it selects pods, not a Service's endpoints), or with no Service
    at all: no request reaches the activator; say so once per run."""
    route = (fresh.get("spec") or {}).get("route") or {}
    if route.get("kind") != "InferencePool" and sight.endpoints is not activation.Endpoints.NO_SERVICE:
        return
    why = (
        "it is reached through an InferencePool, which selects pods, not a Service's endpoints"
        if route.get("kind") == "InferencePool"
        else "it owns no Service to give the activator as an endpoint"
    )
    message = f"scaled to zero, but a request cannot wake it: {why}; a person scales it up"
    turn.logger.warning(message)
    key = ((fresh.get("metadata") or {}).get("uid", ""), NO_WAKE_ON_REQUEST, "")
    if key not in turn.ctx.warned:
        turn.ctx.warned.add(key)
        context.post(fresh, objects.Event(type="Warning", reason=NO_WAKE_ON_REQUEST, message=message))


async def _write_endpoints(turn: turn_.Turn, fresh: Mapping[str, Any], sight: Sight) -> None:
    """The NetworkPolicy admitting the model's clients to the service's activator ports first (so an
    endpoint is never one that refuses them), then each Service's slice: created, or its endpoints
    and ports patched on the resourceVersion read."""
    ctx = turn.ctx
    owner = observe.owner(fresh)
    await _write_policy(turn, fresh, sight)
    for name, desired in sight.desired(owner).items():
        stored = sight.slices.get(name)
        if stored is None:
            await ctx.kube.create(_slice_ref(name), ownership.to_create(owner, SLICES.kind, name), desired)
        elif not wake_endpoints.in_step(stored, desired):
            verdict = ownership.check(owner, observe.claim(SLICES.kind, stored))
            assert isinstance(verdict, ownership.Consent)  # (only owned slices are in the sight)
            await ctx.kube.patch(_slice_ref(name), verdict, wake_endpoints.slice_patch(stored, desired))


async def _write_policy(turn: turn_.Turn, fresh: Mapping[str, Any], sight: Sight) -> None:
    ctx = turn.ctx
    activator = ctx.settings.activator_service
    assert activator is not None
    owner = observe.owner(fresh)
    policies = await ctx.kube.list(POLICIES, owner.namespace)
    owned = [
        p for p in policies if isinstance(ownership.check(owner, observe.claim(POLICIES.kind, p)), ownership.Consent)
    ]
    pod_labels = ((fresh.get("spec") or {}).get("podSelector") or {}).get("matchLabels") or {}
    service = await ctx.kube.get(
        deletion.ObjectRef(api_version="v1", kind="Service", name=activator.name), activator.namespace
    )
    if service is None:
        raise kube_.CallFailed(
            deletion.ApiFailure(
                call=f"GET v1 services/{activator.name}", code=404, message="the activator's Service is missing"
            )
        )
    body = wake_endpoints.render_policy(
        activator=activator,
        activator_selector=(service.get("spec") or {}).get("selector") or {},
        owner=owner,
        peers=wake_endpoints.translate_peers(
            owned, owner.namespace, pod_labels, wake_endpoints.target_ports(sight.services, fresh.get("spec") or {})
        ),
        ports=sight.assigned,
    )
    ref = dataclasses.replace(POLICIES, name=body["metadata"]["name"])
    stored = await ctx.kube.get(ref, activator.namespace)
    if stored is None or (stored.get("spec") or {}) != body["spec"]:
        await ctx.kube.put_networkpolicy(body, stored)


async def _remove_endpoints(turn: turn_.Turn, fresh: Mapping[str, Any], sight: Sight) -> None:
    """Delete each activator slice (uid precondition): the Services' endpoints are the model pods."""
    owner = observe.owner(fresh)
    for name, stored in sight.slices.items():
        verdict = ownership.check(owner, observe.claim(SLICES.kind, stored))
        assert isinstance(verdict, ownership.Consent)
        await turn.ctx.kube.delete(_slice_ref(name), verdict)


async def release(ctx: context.Context, fresh: Mapping[str, Any], logger: Any) -> None:
    """The ModelService is gone (its finalizer releases it): its NetworkPolicy deleted, then its
    activator ports given back to the map (written on the resourceVersion read). In that order: a
    port given to another service must not keep this one's peers. A service that never slept has
    no ports (and so no policy): nothing is written. Its slices go with it (their owner reference).
    A failure is logged, not retried: the entries then wait for :func:`sweep`."""
    activator = ctx.settings.activator_service
    if activator is None:
        return
    owner = observe.owner(fresh)
    try:
        stored = await ctx.kube.get_configmap(activator.namespace, activator.configmap)
        table = service_ports.parse((stored or {}).get("data"))
        mine = [p for p, a in table.items() if (a.namespace, a.name) == (owner.namespace, owner.name)]
        if stored is None or not mine:
            return
        await ctx.kube.delete_networkpolicy(
            activator.namespace, wake_endpoints.policy_name(owner.namespace, owner.name)
        )
        version = (stored.get("metadata") or {}).get("resourceVersion")
        await ctx.kube.write_configmap(activator.namespace, activator.configmap, dict.fromkeys(map(str, mine)), version)
        logger.info(f"activator ports released: {sorted(mine)}")
    except kube_.CallFailed as exc:
        logger.warning(f"the activator's port map or policy of this service was not released: {exc.failure}")


async def sweep(ctx: context.Context, log: Any) -> tuple[int, ...]:
    """The port map's entries whose ModelService is gone (a GET answers 404: removed without its
    finalizer's last pass, or that pass failed to release them), in the namespaces this controller
    watches: each one's NetworkPolicy deleted, then its ports given back (on the resourceVersion read;
    a 409 waits for the next sweep). A ModelService being deleted still exists, and its finalizer
    releases it. The ports given back."""
    activator = ctx.settings.activator_service
    if activator is None:
        return ()
    settings = ctx.settings
    try:
        stored = await ctx.kube.get_configmap(activator.namespace, activator.configmap)
        if stored is None:
            return ()
        table = service_ports.parse(stored.get("data"))
        owners = sorted({(a.namespace, a.name) for a in table.values()})
        watched = [o for o in owners if settings.all_namespaces or o[0] in settings.namespaces]
        gone = {o for o in watched if await ctx.kube.get_modelservice(*o) is None}
        if not gone:
            return ()
        for namespace, name in sorted(gone):
            await ctx.kube.delete_networkpolicy(activator.namespace, wake_endpoints.policy_name(namespace, name))
        kept = service_ports.release(table, lambda a: (a.namespace, a.name) not in gone)
        freed = tuple(sorted(set(table) - set(kept)))
        version = (stored.get("metadata") or {}).get("resourceVersion")
        await ctx.kube.write_configmap(
            activator.namespace, activator.configmap, dict.fromkeys(map(str, freed)), version
        )
    except kube_.CallFailed as exc:
        log.warning("controller.sweep_failed", error=str(exc.failure), next_in_secs=SWEEP_PERIOD_SECS)
        return ()
    except kube_.FAILURES as exc:
        log.warning("controller.sweep_failed", error=repr(exc), next_in_secs=SWEEP_PERIOD_SECS)
        return ()
    log.info("controller.ports_swept", ports=list(freed), services=[f"{n}/{m}" for n, m in sorted(gone)])
    return freed


async def sweep_forever(ctx: context.Context, log: Any) -> None:
    """:func:`sweep` now, then every :data:`SWEEP_PERIOD_SECS` (read at each turn), until cancelled.
    ``log``: a structured logger (``drain_router.logs``)."""
    while True:
        await sweep(ctx, log)
        await asyncio.sleep(SWEEP_PERIOD_SECS)  # a period, not a wait for an event


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
