"""Scale to zero and wake on a request: the orderings, as one step per pass over what the controller
observes. Purely computational, no side effects.

While a ModelService sleeps, its Services get the activator's pods as endpoints, through an
EndpointSlice per Service that the controller owns (:mod:`drain_router.decisions.wake_endpoints`),
on ports the activator opens for that service alone (:mod:`drain_router.decisions.service_ports`).
The user's routes and Services are never written. A ModelService moves through three phases
(``status.lifecycle.phase``):

- **Active**: the Services' endpoints are the model pods. When the ``ScaleToZero`` rule is due, the
  activator's endpoints are added first (:attr:`Action.ADD_ACTIVATOR`, once an activator pod listens
  on the service's ports); only on a later pass that reads every slice back with a ready activator
  endpoint (:attr:`Endpoints.ACTIVATOR`) does the Deployment go to 0 (:attr:`Action.SCALE_TO_ZERO`),
  with the replicas it had recorded in ``replicasBeforeZero``. A wake asked for while the activator
  is already an endpoint (a request arrived between the two steps) cancels the sleep: its endpoints
  go (:attr:`Action.REMOVE_ACTIVATOR`) once a router answers ready; the pods never stopped.
- **ScaledToZero**: the activator holds the service's requests and asks for a wake by setting
  ``wakeRequestedAt``. The step then scales the Deployment back to ``replicasBeforeZero``
  (:attr:`Action.SCALE_UP`) and the phase becomes Waking. A person scaling it up is a wake too.
  Activator endpoints missing while nothing runs are added back; endpoints that no longer match the
  activator pods that listen (an activator rollout) are updated (:attr:`Action.UPDATE_ACTIVATOR`).
- **Waking**: once a model pod is Ready and its router answers ready, the activator's endpoints are
  removed (:attr:`Action.REMOVE_ACTIVATOR`), ``awokenAt`` and the cold-start seconds recorded, phase
  Active. A wake not ready within ``activationTimeout`` of ``wakeRequestedAt`` scales back to 0 (a
  Warning ``WakeFailed``), the activator left an endpoint, the request consumed (the next held
  request asks again).

A wake is pending while ``wakeRequestedAt`` is later than ``awokenAt`` (both are kept for the
record). The caller writes ``decision.status`` first, then carries out ``decision.action``, then
posts ``decision.events``. Recycling and lifecycle rules leave a waking service alone
(:func:`holds_rules`). At every step the Services have a ready endpoint: the Deployment goes to 0
only on a pass that read the activator's endpoints back ready, and those endpoints go only on a
pass that saw a model pod Ready with its router serving.
"""

from __future__ import annotations

import dataclasses
import enum
import math

from drain_router.decisions.objects import Condition, Event

DEFAULT_ACTIVATION_TIMEOUT_SECS = 600.0
"""How long a held request waits for a wake, and how long a wake may take before it failed: sized
for a model server's cold start (image pull, weights, warm-up)."""
DEFAULT_RETRY_AFTER_SECS = 60.0
"""``Retry-After`` on an activation timeout before any cold start was observed."""
MIN_RETRY_AFTER_SECS = 1.0
MAX_RETRY_AFTER_SECS = 3600.0
CONDITION_TYPE = "Waking"


class Phase(enum.StrEnum):
    ACTIVE = "Active"
    SCALED_TO_ZERO = "ScaledToZero"
    WAKING = "Waking"


class Endpoints(enum.Enum):
    """The activator's endpoints on the ModelService's Services (its EndpointSlices), as read this pass."""

    NONE = "none"
    """No activator slice on any of the Services: their endpoints are the model pods alone."""
    PARTIAL = "partial"
    """Some activator slice exists, but not every Service has one with a ready endpoint (being
    written, or the activator pods it named are gone): not yet an endpoint to sleep behind."""
    ACTIVATOR = "activator"
    """Every Service's activator slice was read back with a ready endpoint."""
    NO_SERVICE = "no-service"
    """The ModelService owns no Service to give endpoints to (e.g. only an InferencePool, which
    selects pods): it sleeps, and only a person's scale-up wakes it."""
    UNKNOWN = "unknown"
    """A read failed: nothing is added, removed or scaled on unknown state."""


class Action(enum.Enum):
    ADD_ACTIVATOR = "AddActivatorEndpoints"
    UPDATE_ACTIVATOR = "UpdateActivatorEndpoints"
    SCALE_TO_ZERO = "ScaleToZero"
    SCALE_UP = "ScaleUp"
    REMOVE_ACTIVATOR = "RemoveActivatorEndpoints"


class EventReason(enum.StrEnum):
    WAKE_REQUESTED = "WakeRequested"
    AWOKEN = "Awoken"
    WAKE_FAILED = "WakeFailed"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ActivationStatus:
    """The activation part of ``status.lifecycle`` (times in epoch seconds)."""

    phase: Phase = Phase.ACTIVE
    replicas_before_zero: int | None = None
    wake_requested_at: float | None = None
    """Set by the activator (or by the step, for a person's scale-up)."""
    awoken_at: float | None = None
    cold_start_seconds: float | None = None
    """The last wake's ``awokenAt - wakeRequestedAt``."""

    @property
    def wake_pending(self) -> bool:
        """A wake was asked for and not yet answered."""
        requested = self.wake_requested_at
        return requested is not None and (self.awoken_at is None or requested > self.awoken_at)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Observed:
    """What the controller read this pass."""

    endpoints: Endpoints
    replicas: int | None
    """The Deployment's ``spec.replicas``; ``None`` when it is absent or being deleted."""
    router_ready: bool
    """A model pod is Ready (its condition) and its router answered ready."""
    listening: bool = False
    """An activator pod listens on every port assigned to the service (its ``/admin/ports``): the
    activator's endpoints can be written. Only looked at when they would be."""
    in_step: bool = True
    """The activator slices' endpoints and ports are those that listen now (False after an activator
    rollout changed the pods' IPs)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    status: ActivationStatus
    """Written before the action."""
    action: Action | None = None
    replicas: int | None = None
    """For :attr:`Action.SCALE_UP`: the replicas to scale back to."""
    events: tuple[Event, ...] = ()
    condition: Condition | None = None
    """``Waking`` True while waking, False otherwise; ``None``: leave it as it is."""


def _waking(message: str) -> Condition:
    return Condition(type=CONDITION_TYPE, status="True", reason="Waking", message=message)


def _not_waking(reason: str, message: str) -> Condition:
    return Condition(type=CONDITION_TYPE, status="False", reason=reason, message=message)


def step(
    observed: Observed, status: ActivationStatus, *, sleep_due: bool, now: float, activation_timeout: float
) -> Step:
    """The one thing to do this pass. ``sleep_due``: the lifecycle rules chose ScaleToZero."""
    if observed.replicas is None:
        return Step(status=status)  # no Deployment (or being deleted): the staged deletion owns it
    if status.phase is Phase.ACTIVE:
        return _active(observed, status, sleep_due=sleep_due, now=now)
    if status.phase is Phase.SCALED_TO_ZERO:
        return _asleep(observed, status, now=now)
    return _waking_step(observed, status, now=now, activation_timeout=activation_timeout)


_PRESENT = (Endpoints.ACTIVATOR, Endpoints.PARTIAL)
"""An activator slice exists: removed at the wake's end."""
_MAY_SLEEP = (Endpoints.ACTIVATOR, Endpoints.NO_SERVICE)
"""The Deployment may go to 0: the activator's endpoints were read back ready (or there is no
Service whose endpoints would empty)."""


def _add(observed: Observed, status: ActivationStatus) -> Step:
    """The activator's endpoints, once one of its pods listens on the service's ports (until then:
    wait; the ports are being opened)."""
    return Step(status=status, action=Action.ADD_ACTIVATOR if observed.listening else None)


def _keep_in_step(observed: Observed, status: ActivationStatus) -> Step:
    if observed.endpoints is Endpoints.ACTIVATOR and not observed.in_step and observed.listening:
        return Step(status=status, action=Action.UPDATE_ACTIVATOR)
    return Step(status=status)


def _active(observed: Observed, status: ActivationStatus, *, sleep_due: bool, now: float) -> Step:
    endpoints = observed.endpoints
    if endpoints is Endpoints.UNKNOWN:
        return Step(status=status)
    if endpoints in _PRESENT and (status.wake_pending or not sleep_due):
        # Asked for between the activator's endpoints and the scale-down, or the sleep no longer
        # due: the pods still run, so the activator's endpoints go once a router answers ready.
        if not observed.replicas and endpoints is Endpoints.ACTIVATOR:
            # ... unless nothing runs behind the activator (scaled to 0 by hand between the two
            # steps): asleep, so the wake asked for (or the next one) scales it back.
            asleep = dataclasses.replace(status, phase=Phase.SCALED_TO_ZERO)
            return Step(status=asleep, condition=_not_waking("ScaledToZero", "scaled to zero behind the activator"))
        if not observed.router_ready or not observed.replicas:
            return Step(status=status)
        awoken = dataclasses.replace(status, awoken_at=now) if status.wake_pending else status
        return Step(status=awoken, action=Action.REMOVE_ACTIVATOR)
    if not sleep_due:
        return Step(status=status)
    if endpoints in (Endpoints.NONE, Endpoints.PARTIAL):
        # No request can be held for a service the activator does not front: a wake asked for now
        # is a held request's last poll after the wake it asked for, already answered. Forgotten
        # here, before the activator becomes an endpoint, it cannot turn the next sleep into a wake.
        fresh = dataclasses.replace(status, wake_requested_at=None) if status.wake_pending else status
        return _add(observed, fresh)
    # The activator's endpoints read back ready (or no Service to empty): now the Deployment may go.
    asleep = dataclasses.replace(
        status,
        phase=Phase.SCALED_TO_ZERO,
        replicas_before_zero=observed.replicas or status.replicas_before_zero,
    )
    return Step(
        status=asleep,
        action=Action.SCALE_TO_ZERO,
        condition=_not_waking("ScaledToZero", "scaled to zero; the activator holds requests"),
    )


def _asleep(observed: Observed, status: ActivationStatus, *, now: float) -> Step:
    manual = bool(observed.replicas)
    if not status.wake_pending and not manual:
        if observed.endpoints in (Endpoints.NONE, Endpoints.PARTIAL):
            return _add(observed, status)  # never a Service without a ready endpoint while asleep
        return _keep_in_step(observed, status)
    requested = status.wake_requested_at if status.wake_pending else now
    assert requested is not None
    waking = dataclasses.replace(status, phase=Phase.WAKING, wake_requested_at=requested)
    why = "a person scaled the Deployment up" if manual and not status.wake_pending else "a request is held"
    event = Event(type="Normal", reason=EventReason.WAKE_REQUESTED, message=f"waking: {why}")
    condition = _waking(f"waking since wakeRequestedAt: {why}")
    if manual:  # already scaled up: nothing to scale
        return Step(status=waking, events=(event,), condition=condition)
    return Step(
        status=waking, action=Action.SCALE_UP, replicas=wake_replicas(status), events=(event,), condition=condition
    )


def _waking_step(observed: Observed, status: ActivationStatus, *, now: float, activation_timeout: float) -> Step:
    requested = status.wake_requested_at if status.wake_requested_at is not None else now
    if observed.router_ready and observed.replicas and observed.endpoints is not Endpoints.UNKNOWN:
        cold = max(0.0, now - requested)
        awake = dataclasses.replace(status, phase=Phase.ACTIVE, awoken_at=now, cold_start_seconds=cold)
        event = Event(type="Normal", reason=EventReason.AWOKEN, message=f"awoken after a cold start of {cold:.1f}s")
        action = Action.REMOVE_ACTIVATOR if observed.endpoints in _PRESENT else None
        return Step(status=awake, action=action, events=(event,), condition=_not_waking("Awoken", event.message))
    if now >= requested + activation_timeout:
        if observed.endpoints not in _MAY_SLEEP:
            # Never to 0 without the activator's endpoints read back ready: add them first (the
            # next pass, past the timeout still, scales down).
            return _add(observed, status) if observed.endpoints is not Endpoints.UNKNOWN else Step(status=status)
        failed = dataclasses.replace(status, phase=Phase.SCALED_TO_ZERO, wake_requested_at=None)
        message = f"no router answered ready within activationTimeout ({activation_timeout:g}s): scaled back to zero"
        event = Event(type="Warning", reason=EventReason.WAKE_FAILED, message=message)
        return Step(
            status=failed,
            action=Action.SCALE_TO_ZERO,
            events=(event,),
            condition=_not_waking("WakeFailed", message),
        )
    if observed.replicas == 0:  # the scale-up recorded but not carried out (a crash, a refused call)
        return Step(status=status, action=Action.SCALE_UP, replicas=wake_replicas(status))
    return _keep_in_step(observed, status)


def wake_replicas(status: ActivationStatus) -> int:
    """The replicas a wake scales back to: those recorded at the scale-down, at least one."""
    return max(1, status.replicas_before_zero or 0)


def holds_rules(status: ActivationStatus) -> bool:
    """Recycling and lifecycle rules leave a waking service alone."""
    return status.phase is Phase.WAKING


def retry_after(cold_start_seconds: float | None) -> int:
    """``Retry-After`` (whole seconds) for a request that waited ``activationTimeout``: the last
    observed cold start (a fresh wake takes about as long), or :data:`DEFAULT_RETRY_AFTER_SECS` before
    any; clamped to ``[MIN_RETRY_AFTER_SECS, MAX_RETRY_AFTER_SECS]``, rounded up."""
    seconds = DEFAULT_RETRY_AFTER_SECS if cold_start_seconds is None else cold_start_seconds
    return math.ceil(min(MAX_RETRY_AFTER_SECS, max(MIN_RETRY_AFTER_SECS, seconds)))
