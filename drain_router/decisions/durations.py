"""Durations (``60s``, ``1h30m``, ``0s``) and RFC 3339 timestamps, as the ModelService writes them.

Purely computational, no side effects. Times are float Unix seconds everywhere inside the controller's
decisions; they become strings only at the edge (status fields, test case files), through here.
"""

from __future__ import annotations

import datetime
import re

#: The CRD validates ``spec.deletion`` durations with this exact pattern (a test pins the two
#: together), so an annotation and a spec field accept the same language. A subset of Go's
#: ``time.ParseDuration``: units ``ms``, ``s``, ``m``, ``h``; a bare ``0`` is allowed, as in Go.
PATTERN = r"^(0|([0-9]+(\.[0-9]+)?(ms|s|m|h))+)$"

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_WHOLE = re.compile(PATTERN)


class DurationError(ValueError):
    """A duration string that does not parse; the message says what is accepted."""


def parse_duration(text: str) -> float:
    """``"1h30m"`` -> ``5400.0`` seconds. ``"0s"`` and ``"0"`` are a real zero, not "unset".

    Raises :class:`DurationError` for anything else (negative, empty, unknown unit, spaces).
    """
    if not isinstance(text, str) or not _WHOLE.match(text):
        raise DurationError(f"{text!r} is not a duration like 60s, 5m, 1h30m or 0s")
    if text == "0":
        return 0.0
    return sum(float(number) * _UNITS[unit] for number, unit in _PART.findall(text))


def format_duration(seconds: float) -> str:
    """The shortest round-trippable spelling: ``3600`` -> ``"1h"``, ``90`` -> ``"1m30s"``, ``0`` -> ``"0s"``."""
    if seconds < 0:
        raise DurationError(f"{seconds!r} is negative")
    millis = round(seconds * 1000)
    if millis == 0:
        return "0s"
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    out = ""
    if hours:
        out += f"{hours}h"
    if minutes:
        out += f"{minutes}m"
    if secs or millis:
        out += f"{secs}.{millis:03d}".rstrip("0").rstrip(".") + "s"
    return out


def format_time(epoch: float) -> str:
    """Unix seconds -> RFC 3339 UTC (``2025-01-01T00:00:00Z``; fractions only when present)."""
    moment = datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC)
    if moment.microsecond:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(epoch: float) -> str:
    """Unix seconds -> a Kubernetes ``MicroTime`` (always six fraction digits, as a Lease's
    ``renewTime`` is written: ``2025-01-01T00:00:00.000000Z``)."""
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> float:
    """RFC 3339 (``Z`` or an offset, optional fraction) -> Unix seconds. Raises ``ValueError``."""
    if text.endswith("Z") or text.endswith("z"):
        text = text[:-1] + "+00:00"
    moment = datetime.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone")
    return moment.timestamp()
