"""The deletion knobs: annotation > ``spec.deletion`` > default, per knob.

Purely computational, no side effects: :func:`resolve_knobs` turns the raw annotation and spec strings
into seconds and reports every invalid layer instead of failing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from drain_router.decisions import durations
from drain_router.decisions.deletion.enums import Reason

ANNOTATION_MAX_WAIT = "drainrouter.dev/deletion-max-wait"
ANNOTATION_ROUTE_SETTLE = "drainrouter.dev/route-settle"
ANNOTATION_FORCE_DELETE_AFTER = "drainrouter.dev/force-delete-after"
ANNOTATION_DELETION_POLICY = "drainrouter.dev/deletion-policy"

DEFAULT_MAX_WAIT_SECS = 3600.0
"""Overall budget from ``startedAt``; past it the finalizer is dropped (TimedOut)."""
DEFAULT_ROUTE_SETTLE_SECS = 60.0
"""Wait after the route is NotFound, so gateways stop sending new requests before Services go."""

_OFF = ("off", "none", "null")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DeletionSpec:
    """``spec.deletion`` as written: duration strings, ``None`` where a field is absent or null."""

    max_wait: str | None = None
    route_settle: str | None = None
    force_delete_after: str | None = None


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
    value: str
    reason: str

    @property
    def event_reason(self) -> Reason:
        return Reason.INVALID_ANNOTATION if self.source == "annotation" else Reason.INVALID_SPEC

    @property
    def message(self) -> str:
        fallback = "spec or default" if self.source == "annotation" else "default"
        return f"{self.key}={self.value!r} ignored: {self.reason}; using the {fallback}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class KnobResolution:
    knobs: Knobs
    invalid: tuple[InvalidKnob, ...] = ()


def _duration_layer(
    value: str | None, *, source: str, key: str, nullable: bool, invalid: list[InvalidKnob]
) -> tuple[bool, float | None]:
    """(present, seconds). Absent or invalid layers are not present; invalid ones are recorded."""
    if value is None and source == "spec":
        return (False, None)
    if nullable and isinstance(value, str) and value.strip().lower() in _OFF:
        return (True, None)
    try:
        return (True, durations.parse_duration(value))  # type: ignore[arg-type]  # None is rejected there
    except durations.DurationError as exc:
        invalid.append(InvalidKnob(source=source, key=key, value=value, reason=str(exc)))  # type: ignore[arg-type]
        return (False, None)


def resolve_knobs(annotations: Mapping[str, str], deletion_spec: DeletionSpec | None) -> KnobResolution:
    """Annotation > ``spec.deletion`` > default, per knob. Invalid layers fall back to the next one and
    are reported, never fatal. ``0s`` is a real zero in both layers. For ``force-delete-after`` the
    annotation may also be ``off`` to override a spec value."""
    spec = deletion_spec or DeletionSpec()
    invalid: list[InvalidKnob] = []
    values: dict[str, float | None] = {}
    for field, spec_value, annotation, default, nullable in (
        ("maxWait", spec.max_wait, ANNOTATION_MAX_WAIT, DEFAULT_MAX_WAIT_SECS, False),
        ("routeSettle", spec.route_settle, ANNOTATION_ROUTE_SETTLE, DEFAULT_ROUTE_SETTLE_SECS, False),
        ("forceDeleteAfter", spec.force_delete_after, ANNOTATION_FORCE_DELETE_AFTER, None, True),
    ):
        chosen: float | None = default
        present, seconds = _duration_layer(
            spec_value, source="spec", key=f"spec.deletion.{field}", nullable=nullable, invalid=invalid
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
            invalid.append(
                InvalidKnob(
                    source="annotation",
                    key=ANNOTATION_DELETION_POLICY,
                    value=policy,
                    reason="expected Orphan or Delete",
                )
            )
    max_wait, route_settle = values["maxWait"], values["routeSettle"]
    assert max_wait is not None and route_settle is not None  # not nullable
    return KnobResolution(
        knobs=Knobs(
            max_wait=max_wait, route_settle=route_settle, force_delete_after=values["forceDeleteAfter"], orphan=orphan
        ),
        invalid=tuple(invalid),
    )
