"""The words of an honest stream end, shared by the router, which writes them, and the front, which
reads them. Pure.

A chat or completions stream ends with the event whose data starts with ``[DONE]`` (the OpenAI
SDK stops reading there). A stream the router could not end so ends instead with an error event of
its own, whose ``error.type`` is one of :class:`CutMark`: the SDK raises on it, and the front takes it
as the signal that the stream was cut and may be continued on another pod.
"""

from __future__ import annotations

import enum
from typing import Any

#: The data an event that ends the stream (for the SDK) starts with.
DONE_DATA = b"[DONE]"


class CutMark(enum.StrEnum):
    """The ``error.type`` of the event the router ends a cut stream with."""

    UPSTREAM_TRUNCATED = "upstream_truncated"
    """The model server ended the stream without its terminal event (it died or shut down)."""
    DRAIN_DEADLINE = "drain_deadline"
    """The router cut the stream at its in-flight deadline, at an event boundary."""


def ends_stream(data: bytes) -> bool:
    """An event with this data ends the stream, as the SDK reads it (its data starts with ``[DONE]``)."""
    return data.startswith(DONE_DATA)


def cut_mark(event: Any) -> CutMark | None:
    """The router's cut mark, when a parsed event's data is the error event the router ends a cut
    stream with (``{"error": {"type": <mark>, ...}}``); None for anything else."""
    if not isinstance(event, dict):
        return None
    error = event.get("error")
    kind = error.get("type") if isinstance(error, dict) else None
    try:
        return CutMark(kind) if isinstance(kind, str) else None
    except ValueError:
        return None
