"""The demo's pure parts: the comparison table, readiness spans, log parsing, the PNG fallback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from drain_router_dev import grpc_load, load, pods, realtime, recipes, sessions, streams, timeline
from drain_router_dev import runs as runs_mod


def _record(t: float, duration: float, outcome: streams.Outcome, status: int | None = 200) -> load.Record:
    return load.Record(started=t, finished=t + duration, outcome=outcome, status=status, error=None, chunks_seen=0)


def _runs() -> list[runs_mod.RunResult]:
    on = runs_mod.RunResult(
        "drain-router",
        "--shutdown-drain-secs 2",
        ["replica-0"],
        duration=10,
        drain_durations=[2.2, 2.4],
        records=[_record(i, 0.5, streams.Outcome.OK) for i in range(10)],
    )
    off = runs_mod.RunResult(
        "no drain",
        "--shutdown-drain-secs 0",
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
    assert lines[0].split() == ["drain-router", "no", "drain"]
    rows = {line.split("  ")[0]: line.split() for line in lines[2:] if line}
    assert rows["requests"][-2:] == ["10", "11"]
    assert rows["lost"][-2:] == ["0", "3"]
    assert rows["p50 completion"][-4:] == ["0.50", "s", "0.50", "s"]
    assert "2.30 s" in table and "0.40 s" in table
    assert "drain-router: --shutdown-drain-secs 2" in lines and "no drain: --shutdown-drain-secs 0" in lines
    assert lines[-1] == "lost in no drain: 502 x2, cut x1 (balancer: ClientConnectorError x2)"


def _session(end: sessions.End, code: int | None) -> realtime.Record:
    result = sessions.SessionResult(handshake_status=101, close_code=code)
    return realtime.Record(worker=0, started=0, finished=1, end=end, result=result, server=1, responses=1)


def test_comparison_table_realtime_rows_only_with_sessions() -> None:
    """No realtime rows while no run held a session (the router answers the upgrade with 501);
    with sessions: how many, how many ended 1001, how many were cut."""
    runs = _runs()
    assert "realtime sessions" not in runs_mod.comparison_table(runs)
    runs[0].sessions = [_session(sessions.End.GOING_AWAY, 1001)] * 3 + [_session(sessions.End.NORMAL, 1000)]
    runs[1].sessions = [_session(sessions.End.ABNORMAL, 1006)] * 2 + [_session(sessions.End.GOING_AWAY, 1001)]
    rows = {line.split("  ")[0].strip(): line.split() for line in runs_mod.comparison_table(runs).splitlines()[2:]}
    assert rows["realtime sessions"][-2:] == ["4", "3"]
    assert rows["sessions ended 1001"][-2:] == ["3", "1"]
    assert rows["sessions cut"][-2:] == ["0", "2"]


def _call(outcome: grpc_load.Outcome, code: str = "OK") -> grpc_load.Record:
    return grpc_load.Record(
        request_id="c", started=0, finished=1, outcome=outcome, code=code, details=None, tokens_seen=0
    )


def test_grpc_rows_and_summary_only_with_grpc_calls() -> None:
    """No gRPC rows or words while no run made a call; with calls: how many, how many lost (by
    status in the summary), and a line where drain-router lost fewer."""
    runs = _runs()
    assert "gRPC" not in runs_mod.comparison_table(runs) + runs_mod.summary(runs)
    runs[0].grpc = [_call(grpc_load.Outcome.OK)] * 5
    runs[1].grpc = [_call(grpc_load.Outcome.OK)] * 3 + [_call(grpc_load.Outcome.FAILED, "UNAVAILABLE")] * 2
    rows = {line.split("  ")[0].strip(): line.split() for line in runs_mod.comparison_table(runs).splitlines()[2:]}
    assert rows["gRPC calls"][-2:] == ["5", "5"]
    assert rows["gRPC calls lost"][-2:] == ["0", "2"]
    text = runs_mod.summary(runs)
    assert "drain-router: 0 of 10 requests lost; 0 of 5 gRPC calls lost." in text
    assert "; 2 of 5 gRPC calls lost (UNAVAILABLE x2)." in text
    assert "drain-router lost fewer gRPC calls than no drain: 0 against 2." in text


def test_router_and_engine_pods_take_grpc_with_a_grpc_url(tmp_path: Path) -> None:
    """With the model's gRPC endpoint, each router relays gRPC to it and each engine serves its own;
    without, no pod has a gRPC target."""
    grpc_url = "http://127.0.0.1:2"
    compared = recipes.compared(
        "http://127.0.0.1:1", replicas=1, drain_secs=2, chunks=3, interval_ms=1, grpc_url=grpc_url
    )
    made = [r.pods(tmp_path / str(i))[0] for i, r in enumerate(compared)]
    assert all(p.grpc_target is not None for p in made)
    assert "--grpc-upstream" in made[0].process.argv and grpc_url in made[0].process.argv
    assert "--grpc-port" in made[1].process.argv
    plain = recipes.compared("http://127.0.0.1:1", replicas=1, drain_secs=2, chunks=3, interval_ms=1)
    assert [r.pods(tmp_path / f"plain{i}")[0].grpc_target for i, r in enumerate(plain)] == [None] * 4


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


def test_png_says_each_runs_own_losses_one_dot_each_on_one_x_range() -> None:
    """Each run's panel gives its own lost count (the old legend said "lost (0)" for a run that lost
    47), shows one dot per lost request, and every panel spans the same seconds."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    on, off = _runs()
    off.records += [_record(3.01, 0.0, streams.Outcome.HTTP_ERROR, 502)] * 4  # 7 lost, 5 at one moment
    fig = timeline.figure([on, off])
    try:
        axes = fig.axes
        assert len(axes) == 6
        assert axes[0].get_title(loc="right") == "0 of 10 lost"
        assert axes[3].get_title(loc="right") == "7 of 15 lost"
        assert len(axes[1].collections) == 0
        (dots,) = axes[4].collections
        assert len(dots.get_offsets()) == 7
        assert len({tuple(xy) for xy in dots.get_offsets()}) == 7, "two lost requests drawn as one dot"
        assert {ax.get_xlim() for ax in axes} == {(0.0, 10.0)}
        assert axes[2].get_ylabel().startswith("in balancer rotation")
    finally:
        plt.close(fig)


def test_png_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(timeline.PlotUnavailable):
        timeline.plot(_runs(), tmp_path / "t.png")
    assert not (tmp_path / "t.png").exists()


def test_summary_says_where_another_recipe_did_as_well_or_better() -> None:
    """drain-router loses nothing but holds its pods longer: the summary says both, and no more."""
    on, off = _runs()
    text = runs_mod.summary([on, off])
    assert (
        "drain-router: 0 of 10 requests lost." in text and "no drain: 3 of 11 requests lost (502 x2, cut x1)." in text
    )
    assert "As good as drain-router or better in this run:" in text
    assert (
        "  SIGTERM to exit (drain-router 2.30 s: it holds each pod for its whole drain window): no drain 0.40 s."
        in text
    )
    assert "lost no more" not in text
    same = runs_mod.RunResult("sleep", "x", ["r"], drain_durations=[9.0], records=list(on.records))
    text = runs_mod.summary([on, same])
    assert (
        "  lost no more requests (0): sleep." in text
        and "  p99 completion (drain-router 0.50 s): sleep 0.50 s." in text
    )
    assert "SIGTERM to exit" not in text


def test_summary_says_what_each_run_lost_and_where_drain_router_lost_fewer() -> None:
    """Each run's losses and their kinds; a line for each run that lost more requests, or cut more
    realtime sessions, than drain-router, with both figures."""
    on, off = _runs()
    on.sessions = [_session(sessions.End.GOING_AWAY, 1001)] * 2
    off.sessions = [_session(sessions.End.GOING_AWAY, 1001), _session(sessions.End.ABNORMAL, None)]
    text = runs_mod.summary([on, off])
    assert "drain-router: 0 of 10 requests lost; 0 of 2 realtime sessions cut." in text
    assert "no drain: 3 of 11 requests lost (502 x2, cut x1); 1 of 2 realtime sessions cut." in text
    assert "drain-router lost fewer requests than no drain: 0 against 3." in text
    assert "drain-router cut fewer realtime sessions than no drain: 0 against 1." in text
    same = runs_mod.RunResult("sleep", "x", ["r"], drain_durations=[9.0], records=list(on.records))
    assert "fewer" not in runs_mod.summary([on, same])


def test_loss_dots_one_per_request_stacked_in_time_bins() -> None:
    dots = timeline.loss_dots([1.0, 1.01, 1.02, 3.0, 1.2], bin_secs=0.05)
    assert len(dots) == 5
    assert sorted(dots) == [(1.0, 1), (1.01, 2), (1.02, 3), (1.2, 1), (3.0, 1)]


def test_sleep_recipe_scaled_as_kserve_sizes_it() -> None:
    """KServe: sleep 15 s, grace 60 s, --shutdown-timeout 45 s. Scaled for a 2 s drain (2/30)."""
    assert recipes.scaled_sleep_recipe(30) == pods.SleepRecipe(prestop_sleep_secs=15, shutdown_timeout_secs=45)
    scaled = recipes.scaled_sleep_recipe(2)
    assert scaled.prestop_sleep_secs == pytest.approx(1.0) and scaled.shutdown_timeout_secs == pytest.approx(3.0)


def test_compared_runs_in_order(tmp_path: Path) -> None:
    """Three recipes, the sleep recipe twice: behind a balancer told of the deletion, and behind
    one that probes only the engine (whose readiness never says the pod is going)."""
    compared = recipes.compared("http://127.0.0.1:1", replicas=2, drain_secs=2, chunks=3, interval_ms=1)
    labels = [r.label for r in compared]
    assert labels == ["drain-router", "sleep + engine drain", "sleep (probe-only LB)", "no drain"]
    assert compared[1].setting == compared[2].setting == "preStop sleep 1 s, --shutdown-timeout 3 s"
    sees = [[p.readiness.sees_deletion for p in r.pods(tmp_path / str(i))] for i, r in enumerate(compared[1:3])]  # type: ignore[attr-defined]
    assert sees == [[True, True], [False, False]]


README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_demo_table() -> tuple[list[str], list[str]]:
    """The README's table from ``make demo`` (the first ``text`` block after the stand-in's
    heading): its column labels and its row labels."""
    text = README.read_text().split("**With the stand-in**, from `make demo`", 1)[1]
    block = text.split("```text\n", 1)[1].split("```", 1)[0]
    header, _rule, *rows = block.strip("\n").splitlines()
    columns = [c.strip() for c in header.split("  ") if c.strip()]
    return columns, [row.split("  ")[0].strip() for row in rows]


def test_the_readmes_demo_table_has_every_row_and_column_the_demo_prints() -> None:
    """The README shows the demo's table: each run the demo compares is a column and each row the
    demo prints for a run with streams, realtime sessions and gRPC calls (its defaults) is a row, in
    the demo's order. The README's table lacked the p50, realtime and gRPC rows the demo printed."""
    full = []
    for label in recipes.LABELS:
        run = runs_mod.RunResult(label, "-", ["pod-0"], drain_durations=[1.0])
        run.records = [_record(0, 0.5, streams.Outcome.OK)]
        run.sessions = [_session(sessions.End.GOING_AWAY, 1001)]
        run.grpc = [_call(grpc_load.Outcome.OK)]
        full.append(run)
    printed = runs_mod.comparison_table(full).split("\n\n", 1)[0].splitlines()
    printed_rows = [line.split("  ")[0].strip() for line in printed[2:]]
    columns, rows = _readme_demo_table()
    assert columns == list(recipes.LABELS)
    assert rows == printed_rows


def test_the_runs_compared_are_the_labelled_ones_and_the_help_counts_them(tmp_path: Path) -> None:
    """compared() returns one run per label of recipes.LABELS, in order, and ``demo --help`` says how
    many (it said three while the demo printed four)."""
    from click.testing import CliRunner

    from drain_router_dev import demo

    made = recipes.compared("http://127.0.0.1:1", replicas=1, drain_secs=2, chunks=3, interval_ms=1)
    assert [r.label for r in made] == list(recipes.LABELS)
    words = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}
    result = CliRunner().invoke(demo.command, ["--help"])
    assert result.exit_code == 0, result.output
    assert f"under {words[len(made)]} shutdown recipes" in " ".join(result.output.split())


def test_with_sessions_no_drain_closes_none_and_is_killed_at_the_grace(tmp_path: Path) -> None:
    """With realtime sessions the routers are told the pod's grace (sessions get 1001 by its
    deadline), but no drain's: it closes no session (--websocket-close-at deadline, no deadline) and
    the demo SIGKILLs it at the grace, so its open sessions end 1006 as without a drain (every run's
    sessions ended 1001, no drain's included, and "sessions cut" was 0 in every column)."""
    made = recipes.compared(
        "http://127.0.0.1:1", replicas=1, drain_secs=2, chunks=3, interval_ms=1, termination_grace_secs=6
    )
    by_label = {r.label: r.pods(tmp_path / str(i))[0] for i, r in enumerate(made)}
    router, no_drain = by_label["drain-router"], by_label["no drain"]
    assert isinstance(router, pods.RouterPod) and isinstance(no_drain, pods.RouterPod)
    assert router.kill_after_secs is None
    assert "--termination-grace-secs" in router.process.argv and "--websocket-close-at" not in router.process.argv
    assert no_drain.kill_after_secs == 6
    assert "--termination-grace-secs" not in no_drain.process.argv
    argv = no_drain.process.argv
    assert argv[argv.index("--websocket-close-at") + 1] == "deadline"
    without = recipes.compared("http://127.0.0.1:1", replicas=1, drain_secs=2, chunks=3, interval_ms=1)
    plain = without[-1].pods(tmp_path / "plain")[0]
    assert isinstance(plain, pods.RouterPod) and plain.kill_after_secs is None
    assert "--websocket-close-at" not in plain.process.argv


def test_the_live_view_says_why_a_pod_exited(tmp_path: Path) -> None:
    """ "pod-0 exited 1" said nothing: each exit line carries what the code means, a router's by the
    codes it documents (0 drained, 1 the in-flight deadline ended what was open, 2 startup failed), a
    SIGKILL at the grace as such, an engine's 0 as drained."""
    made = recipes.compared(
        "http://127.0.0.1:1", replicas=1, drain_secs=2, chunks=3, interval_ms=1, termination_grace_secs=6
    )
    by_label = {r.label: r.pods(tmp_path / str(i))[0] for i, r in enumerate(made)}
    router = by_label["drain-router"]
    assert router.exit_meaning(0).startswith("drained")
    assert "in-flight deadline" in router.exit_meaning(1) and "1001" in router.exit_meaning(1)
    assert router.exit_meaning(2) == "startup failed"
    assert router.exit_meaning(-9).startswith("SIGKILL: the grace ran out")
    engines = [p for p in by_label.values() if not isinstance(p, pods.RouterPod)]
    assert engines and all(e.exit_meaning(0) == "drained" for e in engines)
    assert engines[0].exit_meaning(-15) == "SIGTERM"
