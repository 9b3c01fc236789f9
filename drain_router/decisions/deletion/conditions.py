"""The ``Deleting`` condition: derived from the status, merged into ``status.conditions``.

Purely computational, no side effects; ``now`` is a parameter.
"""

from __future__ import annotations

from drain_router.decisions.deletion.enums import Outcome, Reason, Stage
from drain_router.decisions.deletion.status import DeletionStatus
from drain_router.decisions.objects import Condition

CONDITION_TYPE = "Deleting"

_STAGE_REASONS = {
    Stage.ROUTE_REMOVING: Reason.ROUTE_REMOVING,
    Stage.ROUTE_SETTLING: Reason.ROUTE_SETTLING,
    Stage.PODS_TERMINATING: Reason.WAITING_FOR_PODS,
    Stage.FORCE_DELETING: Reason.PODS_FORCE_DELETED,
}
_UNINSTALLING_REASONS = {Outcome.ROUTE_STUCK: Reason.ROUTE_STUCK, Outcome.NO_ROUTE: Reason.NO_ROUTE}


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
        type=CONDITION_TYPE,
        status="False" if status.stage is Stage.RELEASED else "True",
        reason=reason,
        message=status.message,
    )
