"""The ModelService's ``status``: the recycling and lifecycle records' wire format, and how a patch is
written (with ``metadata.resourceVersion``; a 409 re-reads and retries once)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from drain_router.controller import context
from drain_router.controller import kube as kube_
from drain_router.decisions import durations, lifecycle, objects, recycling


def compact(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` without its empty values, so a record compares equal to its round trip."""
    return {k: v for k, v in data.items() if v not in (None, [], "")}


async def write_status(
    ctx: context.Context,
    fresh: Mapping[str, Any],
    build: Callable[[Mapping[str, Any]], dict[str, Any] | None],
    logger: Any,
) -> tuple[Mapping[str, Any], bool]:
    """Write the status patch ``build(current status)`` with ``metadata.resourceVersion``; on 409
    re-read, rebuild and retry once. Returns (the object as now stored, whether the status holds
    what ``build`` asked: nothing to write counts as written)."""
    for attempt in (1, 2):
        patch = build(fresh.get("status") or {})
        if patch is None:
            return fresh, True
        meta = fresh["metadata"]
        try:
            written = await ctx.kube.patch_modelservice_status(
                meta["namespace"], meta["name"], patch, meta.get("resourceVersion")
            )
            return written or fresh, True
        except kube_.Conflict:
            reread = await ctx.kube.get_modelservice(meta["namespace"], meta["name"])
            if reread is None:
                return fresh, False
            fresh = reread
            if attempt == 2:
                logger.warning("status write conflicted twice; nothing acted on this pass")
    return fresh, False


def condition(conditions: Any, type_: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions or () if c.get("type") == type_), None)


def record_patch(
    records: Mapping[str, Mapping[str, Any] | None],
    new: objects.Condition,
    now: float,
    *,
    section: str | None = None,
    compare_message: bool = False,
) -> Callable[[Mapping[str, Any]], dict[str, Any] | None]:
    """A ``write_status`` builder: ``records`` (under ``status.<section>``, or at the top of
    ``status`` without one) and the condition ``new``; ``None`` (nothing to write) when the stored
    records and the condition's status and reason (and message, with ``compare_message``) already say
    so."""

    def build(current: Mapping[str, Any]) -> dict[str, Any] | None:
        stored = (current.get(section) or {}) if section else current
        old = condition(current.get("conditions"), new.type)
        keys = ("status", "reason", "message") if compare_message else ("status", "reason")
        fresh_condition = old is None or tuple(old.get(k) for k in keys) != tuple(str(getattr(new, k)) for k in keys)
        if not fresh_condition and all(compact(stored.get(k) or {}) == compact(v or {}) for k, v in records.items()):
            return None
        patch: dict[str, Any] = {"conditions": objects.set_condition(current.get("conditions"), new, now)}
        if section:
            patch[section] = dict(records)
        else:
            patch.update(records)
        return patch

    return build


def held_record(data: Mapping[str, Any] | None) -> recycling.HeldRecord | None:
    """``status.recycling.held`` -> the record; anything unreadable counts as nothing held."""
    if not data:
        return None
    try:
        retry = data.get("retryAt")
        return recycling.HeldRecord(
            pod=data["pod"],
            uid=data["uid"],
            reason=recycling.HoldReason(data["reason"]),
            since=durations.parse_time(data["since"]),
            retry_at=None if not retry else durations.parse_time(retry),
        )
    except (KeyError, ValueError, TypeError):
        return None


def held_dict(held: recycling.HeldRecord | None) -> dict[str, Any] | None:
    if held is None:
        return None
    return {
        "pod": held.pod,
        "uid": held.uid,
        "reason": held.reason.value,
        "since": durations.format_time(held.since),
        "retryAt": None if held.retry_at is None else durations.format_time(held.retry_at),
    }


def evicted_record(data: Mapping[str, Any] | None) -> recycling.EvictedRecord | None:
    """``status.recycling.lastEvicted`` -> the record; anything unreadable counts as none."""
    if not data:
        return None
    try:
        return recycling.EvictedRecord(pod=data["pod"], uid=data["uid"], at=durations.parse_time(data["at"]))
    except (KeyError, ValueError, TypeError):
        return None


def evicted_dict(record: recycling.EvictedRecord | None) -> dict[str, Any] | None:
    if record is None:
        return None
    return {"pod": record.pod, "uid": record.uid, "at": durations.format_time(record.at)}


def lifecycle_status(data: Mapping[str, Any] | None) -> lifecycle.LifecycleStatus:
    data = data or {}

    def when(key: str) -> float | None:
        value = data.get(key)
        try:
            return None if not value else durations.parse_time(value)
        except (ValueError, TypeError):
            return None

    return lifecycle.LifecycleStatus(idle_since=when("idleSince"), scaled_to_zero_at=when("scaledToZeroAt"))


def lifecycle_dict(status: lifecycle.LifecycleStatus) -> dict[str, Any]:
    def fmt(value: float | None) -> str | None:
        return None if value is None else durations.format_time(value)

    return {"idleSince": fmt(status.idle_since), "scaledToZeroAt": fmt(status.scaled_to_zero_at)}
