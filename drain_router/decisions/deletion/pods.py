"""Which of the service's pods still hold the finalizer, and the status message about them.

Purely computational, no side effects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from drain_router.decisions import durations
from drain_router.decisions.objects import Pod

POD_GONE_AFTER_GRACE_SECS = 300.0
"""A terminating pod on a Ready node counts until its grace plus this (5 m), then is treated as gone."""


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
            "deletionTimestamp": (
                None if self.deletion_timestamp is None else durations.format_time(self.deletion_timestamp)
            ),
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


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _node_state(node: str | None, nodes: Mapping[str, bool]) -> str | None:
    if node is None:
        return None
    if nodes.get(node):
        return "Ready"
    return "NotReady" if node in nodes else "missing"


def count_pods(pods: Sequence[Pod], nodes: Mapping[str, bool], now: float) -> PodCount:
    """Which of the service's pods still count, and the status message.

    Succeeded/Failed pods never count. A pod within its grace always counts. Past its grace it is
    gone if its node is NotReady or missing (no kubelet will ever confirm it), otherwise it counts
    until grace + 5 m. A pod whose node is NotReady or missing, or that is past its grace, is stuck.
    """
    remaining: list[PodEntry] = []
    for pod in sorted(pods, key=lambda p: p.name):
        if not pod.active:
            continue
        node_bad = _node_state(pod.node, nodes) in ("NotReady", "missing")
        end = pod.deletion_timestamp
        past_grace = end is not None and now >= end
        if end is not None and past_grace and (node_bad or now >= end + POD_GONE_AFTER_GRACE_SECS):
            continue
        why = _node_state(pod.node, nodes) if node_bad else ("past-grace" if past_grace else None)
        remaining.append(
            PodEntry(
                name=pod.name,
                phase=pod.phase,
                node=pod.node,
                deletion_timestamp=pod.deletion_timestamp,
                grace=pod.grace,
                stuck=why is not None,
                stuck_why=why,
            )
        )
    return PodCount(remaining=tuple(remaining), message=pods_message(remaining))


def pods_message(remaining: Sequence[PodEntry]) -> str:
    """``waiting for 3 pods (2 stuck on NotReady node gpu-7)``; ``no pods left`` when empty."""
    if not remaining:
        return "no pods left"
    parts = []
    for why in ("NotReady", "missing"):
        stuck = [p for p in remaining if p.stuck_why == why]
        if stuck:
            names = sorted({p.node for p in stuck if p.node})
            parts.append(f"{len(stuck)} stuck on {why} {'node' if len(names) == 1 else 'nodes'} {', '.join(names)}")
    late = [p for p in remaining if p.stuck_why == "past-grace"]
    if late:
        parts.append(f"{len(late)} past {'its' if len(late) == 1 else 'their'} grace")
    suffix = f" ({'; '.join(parts)})" if parts else ""
    return f"waiting for {plural(len(remaining), 'pod')}{suffix}"
