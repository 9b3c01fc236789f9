"""The bench harness cannot rot: a seconds-long run of every workload against every target that is
installed here (direct and the router always), with no performance assertion (the tracing workload's
routers: ratio 1 exported a span per request); and the gRPC load generator against the bench's gRPC
upstream in this process."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import hpack
import pytest

from bench import grpcload, h2, report, runner, stats, targets, upstream

ROOT = Path(__file__).resolve().parents[2]
ALWAYS = {"direct", "router"}


@pytest.mark.slow
@pytest.mark.timeout(170)
def test_smoke_run_measures_every_workload_on_every_installed_target(tmp_path: Path) -> None:
    """1. `python -m bench --smoke` against all targets 2. read its results file.
    Result: direct and the router have every workload, with no failed or skipped cell; the router drained its
    streams losslessly and exited 0; a target whose binary is absent is reported, not fatal."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--results", str(tmp_path), "--no-docs"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=160,  # the overload workload's smoke form is about 13 s of it
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = list(tmp_path.glob("*-smoke.json"))
    assert len(files) == 1
    results = json.loads(files[0].read_text())

    installed = {t.name for t in targets.all_targets() if t.name in targets.DEFAULT_TARGETS and t.missing() is None}
    assert installed >= ALWAYS, "direct and the router must always run"
    for name, info in results["targets"].items():
        assert info["available"] == (name in installed), (name, info)

    cells = {(r["workload"], r["target"]): r["metrics"] for r in results["records"]}
    for workload in ("small_get", "sse_burst", "sse_oneread", "sse_paced_4", "upload_1mib"):
        for name in installed:
            metrics = cells[(workload, name)]
            assert "failed" not in metrics, (workload, name, metrics)
            assert metrics.get("errors", 0) == 0, (workload, name, metrics)
    for name in installed - {"direct"}:
        assert cells[("idle_hold", name)]["steps"][0]["held"] == 20, name
    ws_installed = installed & set(targets.WS_TARGETS)
    for name in ws_installed:
        echo = cells[("ws_echo", name)]
        assert "skipped" not in echo, (name, echo)
        assert "failed" not in echo and echo["errors"] == 0 and echo["messages_total"] > 0, (name, echo)
        if name != "direct":
            assert cells[("ws_idle_hold", name)]["sessions_open"] == 20, name
    assert {t for w, t in cells if w.startswith("ws_")} <= ws_installed
    grpc_installed = installed & set(targets.GRPC_TARGETS)
    for name in grpc_installed:
        for workload in ("grpc_stream", "grpc_unary"):
            metrics = cells[(workload, name)]
            assert "skipped" not in metrics and "failed" not in metrics, (workload, name, metrics)
            assert metrics["errors"] == 0, (workload, name, metrics)
        assert cells[("grpc_stream", name)]["calls_done"] > 0, name
        assert cells[("grpc_unary", name)]["requests"] > 0, name
        if name != "direct":
            assert cells[("grpc_idle_hold", name)]["streams_open"] == 20, name
    assert {t for w, t in cells if w.startswith("grpc_")} == grpc_installed
    assert all("failed" not in m for (w, _), m in cells.items() if w.startswith("overload")), "overload"
    for workload in ("tracing_small_get", "tracing_sse_paced_4"):  # skipped only without the otel extra
        for arm in ("off", "ratio0", "ratio1"):
            metrics = cells[(workload, arm)]
            assert "failed" not in metrics and metrics.get("errors", 0) == 0, (workload, arm, metrics)
    if "skipped" not in cells[("tracing_small_get", "ratio1")]:  # every request of ratio 1 exported, none of 0
        exported = cells[("tracing_totals", "ratio1")]
        assert exported["spans_exported"] == exported["requests_served"] > 0, exported
        assert exported["spans_dropped"] == 0, exported
        assert cells[("tracing_totals", "ratio0")]["spans_exported"] == 0
    drain = cells[("drain", "router")]
    assert drain["streams_complete"] == drain["streams"], drain
    assert drain["exit_code"] == 0 and drain["readyz_503_ms"] is not None, drain

    derived = results["derived"]
    assert {g["goal"].split(" (")[0] for g in derived["goals"]} >= {
        "/readyz 503 after SIGTERM",
        "gRPC streamed tokens, 2 calls",
        "RSS per idle open gRPC stream with 20 open",
    }
    assert "| workload |" in proc.stdout  # the generated table
    assert list(tmp_path.glob("*-smoke.png")) or "chart skipped" in proc.stderr


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    got = stats.percentiles(values)
    assert (got["p50"], got["p99"], got["max"]) == (50.0, 99.0, 100.0)
    assert stats.summary([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3, "spread": 1.0}
    assert stats.summary([None])["median"] is None


def test_table_goes_between_the_markers_only(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.BEGIN}\nold table\n{report.END}\noutro\n")
    assert report.inject(readme, "| new |\n")
    assert readme.read_text() == f"intro\n{report.BEGIN}\n| new |\n{report.END}\noutro\n"
    plain = tmp_path / "plain.md"
    plain.write_text("no markers\n")
    assert not report.inject(plain, "| new |\n")
    assert plain.read_text() == "no markers\n"


def test_the_table_is_published_into_the_docs_page_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """1. publish the committed full runs (as `python -m bench report` does) into a copy of
    docs/bench.md 2. look at the README.
    Result: the table lands between the page's markers, with the HTTP, WebSocket and gRPC rows; the
    README carries no bench markers, so the generator writes one page, the one that holds the table."""
    from bench import __main__ as cli

    paths = report.latest_set(ROOT / "bench" / "results")
    assert paths
    page = tmp_path / "bench.md"
    page.write_text((ROOT / "docs" / "bench.md").read_text())
    results = report.combine([json.loads(p.read_text()) for p in paths])
    cli.publish(results, paths[0], docs=page, chart_path=None)
    text = page.read_text()
    assert text.count(report.BEGIN) == text.count(report.END) == 1
    table = capsys.readouterr().out.removesuffix("\n")  # print() added the newline
    assert "| workload |" in table
    assert "| small GET, 64 connections: req/s |" in table and "| gRPC streamed: proxy CPU per message |" in table
    assert f"{report.BEGIN}\n{table}{report.END}" in text
    readme = (ROOT / "README.md").read_text()
    assert report.BEGIN not in readme and report.END not in readme


# -- the gRPC load generator and upstream, in this process ---------------------------------------


@pytest.fixture
async def grpc_upstream() -> AsyncIterator[int]:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(upstream.GrpcUpstreamProtocol, "127.0.0.1", 0)
    yield int(server.sockets[0].getsockname()[1])
    server.close()


async def test_the_grpc_client_counts_what_the_upstream_streams(grpc_upstream: int) -> None:
    """1. a probe (Echo) 2. 3 s of nothing but a stream workload: 2 calls of 300 tokens, closed loop,
    0.2 s 3. unary Echo calls 4. 15 paced calls held, 10 to a connection 5. an unknown method.
    Result: every call is whole (300 tokens and the last message, grpc-status 0), the windows kept
    open past 64 KiB; the held calls are open and idle; the unknown method gets grpc-status 12."""
    assert await grpcload.probe("127.0.0.1", grpc_upstream) is None
    streamed = await grpcload.stream("127.0.0.1", grpc_upstream, 2, 0.2, messages=300, warmup=0.05)
    assert streamed["errors"] == 0 and streamed["calls_done"] > 0, streamed
    assert streamed["messages_total"] >= streamed["calls_done"] * 301
    unary = await grpcload.unary("127.0.0.1", grpc_upstream, 1, 2, 0.2, body_bytes=100_000, warmup=0.05)
    assert unary["errors"] == 0 and unary["requests"] > 0, unary
    held = await grpcload.hold("127.0.0.1", grpc_upstream, 15, lambda: 0, per_connection=10, interval_ms=60_000)
    assert (held["streams_open"], held["connections"], held["errors"]) == (15, 2, 0), held
    client = await grpcload.Client.connect("127.0.0.1", grpc_upstream)
    try:
        result = await asyncio.wait_for(client.call("/no.Such/Method", grpcload.echo_request(1)), 5)
    finally:
        await client.closed()
    assert (result.status, result.messages) == ("12", 0)


async def test_paced_generate_sends_one_token_per_interval(grpc_upstream: int) -> None:
    client = await grpcload.Client.connect("127.0.0.1", grpc_upstream)
    try:
        call = client.call(grpcload.GENERATE, grpcload.generate_request(3), ((grpcload.INTERVAL_HEADER, "100"),))
        await asyncio.sleep(0.05)
        assert not call.done()
        result = await asyncio.wait_for(call, 5)
    finally:
        await client.closed()
    assert (result.status, result.messages) == ("0", 4)


def test_messages_are_counted_across_any_framing() -> None:
    """A proxy may join messages in one DATA frame or split one (even its 5-byte prefix) across frames."""
    rng = random.Random(7)
    for _ in range(200):
        messages = [h2.grpc_message(bytes(rng.randrange(0, 40))) for _ in range(rng.randrange(1, 30))]
        wire = b"".join(messages)
        counter, counted, pos = h2.MessageCounter(), 0, 0
        while pos < len(wire):
            step = rng.randrange(1, 20)
            counted += counter.feed(wire[pos : pos + step])
            pos += step
        assert counted == len(messages)


def test_the_upstream_picks_its_headers_from_any_encoding() -> None:
    """Literals of every kind, Huffman or not, before and after the client saw HEADER_TABLE_SIZE 0."""
    headers = [
        (b":method", b"POST"),
        (b":path", b"/inference.GRPCInferenceService/Echo"),
        (b"x-request-id", b"0f8fad5b"),
        (upstream.INTERVAL_HEADER, b"250"),
    ]
    want = dict(headers[1:2] + headers[3:])
    encoder, picker = hpack.Encoder(), h2.Picker()
    assert picker.pick(encoder.encode(headers), upstream.REQUEST_FIELDS) == want
    assert picker.pick(encoder.encode(headers), upstream.REQUEST_FIELDS) == want  # dynamic table references
    picker.table_gone()
    encoder.header_table_size = 0
    for _ in range(2):
        assert picker.pick(encoder.encode(headers), upstream.REQUEST_FIELDS) == want
    assert picker.pick(h2.static_block(headers), upstream.REQUEST_FIELDS) == want
    assert picker.pick(encoder.encode(headers, huffman=False), upstream.REQUEST_FIELDS) == want


H2LOAD_OUTPUT = """\
finished in 2.00s, 28612.00 req/s, 1.23MB/s
requests: 57224 total, 57224 started, 57224 done, 57220 succeeded, 4 failed, 0 errored, 0 timeout
status codes: 57220 2xx, 0 3xx, 0 4xx, 4 5xx
traffic: 2.45MB (2573580) total, 1.01MB (1058644) headers (space savings 90.37%), 8.30MB (8705104) data
                     min         max         mean         sd        +/- sd
time for request:      271us     16.39ms      2.20ms       1.13ms    73.08%
"""


def test_h2load_summary_is_read() -> None:
    got = grpcload.parse_h2load(H2LOAD_OUTPUT)
    assert (got["rate"], got["requests"], got["errors"], got["non_2xx"]) == (28612.0, 57220, 4, 4)
    assert (got["lat_min_ms"], got["lat_max_ms"], got["lat_mean_ms"]) == (0.271, 16.39, 2.2)
    with pytest.raises(ValueError):
        grpcload.parse_h2load("connect failed")


@pytest.mark.skipif(shutil.which("h2load") is None, reason="h2load not installed (bench/install.sh)")
async def test_h2load_makes_unary_calls(grpc_upstream: int) -> None:
    got = await asyncio.to_thread(grpcload.h2load, f"http://127.0.0.1:{grpc_upstream}", 1, 2, 1, body_bytes=64)
    assert got["requests"] > 0 and got["errors"] == 0, got


def test_workloads_are_selected_by_name_or_group() -> None:
    assert runner.select_workloads(None) == runner.WORKLOADS
    assert runner.select_workloads("grpc") == ("grpc_stream", "grpc_unary", "grpc_idle_hold")
    assert runner.select_workloads("drain,small_get") == ("small_get", "drain")
    assert runner.workload_names(runner.PLANS["smoke"], ("sse_paced", "grpc_unary")) == ["sse_paced_4", "grpc_unary"]
    with pytest.raises(ValueError, match="unknown workload"):
        runner.select_workloads("grcp")


def _run(started: str, workloads: list[str], mode: str = "full") -> dict[str, object]:
    plan = dataclasses.asdict(runner.PLANS["smoke"]) | {"grpc_streams": 8}
    machine = {"cores": 2, "cpu_model": "x", "foreign_cores": 0.0}
    return {
        "started_at": started,
        "mode": mode,
        "wall_seconds": 1.0,
        "machine": machine,
        "plan": plan | ({"grpc_streams": 4} if workloads == ["small_get"] else {}),
        "targets": {"router": {"label": "drain-router", "available": True, "reason": None}},
        "records": [{"round": 0, "workload": w, "target": "router", "metrics": {"rate": 1.0}} for w in workloads],
    }


def test_runs_of_some_workloads_are_shown_beside_the_latest_of_the_others(tmp_path: Path) -> None:
    """1. results files: an old full run (HTTP, WebSocket), a newer one (HTTP), a newest gRPC-only one
    2. the set `bench report` shows, combined.
    Result: gRPC from the newest, HTTP from the newer, WebSocket from the old; each record once; the
    gRPC plan keys from the gRPC run, the others from the HTTP run; the header names all three."""
    runs = {
        "20260101T000000Z-full.json": _run("2026-01-01T00:00:00+00:00", ["small_get", "ws_echo"]),
        "20260102T000000Z-full.json": _run("2026-01-02T00:00:00+00:00", ["small_get"]),
        "20260103T000000Z-full.json": _run("2026-01-03T00:00:00+00:00", ["grpc_stream", "grpc_unary"]),
        "20260104T000000Z-quick.json": _run("2026-01-04T00:00:00+00:00", ["small_get"], mode="quick"),
    }
    for name, data in runs.items():
        (tmp_path / name).write_text(json.dumps(data))
    paths = report.latest_set(tmp_path)
    assert [p.name for p in paths] == sorted(runs)[2::-1]
    combined = report.combine([json.loads(p.read_text()) for p in paths])
    assert sorted(r["workload"] for r in combined["records"]) == ["grpc_stream", "grpc_unary", "small_get", "ws_echo"]
    assert combined["started_at"] == "2026-01-02T00:00:00+00:00"  # the HTTP run's
    assert combined["plan"]["grpc_streams"] == 8
    text = report.markdown(combined, report.summarize(combined))
    assert text.count("Run `") == 3 and "for the gRPC rows" in text
    grpc_only = json.loads(paths[0].read_text())
    assert report.with_missing(grpc_only, tmp_path)["records"] == combined["records"]


def test_targets_take_turns_in_alternate_order(tmp_path: Path) -> None:
    """1. two rounds of one workload against two targets 2. read the cells in the order they ran.
    Result: the second round measures the targets in the reverse order of the first."""
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "bench", "--smoke", "--rounds", "2", "--workloads", "small_get"),
            *("--targets", "direct,router", "--results", str(tmp_path), "--no-docs"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (results,) = [json.loads(f.read_text()) for f in tmp_path.glob("*-smoke.json")]
    order = [
        [r["target"] for r in results["records"] if r["round"] == n and r["workload"] == "small_get"] for n in (0, 1)
    ]
    assert order[0] == ["direct", "router"] and order[1] == ["router", "direct"], order
