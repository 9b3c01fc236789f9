"""The activator's own decisions: which ModelService a held request is for, and when and how it asks
for a wake. Purely computational, no side effects (the controller's side is :mod:`.activation`).

- The route the controller points at the activator adds a request header naming the ModelService,
  ``x-drain-router-service: <namespace>/<name>`` (:func:`service_key`): a namespace is a DNS-1123
  label, a name a DNS-1123 subdomain; anything else names no service (the request is refused, never
  held, so a client cannot grow the activator's table of queues with made-up names past what the
  routes name).
- A wake is asked for by writing ``status.lifecycle.wakeRequestedAt`` on the ModelService (the
  controller's watch already delivers every write to it, the field survives a controller restart or a
  leader change, and the activator needs no address of the leader): only while no wake is pending
  (:func:`should_request_wake`), as a merge patch of the status subresource carrying the
  ``resourceVersion`` it read (:func:`wake_patch`), so two activator replicas, or a controller write in
  between, never overwrite each other: a 409 means read again and decide again.
"""

from __future__ import annotations

import re
from typing import Any

from drain_router.decisions import durations
from drain_router.decisions.activation import ActivationStatus

SERVICE_HEADER = b"x-drain-router-service"
"""The request header the controller's route adds (lower case, as the parser hands header names)."""

_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_NAMESPACE = re.compile(_LABEL)
_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
MAX_NAME_LENGTH = 253


def service_key(value: bytes) -> tuple[str, str] | None:
    """``(namespace, name)`` from the header's value, or ``None`` when it names no valid service."""
    try:
        text = value.decode("ascii").strip()
    except UnicodeDecodeError:
        return None
    namespace, slash, name = text.partition("/")
    if not slash or len(name) > MAX_NAME_LENGTH:
        return None
    if _NAMESPACE.fullmatch(namespace) is None or _NAME.fullmatch(name) is None:
        return None
    return namespace, name


def should_request_wake(status: ActivationStatus) -> bool:
    """A held request asks for a wake unless one is already pending (asked for and not answered)."""
    return not status.wake_pending


def wake_patch(now: float, resource_version: str) -> dict[str, Any]:
    """The merge patch of the ModelService's status subresource that asks for a wake, with the
    ``resourceVersion`` read as its precondition."""
    return {
        "metadata": {"resourceVersion": resource_version},
        "status": {"lifecycle": {"wakeRequestedAt": durations.format_time(now)}},
    }
