"""The front in the bench: its target's command line, the followed workload (registered, its request
one the front continues, followed through the real front), its smallest run, and its table from
records."""

from __future__ import annotations

import dataclasses
import http.client
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import front_report, harness, http_workloads, report, runner, targets, upstream
from drain_router.decisions import continuation
from drain_router.decisions.continuation import Continuable, CutAction, Dialect, StreamTracker
from drain_router.front.command import command as front_command

ROOT = Path(__file__).resolve().parents[2]


def test_the_front_target_is_the_front_with_the_upstream_as_its_pod(tmp_path: Path) -> None:
    """The command line: ``drain-router front`` with the bench upstream as its one pod, the listeners
    on loopback, the completions dialect; flags the front's own command accepts. Run when named, not
    by default; the followed workload's target, not a gRPC or WebSocket one, not drained."""
    (front,) = [t for t in targets.all_targets() if t.name == "front"]
    front.port, front.admin_port = 9101, 9102
    cmd = front.command(targets.Context(tmp_path, upstream_port=9100, server_cpus=None))
    args = cmd[cmd.index("front") + 1 :]
    assert args == [
        *("--pods", "http://127.0.0.1:9100", "--host", "127.0.0.1", "--port", "9101"),
        *("--admin-host", "127.0.0.1", "--admin-port", "9102", "--continuation", "completions"),
    ]
    parsed = front_command.make_context("front", list(args)).params
    assert (parsed["pods"], parsed["port"], parsed["continuation"]) == ("http://127.0.0.1:9100", "9101", "completions")
    assert front.readiness_url() == "http://127.0.0.1:9102/readyz"
    assert not front.speaks_grpc() and front.drain_signal is None
    assert "front" in targets.NAMES and "front" not in targets.DEFAULT_TARGETS
    assert "front" in targets.FOLLOWED_TARGETS
    assert "front" not in targets.GRPC_TARGETS + targets.WS_TARGETS


def test_the_followed_workload_is_an_http_workload() -> None:
    assert runner.select_workloads("sse_followed") == ("sse_followed",)
    assert "sse_followed" in runner.WORKLOAD_GROUPS["http"] and "sse_followed" in runner.select_workloads(None)
    assert report._group("sse_followed") == "http" and report._family("sse_followed") == "sse_followed"


class Recording:
    """A transport that keeps what the upstream writes."""

    def __init__(self) -> None:
        self.wire = bytearray()

    def write(self, data: Any) -> None:
        self.wire += data

    def close(self) -> None:
        pass


def _posted(query: str, body: bytes) -> list[bytes]:
    """The events the bench upstream streams for the followed request, each event's data."""
    proto = upstream.UpstreamProtocol()
    transport = Recording()
    proto.connection_made(transport)  # type: ignore[arg-type]
    head = b"POST /v1/completions?%s HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" % query.encode()
    proto.data_received(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    wire = bytes(transport.wire)
    assert wire.startswith(upstream.SSE_HEAD) and wire.endswith(b"0\r\n\r\n")
    return [line.removeprefix(b"data: ") for line in wire.split(b"\r\n") if line.startswith(b"data: ")]


@pytest.mark.parametrize("done", [True, False])
def test_the_followed_request_is_one_the_front_continues(done: bool) -> None:
    """1. the workload's request body, assessed as the front assesses a request 2. the upstream's
    answer to it (8 events, with or without ``[DONE]``) fed to the front's tracker, as the front does.
    Result: continuable (a completions request it keeps and follows, the events asked for its
    budget); the tracker reads every event, and a stream that ends without ``[DONE]`` is one whose
    budget is used: the front finishes it (``[DONE]``), it does not continue it."""
    body = http_workloads.followed_body(8)
    target = b"/v1/completions?chunks=8&interval_ms=0"
    verdict = continuation.assess(b"POST", target, body, Dialect.COMPLETIONS)
    assert isinstance(verdict, Continuable), verdict
    assert verdict.body["max_tokens"] == 8 and verdict.first_body() is None
    tracker = StreamTracker(verdict.api)
    events = _posted("chunks=8&interval_ms=0" + ("" if done else "&done=0"), body)
    assert len(events) == 8 + done
    for data in events:
        tracker.feed(data)
    assert not tracker.unfollowed and tracker.text() == " token" * 8
    assert tracker.done is done
    if not done:
        decision = continuation.at_cut(verdict, tracker, continuations=0, max_continuations=3)
        assert decision.action is CutAction.FINISH


def _stream(port: int, method: str, path: str, body: bytes | None) -> list[bytes]:
    """One stream's events (their data), read to the end of the response."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        headers = {"Accept": "text/event-stream"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        assert resp.status == 200
        text = resp.read()
    finally:
        conn.close()
    return [e.removeprefix(b"data: ") for e in text.split(b"\n\n") if e]


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_the_front_follows_the_followed_workload_and_relays_the_others() -> None:
    """1. the bench upstream, the router and the front in front of it, started as the bench starts
    them 2. through each, the followed workload's request for 8 events whose stream the upstream
    ends without ``[DONE]`` 3. through the front, the same stream as a ``GET`` (the burst's).
    Result: through the front the POST's stream ends with a ``finish_reason: "length"`` chunk and a
    ``[DONE]`` the upstream never sent (the front followed every event and saw the budget used); through the router, and as a GET through
    the front (relayed, not followed), it ends with the router's honest ``upstream_truncated`` event
    after the 8 events."""
    bench = harness.Harness(runner.PLANS["smoke"], ["router", "front"], lambda _: None)
    try:
        bench.start_upstream()
        bench.start_targets()
        assert [t.name for t in bench.targets] == ["router", "front"], bench.info
        router, front = bench.targets
        path, body = "/v1/completions?chunks=8&interval_ms=0&done=0", http_workloads.followed_body(8)
        followed = _stream(front.port, "POST", path, body)
        assert len(followed) == 10 and followed[-1] == b"[DONE]", followed[-2:]
        assert json.loads(followed[-2])["choices"][0]["finish_reason"] == "length"
        assert json.loads(followed[0])["choices"][0]["text"] == " token"
        for relayed in (_stream(router.port, "POST", path, body), _stream(front.port, "GET", path, None)):
            assert len(relayed) == 9 and b"upstream_truncated" in relayed[-1], relayed[-2:]
    finally:
        bench.stop_all()


@pytest.mark.slow
@pytest.mark.timeout(100)
def test_the_smoke_run_measures_the_front_beside_the_router(tmp_path: Path) -> None:
    """1. `python -m bench --smoke --targets direct,router,front --workloads sse_followed,sse_burst,small_get`
    2. read its results file. Result: the followed streams measured on all three, every stream whole,
    with the proxies' CPU per event; the burst and small GETs on the front too; the front's table
    printed, with what following costs."""
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "bench", "--smoke", "--targets", "direct,router,front"),
            *("--workloads", "sse_followed,sse_burst,small_get", "--results", str(tmp_path), "--no-docs"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = tmp_path.glob("*-smoke.json")
    results = json.loads(path.read_text())
    assert results["targets"]["front"]["available"], results["targets"]["front"]
    cells = {(r["workload"], r["target"]): r["metrics"] for r in results["records"]}
    for name in ("direct", "router", "front"):
        for workload in ("sse_followed", "sse_burst", "small_get"):
            metrics = cells[(workload, name)]
            assert "failed" not in metrics and metrics["errors"] == 0, (workload, name, metrics)
        followed = cells[("sse_followed", name)]
        assert followed["streams_done"] > 0 and followed["streams_short"] == 0, (name, followed)
    for name in ("router", "front"):
        assert cells[("sse_followed", name)]["target_cpu_us_per_unit"] > 0, name
    assert "| completions followed (POST, 8 events back to back, 2 streams) | CPU per event |" in proc.stdout
    assert "Following, per event: " in proc.stdout


# -- the table, from records ---------------------------------------------------------------------


def _records(cpu: dict[tuple[str, str], list[float]]) -> list[dict[str, Any]]:
    out = []
    for (workload, target), values in cpu.items():
        for rnd, value in enumerate(values):
            metrics = {"target_cpu_us_per_unit": value, "events_per_s": 1e6 / value, "rate": 1e6 / value}
            out.append({"round": rnd, "workload": workload, "target": target, "metrics": metrics})
    return out


RECORDS = _records(
    {
        ("sse_followed", "router"): [4.0, 5.0, 4.0],
        ("sse_followed", "front"): [10.0, 10.0, 9.0],
        ("sse_burst", "router"): [3.0, 4.0, 3.0],
        ("sse_burst", "front"): [4.0, 5.0, 3.5],
        ("sse_paced_256", "router"): [20.0, 20.0, 20.0],
        ("sse_paced_256", "front"): [25.0, 30.0, 20.0],
        ("sse_paced_16", "router"): [40.0, 40.0, 40.0],
        ("sse_paced_16", "front"): [50.0, 50.0, 50.0],
        ("small_get", "router"): [30.0, 30.0, 30.0],
    }
)
PLAN = {"burst_chunks": 64, "burst_concurrency": 16, "small_connections": 64, "paced_interval_ms": 30}


def test_the_front_table_holds_the_front_against_the_router_round_by_round() -> None:
    """The front's figure over the router's in each round, then the median; what the front adds, per
    round; following's cost = what it adds on followed streams less what it adds on relayed ones;
    a workload the front did not run has no row."""
    cpu = front_report.ratio(RECORDS, "sse_followed", "target_cpu_us_per_unit")
    assert (cpu["median"], cpu["min"], cpu["max"]) == pytest.approx((2.25, 2.0, 2.5))
    rate = front_report.ratio(RECORDS, "sse_followed", "events_per_s")
    assert rate["median"] == pytest.approx(1 / 2.25)
    added = front_report.added(RECORDS, "sse_followed")
    assert (added["median"], added["min"], added["max"]) == pytest.approx((5.0, 5.0, 6.0))
    following = front_report.following(RECORDS)  # per round: 6 - 1, 5 - 1, 5 - 0.5
    assert (following["median"], following["min"], following["max"]) == pytest.approx((4.5, 4.0, 5.0))
    text = front_report.markdown(RECORDS, PLAN)
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [r.split(" | ")[0] for r in rows] == [
        *["| completions followed (POST, 64 events back to back, 16 streams)"] * 2,
        *["| the same streams as GETs, relayed only"] * 2,
        *["| SSE 30 ms/event, 16 streams"] * 2,
        *["| SSE 30 ms/event, 256 streams"] * 2,
    ]
    assert rows[1] == (
        "| completions followed (POST, 64 events back to back, 16 streams) | CPU per event | 4.00 µs (4.00–5.00) "
        "| 10.0 µs (9.00–10.0) | 2.25x (2.00–2.50) | +5.00 µs (+5.00–+6.00) |"
    )
    assert "Following, per event: +4.50 µs (+4.00–+5.00)" in text
    assert front_report.markdown([r for r in RECORDS if r["target"] != "front"], PLAN) == ""


def test_the_bench_report_carries_the_front_table_and_the_followed_rows() -> None:
    results = {
        "records": RECORDS,
        "plan": dataclasses.asdict(runner.PLANS["smoke"]) | {"paced_concurrency": [16, 256]},
        "targets": {
            name: {"label": label, "available": True, "reason": None}
            for name, label in (("router", "drain-router"), ("front", "drain-router front"))
        },
        "started_at": "2026-01-01T00:00:00+00:00",
        "mode": "smoke",
        "wall_seconds": 1.0,
        "machine": {"cores": 2, "cpu_model": "x", "foreign_cores": 0.0},
    }
    derived = report.summarize(results)
    assert derived["summary"]["sse_followed"]["front"]["target_cpu_us_per_unit"]["median"] == 10.0
    text = report.markdown(results, derived)
    assert "| workload | drain-router | drain-router front |" in text
    assert "| SSE followed: proxy CPU per event | 4.00 µs (4.00–5.00) | 10.0 µs (9.00–10.0) |" in text
    assert "| completions followed (POST, " in text and "Following, per event: +4.50 µs" in text
