"""Structured logging, configured once from the CLI.

Events have stable dotted names (``drain.start``, ``startup.advisory``) and carry data in fields, never
interpolated into the message. JSON lines on stdout by default; a console renderer for terminals.
Records from the standard library (aiohttp, asyncio) go through the same renderer.

Moments in time are for the reader of each format: JSON keeps ``timestamp`` as ISO 8601 with
microseconds and the moments of :data:`EPOCH_FIELDS` (``t0``, ``deadline``) as Unix seconds, as
machines read them; the console shows all of them as ISO 8601 UTC (``deadline=2026-12-05T14:03:12Z``).
"""

from __future__ import annotations

import datetime
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

import structlog

#: Fields that hold a moment as Unix seconds (the drain's start and its in-flight deadline).
EPOCH_FIELDS = ("t0", "deadline")


def iso_utc(epoch: float) -> str:
    """A moment as ISO 8601 UTC to the second: ``2026-12-05T14:03:12Z``."""
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def readable_moments(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """The console's processor: each field of :data:`EPOCH_FIELDS` that holds Unix seconds as ISO 8601 UTC."""
    for key in EPOCH_FIELDS:
        value = event_dict.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            event_dict[key] = iso_utc(value)
    return event_dict


def _shared(format: str) -> list[Any]:
    """The processors of every record, structlog's and the standard library's, before the renderer."""
    common: list[Any] = [structlog.contextvars.merge_contextvars, structlog.processors.add_log_level]
    if format == "json":
        return [*common, structlog.processors.TimeStamper(fmt="iso", utc=True)]
    return [*common, structlog.processors.TimeStamper(fmt="%Y-%m-%dT%H:%M:%SZ", utc=True), readable_moments]


def configure(
    *, format: str = "json", level: str = "info", stdlib_level: str | None = None, foreign: Sequence[Any] = ()
) -> None:
    """structlog and the standard library's logging, both through one renderer on stdout.

    ``stdlib_level``: the least level of records from the standard library's loggers; by default
    ``level`` but never below warning (aiohttp's and asyncio's chatter). The controller lowers it:
    kopf logs through the standard library. ``foreign``: processors for those records, after the
    shared ones (the record is ``event_dict["_record"]``)."""
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if format == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stdout.isatty())
    )
    numeric = logging.getLevelNamesMapping()[level.upper()]
    structlog.configure(
        processors=[*_shared(format), structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.WriteLoggerFactory(file=sys.stdout),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[*_shared(format), structlog.stdlib.add_logger_name, *foreign],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    if stdlib_level is None:
        root.setLevel(max(numeric, logging.WARNING))
    else:
        root.setLevel(logging.getLevelNamesMapping()[stdlib_level.upper()])


def get(name: str = "drain_router") -> Any:
    return structlog.get_logger(name)


class RateLimited:
    """One log event at most once per ``interval`` seconds, with the number of occurrences that were
    not logged since the last line (``suppressed``), so a client cannot fill the log with its mistakes."""

    def __init__(
        self, logger: Any, event: str, *, level: str = "info", interval: float = 10.0, clock: Any = time.monotonic
    ) -> None:
        self._log = getattr(logger, level)
        self._event = event
        self._interval = interval
        self._clock = clock
        self._next = 0.0
        self.suppressed = 0

    def emit(self, **fields: Any) -> bool:
        """Log now (returns True) or count the occurrence as suppressed."""
        now = self._clock()
        if now < self._next:
            self.suppressed += 1
            return False
        self._next = now + self._interval
        self._log(self._event, suppressed=self.suppressed, **fields)
        self.suppressed = 0
        return True
