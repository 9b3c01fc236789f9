"""``status.deletion``: the typed status and its wire format (``from_dict`` / ``as_dict``).

Purely computational, no side effects. Times are Unix seconds inside, RFC 3339 strings on the wire.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from drain_router.decisions import durations
from drain_router.decisions.deletion.enums import Outcome, Stage

MAX_LISTED_PODS = 20
"""``status.deletion.pods`` and ``status.deletion.forceDeleted`` are capped at this many entries."""


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
    """The first :data:`MAX_LISTED_PODS` pods force-deleted."""
    force_deleted_count: int = 0
    """How many pods were force-deleted in all (the list stops at :data:`MAX_LISTED_PODS`)."""
    not_owned: tuple[str, ...] = ()
    """The objects named (and pods selected) but not owned, each ``Kind/name: why``, at most
    :data:`MAX_LISTED_PODS`: left alone. Written as the top-level ``status.notOwned``, not here."""
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
            force_deleted_count=int(data.get("forceDeletedCount") or 0),
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
            "forceDeletedCount": self.force_deleted_count,
            "message": self.message,
        }
