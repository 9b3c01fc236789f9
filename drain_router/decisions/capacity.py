"""Admission control (``--max-concurrent-requests``): what a request that finds every slot taken
gets, which requests never wait, and how long a refused client is told to wait. Pure: the gate that
carries it out is :mod:`drain_router.admission.gate`.

- :func:`arrival`: a request past N waits in the queue, or is refused at once: ``queue_full`` (429)
  when Q already wait, ``closing`` (503, ``Connection: close``) once the router is closing.
- :func:`exempt`: the router's own endpoints never get here; a ``GET`` (or ``HEAD``) of a path in
  ``--admission-exempt-paths`` or of ``--upstream-health-path`` neither waits nor takes a slot.
- :func:`mean_hold`: how long a slot is held, exponentially weighted over recent releases. With
  every slot taken, slots free at ``rate = N / mean_hold`` per second: the recent completion rate,
  measured only from what held a slot, so an idle spell does not read as a slow model server.
- :func:`retry_after`: ``(queued + 1) / rate`` seconds, clamped to ``[MIN_RETRY_AFTER_SECS,
  MAX_RETRY_AFTER_SECS]``; the minimum before any release (no evidence yet: the next refusal knows
  more) and from draining on (the retry goes to another replica, so this one's queue says nothing
  about it).
- :func:`headers`: ``Retry-After`` (whole seconds, rounded up, at least 1) and ``retry-after-ms``.
"""

from __future__ import annotations

import enum
import math
from typing import NamedTuple

from drain_router.decisions.grpc_status import GrpcStatus

#: The shortest wait a refusal asks for: ``Retry-After`` is whole seconds and 0 would invite a
#: client to retry in the same instant, into the same full queue.
MIN_RETRY_AFTER_SECS = 1.0
#: The longest: past it an estimate is not worth trusting (the rate has moved by then), and the
#: OpenAI SDK honours ``retry-after-ms`` only up to 60 s (it falls back to its own backoff beyond).
MAX_RETRY_AFTER_SECS = 60.0
#: The longest default queue timeout: a minute is already past what an interactive client waits.
DEFAULT_QUEUE_TIMEOUT_CEILING_SECS = 60
#: The weight of the latest release in the mean hold time: about the last ten releases carry most of
#: it, enough to smooth a mix of short and long requests, few enough to follow a model server that slows.
HOLD_WEIGHT = 0.1

#: Methods that may be exempt (health and model listing are reads).
EXEMPT_METHODS = frozenset({b"GET", b"HEAD"})


class Verdict(enum.StrEnum):
    """What happens to a request that found no free slot."""

    WAIT = "wait"
    QUEUE_FULL = "queue_full"
    CLOSING = "closing"


class Reason(enum.StrEnum):
    """Why a request was refused: the ``reason`` of ``admission_rejections_total``."""

    QUEUE_FULL = "queue_full"
    QUEUE_TIMEOUT = "queue_timeout"
    CLOSING = "closing"


REASONS = tuple(Reason)

#: What each refusal answers over HTTP/1.1: status, ``error.type``, message (static text), and
#: whether the connection closes after it.
HTTP_ANSWERS: dict[Reason, tuple[int, str, str, bool]] = {
    Reason.QUEUE_FULL: (429, "queue_full", "the router's admission queue is full; retry after Retry-After", False),
    Reason.QUEUE_TIMEOUT: (
        503,
        "queue_timeout",
        "the request waited --queue-timeout-secs for a slot; retry after Retry-After",
        False,
    ),
    Reason.CLOSING: (
        503,
        "closing",
        "the router is shutting down; the model server never saw this request, retry on another replica",
        True,
    ),
}

#: The gRPC statuses the refusals end a call with: RESOURCE_EXHAUSTED for capacity, UNAVAILABLE
#: (retryable elsewhere) at closing; and their messages.
GRPC_ANSWERS: dict[Reason, tuple[GrpcStatus, str]] = {
    Reason.QUEUE_FULL: (GrpcStatus.RESOURCE_EXHAUSTED, "the router's admission queue is full"),
    Reason.QUEUE_TIMEOUT: (GrpcStatus.RESOURCE_EXHAUSTED, "the call waited --queue-timeout-secs for a slot"),
    Reason.CLOSING: (GrpcStatus.UNAVAILABLE, "the router is shutting down; retry on another replica"),
}


class Answer(NamedTuple):
    """The router's own answer to a request it ends while it waits, in each protocol's words
    (None: requests of that protocol are not answered by it and go on waiting)."""

    http: tuple[int, str, str] | None
    """Status, ``error.type`` and message of the JSON error body."""
    grpc: tuple[GrpcStatus, str] | None
    """``grpc-status`` and ``grpc-message`` of a trailers-only response."""


def default_queue_timeout_secs(shutdown_drain_secs: int) -> int:
    """``--queue-timeout-secs`` when not given: the drain window, at most a minute, so that admission
    control turned on with its defaults never waits past the drain (``QUEUE_TIMEOUT_EXCEEDS_DRAIN``).
    With no drain window (0) there is nothing to keep it within: the minute."""
    if shutdown_drain_secs <= 0:
        return DEFAULT_QUEUE_TIMEOUT_CEILING_SECS
    return min(DEFAULT_QUEUE_TIMEOUT_CEILING_SECS, shutdown_drain_secs)


def arrival(queued: int, queue_size: int, *, closing: bool) -> Verdict:
    """A request found every slot taken (``queued`` already wait, at most ``queue_size``)."""
    if closing:
        return Verdict.CLOSING
    if queued >= queue_size:
        return Verdict.QUEUE_FULL
    return Verdict.WAIT


def exempt(method: bytes, path: bytes, paths: frozenset[bytes]) -> bool:
    """Whether a proxied request neither waits nor takes a slot (``path`` without its query)."""
    return path in paths and method in EXEMPT_METHODS


def exempt_paths(configured: tuple[str, ...], health_path: str | None) -> frozenset[bytes]:
    """The exempt paths: ``--admission-exempt-paths`` and ``--upstream-health-path``."""
    paths = set(configured)
    if health_path is not None:
        paths.add(health_path)
    return frozenset(p.encode("latin-1") for p in paths)


def mean_hold(previous: float | None, held: float) -> float:
    """The mean time a slot is held after one more release that held it ``held`` seconds."""
    if previous is None:
        return held
    return previous + HOLD_WEIGHT * (held - previous)


def retry_after(queued: int, limit: int, hold: float | None, *, leaving: bool) -> float:
    """Seconds until a retry is likely to find room: the time for the ``queued`` requests, and one
    more, to get one of ``limit`` slots, each freed every ``hold`` seconds on average; clamped. A
    gate of no slots (resized to 0: a held queue before its service wakes) frees none: the ceiling."""
    if leaving or hold is None or hold <= 0:
        return MIN_RETRY_AFTER_SECS
    if limit <= 0:
        return MAX_RETRY_AFTER_SECS
    rate = limit / hold
    return min(MAX_RETRY_AFTER_SECS, max(MIN_RETRY_AFTER_SECS, (queued + 1) / rate))


def headers(seconds: float) -> tuple[int, int]:
    """``Retry-After`` (whole seconds, rounded up, at least 1) and ``retry-after-ms``."""
    return max(1, math.ceil(seconds)), max(1000, round(seconds * 1000))
