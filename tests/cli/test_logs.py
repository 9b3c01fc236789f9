"""The log formats: JSON lines for machines, unchanged; the console's moments readable by a person."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator

import pytest
import structlog

from drain_router import logs

#: 2026-12-05T14:03:12Z and two seconds before it, as Unix seconds.
DEADLINE = 1796479392.25
T0 = DEADLINE - 2.0


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.reset_defaults()
    root.handlers[:], root.level = handlers, level


def _emit(fmt: str, capsys: pytest.CaptureFixture[str]) -> str:
    logs.configure(format=fmt)
    logs.get().warning("drain.deadline", t0=T0, deadline=DEADLINE, inflight=3)
    logging.getLogger("aiohttp.server").warning("from the standard library")
    return capsys.readouterr().out


def test_console_logs_show_timestamps_and_deadlines_as_iso_utc(capsys: pytest.CaptureFixture[str]) -> None:
    """--log-format console: the drain's t0 and deadline read as ISO 8601 UTC to the second (they
    were raw Unix seconds, deadline=1796479392.25), and every line's timestamp, the standard
    library's records included, is ISO 8601 UTC to the second."""
    out = _emit("console", capsys)
    assert "deadline=2026-12-05T14:03:12Z" in out, out
    assert "t0=2026-12-05T14:03:10Z" in out, out
    assert "inflight=3" in out and "1796479392" not in out, out
    lines = out.strip().splitlines()
    assert len(lines) == 2, out
    for line in lines:
        assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ", line), line


def test_json_logs_keep_unix_seconds_and_the_iso_timestamp(capsys: pytest.CaptureFixture[str]) -> None:
    """--log-format json is what machines read and stays as it was: t0 and deadline as Unix
    seconds, the timestamp ISO 8601 UTC with microseconds."""
    first, second = (json.loads(line) for line in _emit("json", capsys).strip().splitlines())
    assert first["deadline"] == DEADLINE and first["t0"] == T0
    assert first["event"] == "drain.deadline" and first["level"] == "warning"
    for record in (first, second):
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", record["timestamp"]), record
