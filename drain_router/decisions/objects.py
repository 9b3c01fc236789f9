"""What every controller decision shares about Kubernetes objects: a pod as observed, the event to
post, the condition to set and how it merges into ``status.conditions``.

Purely computational, no side effects. The staged deletion, pod recycling and lifecycle rules each
name their own event and condition reasons (string enums); the records are these.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from drain_router.decisions import durations, ownership

IGNORED_POD_PHASES = ("Succeeded", "Failed")
"""Pods in these phases have exited: never waited for, never recycled."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Pod:
    """A pod selected by ``spec.podSelector``, as the controller read it."""

    name: str
    uid: str
    phase: str = "Running"
    node: str | None = None
    ready: bool = True
    """Its ``Ready`` condition is True (not its phase)."""
    start_time: float | None = None
    pod_ip: str | None = None
    deletion_timestamp: float | None = None
    """When the grace ends (Kubernetes sets it to request time + grace); ``None``: not terminating."""
    grace: float | None = None
    """``deletionGracePeriodSeconds`` when terminating, else the pod's terminationGracePeriodSeconds."""
    consent: ownership.Consent | None = None
    """The proof that the service owns this pod (:func:`ownership.check_pod`): what an eviction or a
    force delete of it needs. The controller only hands pods that have one to the decisions."""

    @property
    def terminating(self) -> bool:
        return self.deletion_timestamp is not None

    @property
    def active(self) -> bool:
        return self.phase not in IGNORED_POD_PHASES


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    type: str
    """``Normal`` or ``Warning``."""
    reason: str
    """A member of the deciding feature's reason enum (a ``StrEnum``: its value on the wire)."""
    message: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Condition:
    """One entry of ``status.conditions``, before its ``lastTransitionTime``."""

    type: str
    status: str
    """``True`` or ``False``."""
    reason: str
    message: str


def set_condition(previous: Sequence[Mapping[str, Any]] | None, new: Condition, now: float) -> list[dict[str, Any]]:
    """``status.conditions`` with ``new.type`` replaced; ``lastTransitionTime`` kept while its status
    and reason are unchanged. Shared by every condition the controller writes."""
    others = [dict(c) for c in previous or () if c.get("type") != new.type]
    old = next((c for c in previous or () if c.get("type") == new.type), None)
    reason = str(new.reason)
    unchanged = old is not None and old.get("status") == new.status and old.get("reason") == reason
    since = old.get("lastTransitionTime") if unchanged and old else durations.format_time(now)
    return [
        *others,
        {"type": new.type, "status": new.status, "reason": reason, "message": new.message, "lastTransitionTime": since},
    ]
