"""``drain-router-dev demo --overload``, shortened: real fake-engine and router processes, the same
arrivals at 3x the engine's capacity straight and through the router's admission control."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from drain_router_dev import demo, overload_demo


@pytest.mark.timeout(90)
async def test_the_router_bounds_the_engine_and_what_it_admits_finishes_in_time() -> None:
    """Straight, the engine holds far more than its batch and streams slow down; through the router
    it never holds more than the bound, refusals say when to retry, and more streams finish within
    the demo's deadline."""
    direct, routed = await overload_demo.compare(seconds=2.0)
    assert direct.engine_peak > 2 * overload_demo.BATCH
    assert routed.engine_peak <= overload_demo.BATCH
    assert direct.refused == 0 and routed.refused > 0
    assert routed.on_time > direct.on_time
    assert routed.stream_p99_ms is not None and direct.stream_p99_ms is not None
    assert routed.stream_p99_ms < direct.stream_p99_ms


def test_the_table_has_a_column_per_run_and_every_row() -> None:
    arms = [
        overload_demo.Arm("no bound", 10, 10, 1, 400.0, 60, 40.0, 50.0, 9000.0, 0, 0),
        overload_demo.Arm("drain-router", 10, 6, 5, 350.0, 8, 400.0, 480.0, 900.0, 12, 4),
    ]
    lines = overload_demo.table(arms, 381.0).splitlines()
    assert lines[0].split() == ["no", "bound", "drain-router"]
    assert [line.split("  ")[0] for line in lines[2:]] == [
        "requests",
        "completed",
        "completed within 2 s",
        "not completed",
        "refused tries (Retry-After)",
        "engine held at once (peak)",
        "tokens/s (capacity 381)",
        "first token p50",
        "first token p99",
        "whole stream p99",
    ]
    assert lines[-1].split()[-2:] == ["900", "ms"]


def test_demo_help_names_the_overload_view() -> None:
    result = CliRunner().invoke(demo.command, ["--help"])
    assert result.exit_code == 0 and "--overload" in result.output
