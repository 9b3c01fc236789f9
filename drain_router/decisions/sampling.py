"""Whether a request's span is sampled, decided before the OpenTelemetry SDK is asked, for the
samplers ``OTEL_TRACES_SAMPLER`` names (``always_on``, ``always_off``, ``traceidratio`` and their
``parentbased_`` forms, the default being ``parentbased_always_on``). Pure.

A request sampled out records nothing, yet the SDK costs about 6 µs to start its non-recording span
and to parse the client's ``traceparent``. So :func:`decide` answers first, exactly as those
samplers do: a ``parentbased_`` sampler follows a valid remote parent's sampled flag, a trace-id
ratio compares the trace id's low 64 bits with its bound, and a root trace id is drawn here (the
SDK then starts a sampled span with that same id, so the two agree). Only a plain ``traceparent`` of
version 00 with non-zero ids and no ``tracestate`` takes this path; anything else (several headers,
another version, a ``tracestate`` to validate, a sampler of another kind) goes to the SDK as before.
"""

from __future__ import annotations

import dataclasses
import re
from typing import NamedTuple

#: A trace id's low 64 bits, what a trace-id ratio sampler compares with its bound.
TRACE_ID_LOW = (1 << 64) - 1
#: A bound no trace id reaches: always sampled.
ALWAYS = 1 << 64
#: W3C trace flags: sampled, and (Level 2) a random trace id.
SAMPLED, RANDOM = 0x01, 0x02

_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """The configured sampler, as :func:`decide` applies it."""

    parent_based: bool
    """A valid remote parent's sampled flag decides (the ``parentbased_`` samplers, with their
    default delegates); otherwise the root rule applies to every span."""
    bound: int
    """The root rule: sampled when the trace id's low 64 bits are below it (0: never;
    :data:`ALWAYS`: always)."""


class Verdict(NamedTuple):
    """A decision (a tuple: made for every traced request, so cheap to make)."""

    sampled: bool
    trace_id: int
    """The parent's trace id, or the one drawn for a root span."""
    random: bool = True
    """The trace id is random (W3C's flag 0x02): a drawn one is; a parent's says so in its flags."""


def parent(traceparent: list[str]) -> tuple[int, int] | None:
    """A single plain version-00 ``traceparent`` with non-zero ids: its trace id and flags; else
    None (the SDK's propagator decides what it is)."""
    if len(traceparent) != 1:
        return None
    found = _TRACEPARENT.fullmatch(traceparent[0])
    if found is None:
        return None
    trace_id, span_id, flags = (int(group, 16) for group in found.groups())
    if not trace_id or not span_id:
        return None
    return trace_id, flags


def decide(plan: Plan, traceparent: list[str], tracestate: list[str], draw: int) -> tuple[bool, int, bool] | None:
    """The sampling decision for a span whose client sent ``traceparent``/``tracestate`` (``draw``: a
    fresh random trace id, used when it has no parent); None when only the SDK can tell."""
    if tracestate:
        return None
    if not traceparent:
        return (draw & TRACE_ID_LOW < plan.bound, draw, True)  # a Verdict, built as a plain tuple
    found = parent(traceparent)
    if found is None:
        return None
    trace_id, flags = found
    sampled = bool(flags & SAMPLED) if plan.parent_based else trace_id & TRACE_ID_LOW < plan.bound
    return (sampled, trace_id, bool(flags & RANDOM))


def upstream_traceparent(verdict: tuple[bool, int, bool], span_id: int) -> bytes:
    """The ``traceparent`` a sampled-out span passes upstream (the SDK writes the same for its
    non-recording span): the trace, a span id of its own, not sampled, random as the trace is."""
    return b"00-%032x-%016x-%02x" % (verdict[1], span_id, RANDOM if verdict[2] else 0)
