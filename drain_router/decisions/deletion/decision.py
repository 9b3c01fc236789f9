"""What one pass decides: the status to write, the actions, the events, the requeue.

Purely computational, no side effects: frozen values the caller carries out in that order.
"""

from __future__ import annotations

import dataclasses

from drain_router.decisions.deletion.conditions import condition_for
from drain_router.decisions.deletion.enums import ActionKind, Verdict
from drain_router.decisions.deletion.refs import ObjectRef
from drain_router.decisions.deletion.status import DeletionStatus
from drain_router.decisions.objects import Condition, Event


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    kind: ActionKind
    ref: ObjectRef | None = None
    pod: str | None = None
    uid: str | None = None
    """For force deletes: the precondition, so a replacement pod with the same name is not hit."""


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
