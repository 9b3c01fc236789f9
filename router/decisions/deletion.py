"""Staged deletion of a ModelService: the route goes first, then the workload, then the pods.

Purely computational function with no side-effects: :func:`next_stage` takes the persisted status,
what the caller observed in the cluster, the resolved knobs and ``now`` (Unix seconds), and returns a
:class:`Decision`. The caller writes ``decision.status`` first, then carries out ``decision.actions``,
then posts ``decision.events``, then requeues or releases the finalizer. Nothing here reads a clock.

Stages only move forward::

    (start) -> RouteRemoving -> RouteSettling -> Uninstalling -> PodsTerminating -> ForceDeleting -> Released
            \\-- no route (NoRoute) --------------^      ^-- route still there at the deadline (RouteStuck)

Only the stage and timestamps carry meaning across passes (``startedAt``, ``routeRemovedAt``,
``uninstalledAt``), so a restarted controller resumes on the same clock; everything else in the status
is recomputed from observations on every pass.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any

from router.decisions import durations

GROUP = "drainrouter.dev"
ANNOTATION_MAX_WAIT = "drainrouter.dev/deletion-max-wait"
ANNOTATION_ROUTE_SETTLE = "drainrouter.dev/route-settle"
ANNOTATION_FORCE_DELETE_AFTER = "drainrouter.dev/force-delete-after"
ANNOTATION_DELETION_POLICY = "drainrouter.dev/deletion-policy"
#: A workload object (or route) carrying this label with another service's name is foreign.
SERVICE_LABEL = "drainrouter.dev/service"

DEFAULT_MAX_WAIT_SECS = 3600.0
"""Overall budget from ``startedAt``; past it the finalizer is dropped (TimedOut)."""
DEFAULT_ROUTE_SETTLE_SECS = 60.0
"""Wait after the route is NotFound, so gateways stop sending new requests before Services go."""
POD_GONE_AFTER_GRACE_SECS = 300.0
"""A terminating pod on a Ready node counts until its grace plus this (5 m), then is treated as gone."""
MAX_LISTED_PODS = 20
"""``status.deletion.pods`` and ``status.deletion.forceDeleted`` are capped at this many entries."""

#: Kinds in the Gateway API group that are routes: when ``spec.route`` is not set, the first of these
#: found in ``spec.workload`` is the route.
GATEWAY_GROUP = "gateway.networking.k8s.io"
ROUTE_KINDS = ("HTTPRoute", "GRPCRoute", "TLSRoute", "TCPRoute", "UDPRoute")
IGNORED_POD_PHASES = ("Succeeded", "Failed")


class Stage(str, enum.Enum):
    ROUTE_REMOVING = "RouteRemoving"
    ROUTE_SETTLING = "RouteSettling"
    UNINSTALLING = "Uninstalling"
    PODS_TERMINATING = "PodsTerminating"
    FORCE_DELETING = "ForceDeleting"
    RELEASED = "Released"


class Outcome(str, enum.Enum):
    CLEAN = "Clean"
    NO_ROUTE = "NoRoute"
    ROUTE_STUCK = "RouteStuck"
    PODS_FORCE_DELETED = "PodsForceDeleted"
    TIMED_OUT = "TimedOut"


class Reason(str, enum.Enum):
    """Reasons of the ``Deleting`` condition and of the per-transition events."""

    ROUTE_REMOVING = "RouteRemoving"
    ROUTE_SETTLING = "RouteSettling"
    ROUTE_STUCK = "RouteStuck"
    NO_ROUTE = "NoRoute"
    UNINSTALLING = "Uninstalling"
    UNINSTALLED = "Uninstalled"
    WAITING_FOR_PODS = "WaitingForPods"
    PODS_FORCE_DELETED = "PodsForceDeleted"
    TIMED_OUT = "TimedOut"
    RELEASED = "Released"
    # Not stages: a pass that skips everything, and the warnings.
    ORPHANED = "Orphaned"
    FOREIGN_WORKLOAD = "ForeignWorkload"
    POD_FORCE_DELETED = "PodForceDeleted"
    INVALID_ANNOTATION = "InvalidAnnotation"
    INVALID_SPEC = "InvalidSpec"


class Verdict(str, enum.Enum):
    HOLD = "Hold"
    """``spec.suspend``: do nothing, keep the finalizer, look again later."""
    SKIP = "Skip"
    """Orphan policy or a foreign object: drop the finalizer without running (further) stages."""
    CONTINUE = "Continue"
    """Write the status, act, requeue."""
    RELEASE = "Release"
    """Write the status, drop the finalizer: the teardown is over."""


class ActionKind(str, enum.Enum):
    DELETE_ROUTE = "DeleteRoute"
    DELETE_WORKLOAD = "DeleteWorkload"
    FORCE_DELETE_POD = "ForceDeletePod"


# --- references and route lookup ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ObjectRef:
    api_version: str
    kind: str
    name: str

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ObjectRef:
        return cls(api_version=data["apiVersion"], kind=data["kind"], name=data["name"])

    def as_dict(self) -> dict[str, str]:
        return {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}


def is_route_kind(ref: ObjectRef) -> bool:
    return ref.group == GATEWAY_GROUP and ref.kind in ROUTE_KINDS


def workload_refs(spec: Mapping[str, Any]) -> tuple[ObjectRef, ...]:
    """``spec.workload`` in order, as references."""
    return tuple(ObjectRef.from_dict(item) for item in spec.get("workload") or ())


def find_route(spec: Mapping[str, Any]) -> ObjectRef | None:
    """The route to remove first: ``spec.route`` if set, else the first Gateway API route kind listed
    in ``spec.workload`` (so a chart that lists its HTTPRoute with the workload still gets the staged
    order), else ``None`` (outcome NoRoute)."""
    route = spec.get("route")
    if route:
        return ObjectRef.from_dict(route)
    for ref in workload_refs(spec):
        if is_route_kind(ref):
            return ref
    return None


# --- knobs ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Knobs:
    max_wait: float = DEFAULT_MAX_WAIT_SECS
    """Seconds from ``startedAt`` to the deadline."""
    route_settle: float = DEFAULT_ROUTE_SETTLE_SECS
    """Seconds to wait after the route is gone."""
    force_delete_after: float | None = None
    """Seconds a pod may terminate before a grace-0 delete; ``None``: never force delete."""
    orphan: bool = False
    """``deletion-policy: Orphan``: skip every stage."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class InvalidKnob:
    source: str
    """``annotation`` or ``spec``."""
    key: str
    """The annotation name or the spec path."""
    value: Any
    reason: str

    @property
    def event_reason(self) -> Reason:
        return Reason.INVALID_ANNOTATION if self.source == "annotation" else Reason.INVALID_SPEC

    @property
    def message(self) -> str:
        return f"{self.key}={self.value!r} ignored: {self.reason}; using the {'spec or default' if self.source == 'annotation' else 'default'}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class KnobResolution:
    knobs: Knobs
    invalid: tuple[InvalidKnob, ...] = ()


_OFF = ("off", "none", "null")


def _duration_layer(
    value: Any, *, source: str, key: str, nullable: bool, invalid: list[InvalidKnob]
) -> tuple[bool, float | None]:
    """(present, seconds). Absent or invalid layers are not present; invalid ones are recorded."""
    if value is None and source == "spec":
        return (False, None)
    if nullable and isinstance(value, str) and value.strip().lower() in _OFF:
        return (True, None)
    try:
        return (True, durations.parse_duration(value))
    except durations.DurationError as exc:
        invalid.append(InvalidKnob(source=source, key=key, value=value, reason=str(exc)))
        return (False, None)


def resolve_knobs(annotations: Mapping[str, str], deletion_spec: Mapping[str, Any] | None) -> KnobResolution:
    """Annotation > ``spec.deletion`` > default, per knob. Invalid layers fall back to the next one and
    are reported, never fatal. ``0s`` is a real zero in both layers. For ``force-delete-after`` the
    annotation may also be ``off`` to override a spec value."""
    spec = deletion_spec or {}
    invalid: list[InvalidKnob] = []
    values: dict[str, float | None] = {}
    for field, annotation, default, nullable in (
        ("maxWait", ANNOTATION_MAX_WAIT, DEFAULT_MAX_WAIT_SECS, False),
        ("routeSettle", ANNOTATION_ROUTE_SETTLE, DEFAULT_ROUTE_SETTLE_SECS, False),
        ("forceDeleteAfter", ANNOTATION_FORCE_DELETE_AFTER, None, True),
    ):
        chosen: float | None = default
        present, seconds = _duration_layer(
            spec.get(field), source="spec", key=f"spec.deletion.{field}", nullable=nullable, invalid=invalid
        )
        if present:
            chosen = seconds
        if annotation in annotations:
            present, seconds = _duration_layer(
                annotations[annotation], source="annotation", key=annotation, nullable=nullable, invalid=invalid
            )
            if present:
                chosen = seconds
        values[field] = chosen
    orphan = False
    policy = annotations.get(ANNOTATION_DELETION_POLICY)
    if policy is not None:
        if policy == "Orphan":
            orphan = True
        elif policy != "Delete":
            invalid.append(InvalidKnob(source="annotation", key=ANNOTATION_DELETION_POLICY, value=policy,
                                       reason="expected Orphan or Delete"))
    max_wait, route_settle = values["maxWait"], values["routeSettle"]
    assert max_wait is not None and route_settle is not None  # not nullable
    return KnobResolution(
        knobs=Knobs(max_wait=max_wait, route_settle=route_settle,
                    force_delete_after=values["forceDeleteAfter"], orphan=orphan),
        invalid=tuple(invalid),
    )


# --- observations ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ObjectObservation:
    ref: ObjectRef
    exists: bool
    deleting: bool = False
    """Has a deletionTimestamp: counts as deleted (we asked, or someone did)."""
    service_label: str | None = None
    """Value of the ``drainrouter.dev/service`` label, if any."""

    def foreign_to(self, service: str) -> bool:
        return self.exists and self.service_label is not None and self.service_label != service


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PodObservation:
    name: str
    uid: str
    phase: str = "Running"
    node: str | None = None
    deletion_timestamp: float | None = None
    """When the grace ends (Kubernetes sets it to request time + grace)."""
    grace: float | None = None
    """``deletionGracePeriodSeconds`` when terminating, else the pod's terminationGracePeriodSeconds."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Observations:
    service: str
    """The ModelService's name (foreign checks)."""
    suspend: bool = False
    route: ObjectObservation | None = None
    """``None``: no route configured (NoRoute)."""
    workload: tuple[ObjectObservation, ...] = ()
    pods: tuple[PodObservation, ...] = ()
    """Pods matching ``spec.podSelector`` in the namespace, any phase."""
    nodes: Mapping[str, bool] = dataclasses.field(default_factory=dict)
    """Node name -> Ready, for the nodes of the listed pods. A name not here is a missing node."""


# --- pod counting ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PodEntry:
    name: str
    phase: str
    node: str | None
    deletion_timestamp: float | None
    grace: float | None
    stuck: bool
    stuck_why: str | None = None
    """``NotReady``, ``missing`` or ``past-grace`` when stuck (in the message, not in the status)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "phase": self.phase,
            "node": self.node,
            "deletionTimestamp": None if self.deletion_timestamp is None else durations.format_time(self.deletion_timestamp),
            "grace": None if self.grace is None else int(self.grace),
            "stuck": self.stuck,
        }


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PodCount:
    remaining: tuple[PodEntry, ...]
    """Pods that still hold the finalizer, by name."""
    message: str

    @property
    def count(self) -> int:
        return len(self.remaining)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def count_pods(pods: Sequence[PodObservation], nodes: Mapping[str, bool], now: float) -> PodCount:
    """Which of the service's pods still count, and the status message.

    Succeeded/Failed pods never count. A pod within its grace always counts. Past its grace it is
    gone if its node is NotReady or missing (no kubelet will ever confirm it), otherwise it counts
    until grace + 5 m. A pod whose node is NotReady or missing, or that is past its grace, is stuck.
    """
    remaining: list[PodEntry] = []
    for pod in sorted(pods, key=lambda p: p.name):
        if pod.phase in IGNORED_POD_PHASES:
            continue
        node_state = None if pod.node is None else ("Ready" if nodes.get(pod.node) else
                                                    "NotReady" if pod.node in nodes else "missing")
        node_bad = node_state in ("NotReady", "missing")
        past_grace = pod.deletion_timestamp is not None and now >= pod.deletion_timestamp
        if past_grace and (node_bad or now >= pod.deletion_timestamp + POD_GONE_AFTER_GRACE_SECS):  # type: ignore[operator]
            continue
        why = node_state if node_bad else ("past-grace" if past_grace else None)
        remaining.append(PodEntry(name=pod.name, phase=pod.phase, node=pod.node,
                                  deletion_timestamp=pod.deletion_timestamp, grace=pod.grace,
                                  stuck=why is not None, stuck_why=why))
    return PodCount(remaining=tuple(remaining), message=pods_message(remaining))


def pods_message(remaining: Sequence[PodEntry]) -> str:
    """``waiting for 3 pods (2 stuck on NotReady node gpu-7)``; ``no pods left`` when empty."""
    if not remaining:
        return "no pods left"
    parts = []
    for why, label in (("NotReady", "NotReady"), ("missing", "missing")):
        stuck = [p for p in remaining if p.stuck_why == why]
        if stuck:
            names = sorted({p.node for p in stuck if p.node})
            parts.append(f"{len(stuck)} stuck on {label} {'node' if len(names) == 1 else 'nodes'} {', '.join(names)}")
    late = [p for p in remaining if p.stuck_why == "past-grace"]
    if late:
        parts.append(f"{len(late)} past {'its' if len(late) == 1 else 'their'} grace")
    suffix = f" ({'; '.join(parts)})" if parts else ""
    return f"waiting for {_plural(len(remaining), 'pod')}{suffix}"


# --- status ---------------------------------------------------------------------------------------


def _time_or_none(value: Any) -> float | None:
    return None if value in (None, "") else durations.parse_time(value)


def _fmt_or_none(value: float | None) -> str | None:
    return None if value is None else durations.format_time(value)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DeletionStatus:
    """``status.deletion``. Of these, ``stage``, ``outcome`` and the timestamps carry meaning across
    passes; the rest is a report recomputed each pass."""

    stage: Stage | None = None
    outcome: Outcome | None = None
    started_at: float | None = None
    deadline: float | None = None
    route_removed_at: float | None = None
    uninstalled_at: float | None = None
    pods_gone_at: float | None = None
    pods_remaining: int | None = None
    pods: tuple[dict[str, Any], ...] = ()
    force_deleted: tuple[str, ...] = ()
    message: str = ""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> DeletionStatus:
        data = data or {}
        return cls(
            stage=Stage(data["stage"]) if data.get("stage") else None,
            outcome=Outcome(data["outcome"]) if data.get("outcome") else None,
            started_at=_time_or_none(data.get("startedAt")),
            deadline=_time_or_none(data.get("deadline")),
            route_removed_at=_time_or_none(data.get("routeRemovedAt")),
            uninstalled_at=_time_or_none(data.get("uninstalledAt")),
            pods_gone_at=_time_or_none(data.get("podsGoneAt")),
            pods_remaining=data.get("podsRemaining"),
            pods=tuple(data.get("pods") or ()),
            force_deleted=tuple(data.get("forceDeleted") or ()),
            message=data.get("message") or "",
        )

    def as_dict(self) -> dict[str, Any]:
        """Every key present (``None`` for unset), so a merge patch clears what is no longer true."""
        return {
            "stage": None if self.stage is None else self.stage.value,
            "outcome": None if self.outcome is None else self.outcome.value,
            "startedAt": _fmt_or_none(self.started_at),
            "deadline": _fmt_or_none(self.deadline),
            "routeRemovedAt": _fmt_or_none(self.route_removed_at),
            "uninstalledAt": _fmt_or_none(self.uninstalled_at),
            "podsGoneAt": _fmt_or_none(self.pods_gone_at),
            "podsRemaining": self.pods_remaining,
            "pods": list(self.pods),
            "forceDeleted": list(self.force_deleted),
            "message": self.message,
        }


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Condition:
    """The ``Deleting`` condition, derived from the status."""

    status: str
    reason: Reason
    message: str
    type: str = "Deleting"


def condition_for(status: DeletionStatus) -> Condition:
    reason = {
        Stage.ROUTE_REMOVING: Reason.ROUTE_REMOVING,
        Stage.ROUTE_SETTLING: Reason.ROUTE_SETTLING,
        Stage.PODS_TERMINATING: Reason.WAITING_FOR_PODS,
        Stage.FORCE_DELETING: Reason.PODS_FORCE_DELETED,
    }.get(status.stage)  # type: ignore[arg-type]
    if status.stage is Stage.UNINSTALLING:
        reason = {Outcome.ROUTE_STUCK: Reason.ROUTE_STUCK, Outcome.NO_ROUTE: Reason.NO_ROUTE}.get(
            status.outcome, Reason.UNINSTALLING)  # type: ignore[arg-type]
    if status.stage is Stage.RELEASED:
        reason = Reason.TIMED_OUT if status.outcome is Outcome.TIMED_OUT else Reason.RELEASED
    assert reason is not None, status
    return Condition(status="False" if status.stage is Stage.RELEASED else "True", reason=reason,
                     message=status.message)


def merge_condition(previous: Sequence[Mapping[str, Any]] | None, new: Condition, now: float) -> list[dict[str, Any]]:
    """``status.conditions`` with ``Deleting`` replaced; ``lastTransitionTime`` kept while the
    condition's status and reason are unchanged."""
    others = [dict(c) for c in previous or () if c.get("type") != new.type]
    old = next((c for c in previous or () if c.get("type") == new.type), None)
    unchanged = old is not None and old.get("status") == new.status and old.get("reason") == new.reason.value
    since = old.get("lastTransitionTime") if unchanged and old else durations.format_time(now)
    return [*others, {"type": new.type, "status": new.status, "reason": new.reason.value,
                      "message": new.message, "lastTransitionTime": since}]


# --- the decision ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    kind: ActionKind
    ref: ObjectRef | None = None
    pod: str | None = None
    uid: str | None = None
    """For force deletes: the precondition, so a replacement pod with the same name is not hit."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    type: str
    """``Normal`` or ``Warning``."""
    reason: Reason
    message: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    verdict: Verdict
    status: DeletionStatus | None = None
    """What to write before acting; ``None`` for Hold and Skip (nothing to record)."""
    actions: tuple[Action, ...] = ()
    events: tuple[Event, ...] = ()
    requeue_at: float | None = None
    """Continue: look again at exactly this time (the settle remainder); ``None``: the standard requeue."""

    @property
    def condition(self) -> Condition | None:
        return None if self.status is None else condition_for(self.status)


def next_stage(status: DeletionStatus | None, obs: Observations, knobs: Knobs, now: float) -> Decision:
    """One pass of the staged deletion. Pure: same inputs, same decision; ``now`` is Unix seconds.

    Transitions that need no action and no wait are chained within the pass (each still emits its
    own event); the pass stops at the first stage that has to act or wait.
    """
    current = status or DeletionStatus()
    if obs.suspend:
        return Decision(verdict=Verdict.HOLD)
    if current.stage is Stage.RELEASED:
        return Decision(verdict=Verdict.RELEASE, status=current)
    if knobs.orphan:
        return Decision(verdict=Verdict.SKIP, events=(Event(
            type="Normal", reason=Reason.ORPHANED,
            message="deletion-policy Orphan: route, workload and pods left in place"),))
    if current.stage is None:
        foreign = [o for o in (obs.route, *obs.workload) if o is not None and o.foreign_to(obs.service)]
        if foreign:
            names = ", ".join(f"{o.ref} ({SERVICE_LABEL}={o.service_label})" for o in foreign)
            return Decision(verdict=Verdict.SKIP, events=(Event(
                type="Warning", reason=Reason.FOREIGN_WORKLOAD,
                message=f"belongs to another service, nothing deleted: {names}"),))

    started_at = current.started_at if current.started_at is not None else now
    current = dataclasses.replace(current, started_at=started_at, deadline=started_at + knobs.max_wait)
    events: list[Event] = []

    def move(to: Stage, reason: Reason, event_type: str = "Normal", event_prefix: str = "", **changes: Any) -> None:
        nonlocal current
        current = dataclasses.replace(current, stage=to, **changes)
        current = dataclasses.replace(current, message=_stage_message(current, obs, knobs, now))
        events.append(Event(type=event_type, reason=reason, message=event_prefix + current.message))

    def done(verdict: Verdict = Verdict.CONTINUE, actions: Sequence[Action] = (),
             requeue_at: float | None = None) -> Decision:
        return Decision(verdict=verdict, status=current, actions=tuple(actions), events=tuple(events),
                        requeue_at=requeue_at)

    deadline = current.deadline
    assert deadline is not None
    for _ in range(len(Stage) + 1):  # every iteration moves forward or returns
        stage = current.stage
        if stage is None:
            if obs.route is None:
                move(Stage.UNINSTALLING, Reason.NO_ROUTE, outcome=Outcome.NO_ROUTE, uninstalled_at=now)
            else:
                move(Stage.ROUTE_REMOVING, Reason.ROUTE_REMOVING)
            continue

        if stage is Stage.ROUTE_REMOVING:
            route = obs.route
            if route is None or not route.exists:
                move(Stage.ROUTE_SETTLING, Reason.ROUTE_SETTLING, route_removed_at=now)
                continue
            if now >= deadline:
                move(Stage.UNINSTALLING, Reason.ROUTE_STUCK, "Warning", outcome=Outcome.ROUTE_STUCK,
                     uninstalled_at=now)
                continue
            current = dataclasses.replace(current, message=_stage_message(current, obs, knobs, now))
            # Ask again until it is gone (a failed delete is retried); never touch its finalizers.
            deletes = () if route.deleting or route.foreign_to(obs.service) else (
                Action(kind=ActionKind.DELETE_ROUTE, ref=route.ref),)
            return done(actions=deletes)

        if stage is Stage.ROUTE_SETTLING:
            removed = current.route_removed_at if current.route_removed_at is not None else now
            settle_end = min(removed + knobs.route_settle, deadline)
            if now >= settle_end:
                move(Stage.UNINSTALLING, Reason.UNINSTALLING, uninstalled_at=now)
                continue
            current = dataclasses.replace(current, message=_stage_message(current, obs, knobs, now))
            return done(requeue_at=settle_end)

        if stage is Stage.UNINSTALLING:
            route_ref = None if obs.route is None else obs.route.ref
            pending = [o for o in obs.workload
                       if o.exists and not o.deleting and o.ref != route_ref and not o.foreign_to(obs.service)]
            if pending:
                return done(actions=[Action(kind=ActionKind.DELETE_WORKLOAD, ref=o.ref) for o in pending])
            move(Stage.PODS_TERMINATING, Reason.UNINSTALLED, event_prefix="workload deleted; ", **_pod_fields(obs, now))
            continue

        if stage in (Stage.PODS_TERMINATING, Stage.FORCE_DELETING):
            counted = count_pods(obs.pods, obs.nodes, now)
            current = dataclasses.replace(current, **_pod_fields(obs, now))
            if counted.count == 0:
                move(Stage.RELEASED, Reason.RELEASED, pods_gone_at=now,
                     outcome=current.outcome or Outcome.CLEAN)
                return done(Verdict.RELEASE)
            if now >= deadline:
                move(Stage.RELEASED, Reason.TIMED_OUT, "Warning", outcome=Outcome.TIMED_OUT)
                return done(Verdict.RELEASE)
            targets = _force_delete_targets(current, obs, knobs, counted, now)
            if targets:
                already = current.force_deleted
                names = tuple(p.name for p in targets)
                fields: dict[str, Any] = {"outcome": Outcome.PODS_FORCE_DELETED,
                                          "force_deleted": (already + names)[:MAX_LISTED_PODS]}
                if stage is Stage.PODS_TERMINATING:
                    move(Stage.FORCE_DELETING, Reason.PODS_FORCE_DELETED, "Warning", **fields)
                else:
                    current = dataclasses.replace(current, **fields)
                for pod in targets:
                    events.append(Event(type="Warning", reason=Reason.POD_FORCE_DELETED,
                                        message=f"pod {pod.name} on node {pod.node or '<none>'} terminating "
                                                f"past force-delete-after; deleted with grace 0"))
                current = dataclasses.replace(current, message=counted.message)
                return done(actions=[Action(kind=ActionKind.FORCE_DELETE_POD, pod=p.name, uid=p.uid)
                                     for p in targets])
            current = dataclasses.replace(current, message=counted.message)
            return done()
    raise AssertionError(f"no decision for {current!r}")  # pragma: no cover


def _pod_fields(obs: Observations, now: float) -> dict[str, Any]:
    counted = count_pods(obs.pods, obs.nodes, now)
    return {
        "pods_remaining": counted.count,
        "pods": tuple(p.as_dict() for p in counted.remaining[:MAX_LISTED_PODS]),
    }


def _force_delete_targets(status: DeletionStatus, obs: Observations, knobs: Knobs, counted: PodCount,
                          now: float) -> list[PodObservation]:
    """Counted pods terminating for at least ``force_delete_after``: since their deletion was
    requested (deletionTimestamp - grace), or, when not yet marked, since the workload was deleted."""
    if knobs.force_delete_after is None:
        return []
    names = {p.name for p in counted.remaining}
    targets = []
    for pod in sorted(obs.pods, key=lambda p: p.name):
        if pod.name not in names or pod.name in status.force_deleted:
            continue
        if pod.deletion_timestamp is not None:
            since = pod.deletion_timestamp - (pod.grace or 0)
        else:
            since = status.uninstalled_at if status.uninstalled_at is not None else now
        if now - since >= knobs.force_delete_after:
            targets.append(pod)
    return targets


def _stage_message(status: DeletionStatus, obs: Observations, knobs: Knobs, now: float) -> str:
    stage = status.stage
    route = "" if obs.route is None else str(obs.route.ref)
    if stage is Stage.ROUTE_REMOVING:
        return f"deleting route {route}"
    if stage is Stage.ROUTE_SETTLING:
        assert status.route_removed_at is not None and status.deadline is not None
        end = min(status.route_removed_at + knobs.route_settle, status.deadline)
        return f"route {route} removed; settling until {durations.format_time(end)}"
    if stage is Stage.UNINSTALLING:
        names = ", ".join(str(o.ref) for o in obs.workload if obs.route is None or o.ref != obs.route.ref) or "nothing"
        prefix = {
            Outcome.NO_ROUTE: "no route configured; ",
            Outcome.ROUTE_STUCK: f"route {route} still present at the deadline, its finalizers left alone; ",
        }.get(status.outcome, "")  # type: ignore[arg-type]
        return f"{prefix}deleting workload: {names}"
    if stage in (Stage.PODS_TERMINATING, Stage.FORCE_DELETING):
        return count_pods(obs.pods, obs.nodes, now).message
    if stage is Stage.RELEASED:
        if status.outcome is Outcome.TIMED_OUT:
            return (f"timed out after {durations.format_duration(knobs.max_wait)} with "
                    f"{_plural(status.pods_remaining or 0, 'pod')} remaining; finalizer dropped")
        return f"released: all pods gone (outcome {status.outcome.value if status.outcome else 'Clean'})"
    return ""
