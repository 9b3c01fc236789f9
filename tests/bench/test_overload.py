"""The overload measurement: its arithmetic (capacity, arrivals, the retry wait, one cell's figures),
its goals and table from records, and a seconds-long run through ``python -m bench``."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import overload_report, report
from bench.overload_stats import summarize
from drain_router_dev.overload import Attempt, Request, arrivals, capacity_tokens_per_s, retry_wait

ROOT = Path(__file__).resolve().parents[2]


def test_capacity_is_b_streams_turned_around_per_slot() -> None:
    # 8 slots, each a stream of 20 tokens every 19 intervals of 20 ms: 421 tokens/s (about 8 * 1000 / 20)
    assert capacity_tokens_per_s(8, 20, 20) == pytest.approx(8 * 20 * 1000 / 380)
    assert capacity_tokens_per_s(8, 20, 20, prefill_ms=40) == pytest.approx(8 * 20 * 1000 / 420)
    assert capacity_tokens_per_s(8, 20, 1001) == pytest.approx(8 * 1000 / 20, rel=0.002)


def test_arrivals_are_seeded_poisson_at_the_rate() -> None:
    first, again = arrivals(50.0, 200.0, seed=1), arrivals(50.0, 200.0, seed=1)
    assert first == again and first != arrivals(50.0, 200.0, seed=2)
    assert all(0 <= a < b < 200.0 for a, b in itertools.pairwise(first))
    assert len(first) == pytest.approx(50 * 200, rel=0.03)


@pytest.mark.parametrize(
    ("policy", "headers", "wait"),
    [
        ("honour", {"Retry-After": "2", "retry-after-ms": "1700"}, 1.7),
        ("honour", {"retry-after": "3"}, 3.0),
        ("honour", {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, 1.0),  # a date: not read, the fallback
        ("honour", {"x-envoy-overloaded": "true"}, 1.0),  # nothing said: the fallback
        ("honour", {"retry-after-ms": "900000"}, 60.0),  # capped as the OpenAI SDK caps it
        ("fixed", {"Retry-After": "5", "retry-after-ms": "4500"}, 1.0),
    ],
)
def test_a_refused_client_waits_as_its_policy_says(policy: str, headers: dict[str, str], wait: float) -> None:
    assert retry_wait(policy, headers) == wait


def _req(arrival: float, statuses: list[int], *, first: float | None = None, done: float | None = None) -> Request:
    req = Request(
        arrival=arrival, attempts=[Attempt(arrival + i, s, 1.0 if s != 200 else None) for i, s in enumerate(statuses)]
    )
    req.first_token, req.done = first, done
    if done is not None:
        req.outcome, req.tokens = "completed", 10
    elif statuses and statuses[-1] != 200:
        req.outcome = "gave_up"
    return req


def test_a_cells_figures() -> None:
    """Window [10, 20): goodput counts whole streams that ended in it (whenever they arrived); the
    other figures count the requests that arrived in it; TTFT of admitted requests counts from the
    admitted try, the other from the first."""
    requests = [
        _req(5.0, [200], first=5.1, done=10.5),  # arrived before the window, ended in it: goodput only
        _req(12.0, [200], first=12.05, done=13.0),
        _req(13.0, [429, 200], first=14.2, done=15.0),  # admitted at its first retry (sent at 14.0)
        _req(14.0, [503, 429, 200], first=16.1, done=17.0),  # refused at its first retry
        _req(15.0, [429, 429, 429]),  # gave up
        _req(19.5, [200], first=19.6, done=21.0),  # ended after the window: not goodput
        _req(19.9, [429]),  # refused, its retry never sent before the end: not "retried"
    ]
    requests[-1].outcome = "unresolved"
    got = summarize(requests, 10.0, 20.0, capacity=5.0)
    assert got["goodput_tokens_per_s"] == pytest.approx(4 * 10 / 10)
    assert got["goodput_x_capacity"] == pytest.approx(0.8)
    assert got["requests"] == 6 and got["attempts"] == 11
    assert got["ttft_admitted_p50_ms"] == pytest.approx(100) and got["ttft_admitted_p99_ms"] == pytest.approx(200)
    assert got["ttft_first_try_p99_ms"] == pytest.approx(2100)
    assert (got["rejected_429"], got["rejected_503"]) == (6, 1)
    assert got["rejected_share_of_attempts"] == pytest.approx(7 / 11)
    assert (got["retried_requests"], got["admitted_first_retry"]) == (3, 1)
    assert got["admitted_first_retry_share"] == pytest.approx(1 / 3)
    assert (got["outcome_completed"], got["outcome_gave_up"], got["outcome_unresolved"]) == (4, 1, 1)
    empty = summarize([], 0.0, 1.0, capacity=5.0)
    assert empty["goodput_tokens_per_s"] == 0 and empty["ttft_admitted_p99_ms"] is None
    assert empty["admitted_first_retry_share"] is None


def _record(workload: str, arm: str, **metrics: float) -> dict[str, object]:
    setup = {"engine": {"batch": 8, "interval_ms": 20, "tokens": 20, "prefill_ms": 40}, "queue": 32}
    setup |= {"queue_timeout_secs": 2, "retries": 3, "warmup_secs": 2.0, "window_secs": 8.0, "unloaded": 0.25}
    base = {
        "offered_streams_per_s": 1.0,
        "goodput_tokens_per_s": 1.0,
        "goodput_x_capacity": 1.0,
        "capacity_tokens_per_s": 381.0,
        "rejected_429": 0,
        "rejected_503": 0,
        "rejected_share_of_attempts": 0.0,
        "outcome_gave_up": 0,
        "requests": 10,
    }
    return {"round": 0, "workload": workload, "target": arm, "metrics": base | metrics | {"setup": setup}}


def test_the_goals_compare_the_router_with_itself_unloaded_and_with_a_fixed_wait() -> None:
    records = [
        _record("overload_unloaded", "router", ttft_admitted_p99_ms=40.0),
        _record("overload_2x", "router", goodput_x_capacity=0.97, admitted_first_retry_share=0.3),
        _record("overload_2x", "router_fixed", admitted_first_retry_share=0.2),
        _record("overload_4x", "router", ttft_admitted_p99_ms=80.0, goodput_x_capacity=0.9),
        _record("overload_4x", "router_fixed", admitted_first_retry_share=0.1),
        {"round": 0, "workload": "overload_gate", "target": "router", "metrics": {"gate_us": 0.7}},
    ]
    goals = {g["goal"]: g for g in overload_report.goals(records)}
    ttft = goals["p99 time to first token of admitted requests at 4x overload / unloaded (router)"]
    assert (ttft["measured"], ttft["met"]) == (2.0, False)
    assert goals["goodput at 2x overload / engine capacity (router)"]["met"] is True
    assert goals["goodput at 4x overload / engine capacity (router)"]["met"] is False
    retry = goals["retries admitted at their first try at 2x: Retry-After honoured / a fixed 1 s (router; goal: more)"]
    assert retry["measured"] == pytest.approx(1.5) and retry["met"]
    retry4 = goals["retries admitted at their first try at 4x: Retry-After honoured / a fixed 1 s (router; goal: more)"]
    assert retry4["measured"] is None  # no share for the router's own arm at 4x: not measured, not met
    assert goals["admission gate's CPU per request, nothing waiting (router)"]["met"] is True
    table = overload_report.markdown(records)
    assert "| 4x | router, N=8 Q=32 T=2 s, clients honour Retry-After |" in table
    assert table.index("| unloaded |") < table.index("| 2x |") < table.index("| 4x |")
    assert "+0.70 µs" not in table  # the gate record here has no on/off figures
    assert overload_report.goals([]) == [] and overload_report.markdown([]) == ""


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_smoke_run_of_the_overload_workload(tmp_path: Path) -> None:
    """1. `python -m bench --smoke --workloads overload` 2. read its results file.
    Result: the unloaded and 4x cells of direct and the router, none failed; the router never let more
    than B streams reach the engine and refused some tries, with Retry-After; the goals and the
    overload table are in the generated output."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--workloads", "overload", "--results", str(tmp_path), "--no-docs"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=80,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(next(tmp_path.glob("*-smoke.json")).read_text())
    cells = {(r["workload"], r["target"]): r["metrics"] for r in results["records"]}
    assert set(cells) == {
        ("overload_unloaded", "direct"),
        ("overload_unloaded", "router"),
        ("overload_4x", "direct"),
        ("overload_4x", "router"),
        ("overload_gate", "router"),
    }
    for key, metrics in cells.items():
        assert "failed" not in metrics, (key, metrics)
    router = cells[("overload_4x", "router")]
    batch = router["setup"]["engine"]["batch"]
    assert router["engine_max_active"] <= batch < cells[("overload_4x", "direct")]["engine_max_active"]
    assert router["rejected_429"] > 0 and router["retry_wait_mean_s"] >= 1.0
    assert router["outcome_completed"] > 0 and router["goodput_tokens_per_s"] > 0
    names = {g["goal"] for g in report.summarize(results)["goals"]}
    assert "goodput at 4x overload / engine capacity (router)" in names
    assert "| 4x | router, N=2 Q=4 T=1 s, clients honour Retry-After |" in proc.stdout
