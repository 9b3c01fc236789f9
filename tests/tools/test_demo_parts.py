"""The demo's pure parts: the comparison table, readiness spans, log parsing, the PNG fallback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from router.tools import load, streams, timeline
from router.tools import runs as runs_mod


def _record(t: float, duration: float, outcome: streams.Outcome, status: int | None = 200) -> load.Record:
    return load.Record(started=t, finished=t + duration, outcome=outcome, status=status, error=None, chunks_seen=0)


def _runs() -> list[runs_mod.RunResult]:
    on = runs_mod.RunResult(
        "drain on",
        2,
        ["replica-0"],
        duration=10,
        drain_durations=[2.2, 2.4],
        records=[_record(i, 0.5, streams.Outcome.OK) for i in range(10)],
    )
    off = runs_mod.RunResult(
        "drain off",
        0,
        ["replica-0"],
        duration=8,
        drain_durations=[0.4],
        records=[_record(i, 0.5, streams.Outcome.OK) for i in range(8)]
        + [_record(3, 0.01, streams.Outcome.HTTP_ERROR, 502)] * 2
        + [_record(3, 0.2, streams.Outcome.CUT)],
    )
    off.balancer_errors.update({"ClientConnectorError": 2})
    return [on, off]


def test_comparison_table() -> None:
    table = runs_mod.comparison_table(_runs())
    lines = table.splitlines()
    assert lines[0].split() == ["drain", "on", "(2", "s)", "drain", "off", "(0", "s)"]
    rows = {line.split("  ")[0]: line.split() for line in lines[2:] if line}
    assert rows["requests"][-2:] == ["10", "11"]
    assert rows["lost"][-2:] == ["0", "3"]
    assert rows["p50 completion"][-4:] == ["0.50", "s", "0.50", "s"]
    assert "2.30 s" in table and "0.40 s" in table
    assert lines[-1] == "lost in drain off: 502 x2, cut x1 (balancer: ClientConnectorError x2)"


def test_percentile_nearest_rank() -> None:
    assert load.percentile([], 0.5) is None
    assert load.percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert load.percentile([float(i) for i in range(1, 101)], 0.99) == 99.0
    assert load.percentile([1.0], 0.99) == 1.0


def test_rotation_spans() -> None:
    changes = [(1.0, "a", True), (1.0, "b", True), (3.0, "a", False), (5.0, "a", True)]
    assert timeline.rotation_spans(changes, "a", 9.0) == [timeline.Span(1.0, 3.0), timeline.Span(5.0, 9.0)]
    assert timeline.rotation_spans(changes, "b", 9.0) == [timeline.Span(1.0, 9.0)]
    assert timeline.rotation_spans(changes, "c", 9.0) == []


def test_closing_times_from_router_log(tmp_path: Path) -> None:
    log = tmp_path / "r.log"
    log.write_text(
        "--- start x\nnot json\n"
        '{"event": "drain.start", "timestamp": "2026-01-01T00:00:01Z"}\n'
        '{"event": "drain.closing", "timestamp": "2026-01-01T00:00:03.5Z"}\n'
    )
    start = 1767225600.0  # 2026-01-01T00:00:00Z
    assert runs_mod.closing_times(log, start) == [3.5]
    assert runs_mod.closing_times(tmp_path / "missing.log", start) == []


def test_png_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    runs = _runs()
    runs[0].samples = [runs_mod.Sample(0.5 * i, "replica-0", "serving", i % 5) for i in range(20)]
    runs[0].marks = [runs_mod.Mark(2.0, "replica-0", "sigterm"), runs_mod.Mark(4.0, "replica-0", "closing")]
    runs[0].rotation = [(0.2, "replica-0", True), (2.5, "replica-0", False)]
    path = timeline.plot(runs, tmp_path / "t.png")
    assert path.read_bytes().startswith(b"\x89PNG")


def test_png_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(timeline.PlotUnavailable):
        timeline.plot(_runs(), tmp_path / "t.png")
    assert not (tmp_path / "t.png").exists()
