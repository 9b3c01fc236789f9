"""The ModelService's ``status``: the recycling and lifecycle records' wire format, and how a patch is
written (with ``metadata.resourceVersion``; a 409 re-reads and retries once)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from drain_router.controller import context
from drain_router.controller.kube import client as kube_
from drain_router.decisions import activation, durations, lifecycle, objects, recycling


def compact(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` without its empty values, so a record compares equal to its round trip."""
    return {k: v for k, v in data.items() if v not in (None, [], "")}


async def write_status(
    ctx: context.Context,
    fresh: Mapping[str, Any],
    build: Callable[[Mapping[str, Any]], dict[str, Any] | None],
    logger: Any,
    *,
    retry: bool = True,
) -> tuple[Mapping[str, Any], bool]:
    """Write the status patch ``build(current status)`` with ``metadata.resourceVersion``; on 409
    re-read, rebuild and retry once (``retry=False``: only re-read, for a record decided from what
    was read, which another writer may have changed). Returns (the object as now stored, whether the
    status holds what ``build`` asked: nothing to write counts as written)."""
    for attempt in (1, 2) if retry else (2,):
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
            if attempt == 2 and retry:
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
    also: objects.Condition | None = None,
) -> Callable[[Mapping[str, Any]], dict[str, Any] | None]:
    """A ``write_status`` builder: ``records`` (under ``status.<section>``, or at the top of
    ``status`` without one) and the condition ``new`` (and ``also``, a second one); ``None`` (nothing
    to write) when the stored records and the conditions' status and reason (and message, with
    ``compare_message``) already say so."""
    keys = ("status", "reason", "message") if compare_message else ("status", "reason")
    news = (new,) if also is None else (new, also)

    def changed(current: Mapping[str, Any], cond: objects.Condition) -> bool:
        old = condition(current.get("conditions"), cond.type)
        return old is None or tuple(old.get(k) for k in keys) != tuple(str(getattr(cond, k)) for k in keys)

    def build(current: Mapping[str, Any]) -> dict[str, Any] | None:
        stored = (current.get(section) or {}) if section else current
        fresh_condition = any(changed(current, c) for c in news)
        if not fresh_condition and all(compact(stored.get(k) or {}) == compact(v or {}) for k, v in records.items()):
            return None
        conditions = current.get("conditions")
        for cond in news:
            conditions = objects.set_condition(conditions, cond, now)
        patch: dict[str, Any] = {"conditions": conditions}
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
    return lifecycle.LifecycleStatus(
        idle_since=_time(data, "idleSince"), scaled_to_zero_at=_time(data, "scaledToZeroAt")
    )


def _time(data: Mapping[str, Any], key: str) -> float | None:
    value = data.get(key)
    try:
        return None if not value else durations.parse_time(value)
    except (ValueError, TypeError):
        return None


def _fmt(value: float | None) -> str | None:
    return None if value is None else durations.format_time(value)


def lifecycle_dict(status: lifecycle.LifecycleStatus) -> dict[str, Any]:
    return {"idleSince": _fmt(status.idle_since), "scaledToZeroAt": _fmt(status.scaled_to_zero_at)}


ACTIVATION_KEYS = ("phase", "replicasBeforeZero", "wakeRequestedAt", "awokenAt", "coldStartSeconds")


def activation_status(data: Mapping[str, Any] | None) -> activation.ActivationStatus:
    """The activation part of ``status.lifecycle``; an unreadable field counts as absent (an unknown
    phase as Active)."""
    data = data or {}
    try:
        phase = activation.Phase(data.get("phase") or activation.Phase.ACTIVE)
    except ValueError:
        phase = activation.Phase.ACTIVE
    replicas, cold = data.get("replicasBeforeZero"), data.get("coldStartSeconds")
    return activation.ActivationStatus(
        phase=phase,
        replicas_before_zero=replicas if isinstance(replicas, int) and not isinstance(replicas, bool) else None,
        wake_requested_at=_time(data, "wakeRequestedAt"),
        awoken_at=_time(data, "awokenAt"),
        cold_start_seconds=float(cold) if isinstance(cold, int | float) and not isinstance(cold, bool) else None,
    )


def activation_dict(status: activation.ActivationStatus) -> dict[str, Any]:
    cold = status.cold_start_seconds
    return {
        "phase": status.phase.value,
        "replicasBeforeZero": status.replicas_before_zero,
        "wakeRequestedAt": _fmt(status.wake_requested_at),
        "awokenAt": _fmt(status.awoken_at),
        "coldStartSeconds": None if cold is None else round(cold, 3),
    }
