"""The ``Deleting`` condition: derived from the status, merged into ``status.conditions``.

Purely computational, no side effects; ``now`` is a parameter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from router.decisions import durations
from router.decisions.deletion.enums import Outcome, Reason, Stage
from router.decisions.deletion.status import DeletionStatus

_STAGE_REASONS = {
    Stage.ROUTE_REMOVING: Reason.ROUTE_REMOVING,
    Stage.ROUTE_SETTLING: Reason.ROUTE_SETTLING,
    Stage.PODS_TERMINATING: Reason.WAITING_FOR_PODS,
    Stage.FORCE_DELETING: Reason.PODS_FORCE_DELETED,
}
_UNINSTALLING_REASONS = {Outcome.ROUTE_STUCK: Reason.ROUTE_STUCK, Outcome.NO_ROUTE: Reason.NO_ROUTE}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Condition:
    """The ``Deleting`` condition, derived from the status."""

    status: str
    reason: Reason
    message: str
    type: str = "Deleting"


def condition_for(status: DeletionStatus) -> Condition:
    """``True`` while the teardown runs, ``False`` once Released; the reason names the stage (and, in
    Uninstalling and Released, how it got there)."""
    if status.stage is Stage.UNINSTALLING:
        reason = _UNINSTALLING_REASONS.get(status.outcome, Reason.UNINSTALLING)  # type: ignore[arg-type]
    elif status.stage is Stage.RELEASED:
        reason = Reason.TIMED_OUT if status.outcome is Outcome.TIMED_OUT else Reason.RELEASED
    elif status.stage is not None:
        reason = _STAGE_REASONS[status.stage]
    else:  # the first pass could not start (its reads failed): the clock runs, nothing acted on yet
        reason = Reason.STARTING
    return Condition(
        status="False" if status.stage is Stage.RELEASED else "True", reason=reason, message=status.message
    )


def set_condition(
    previous: Sequence[Mapping[str, Any]] | None, type_: str, status: str, reason: str, message: str, now: float
) -> list[dict[str, Any]]:
    """``status.conditions`` with ``type_`` replaced; ``lastTransitionTime`` kept while its status and
    reason are unchanged. Shared by every condition the controller writes."""
    others = [dict(c) for c in previous or () if c.get("type") != type_]
    old = next((c for c in previous or () if c.get("type") == type_), None)
    unchanged = old is not None and old.get("status") == status and old.get("reason") == reason
    since = old.get("lastTransitionTime") if unchanged and old else durations.format_time(now)
    return [
        *others,
        {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": since},
    ]


def merge_condition(previous: Sequence[Mapping[str, Any]] | None, new: Condition, now: float) -> list[dict[str, Any]]:
    """``status.conditions`` with the ``Deleting`` condition ``new`` set (see :func:`set_condition`)."""
    return set_condition(previous, new.type, new.status, new.reason.value, new.message, now)
