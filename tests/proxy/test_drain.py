"""The drain, in process: the router runs in the test's loop and tests call handle_exit()."""

from __future__ import annotations

import asyncio
import time
from typing import Literal

import aiohttp
import pytest
from structlog.testing import capture_logs

from drain_router_dev import streams
from drain_router_dev.process import wait_until
from tests.blackbox import outcomes_in


async def _stream(session: aiohttp.ClientSession, url: str) -> tuple[int, list[str]]:
    async with session.get(url) as resp:
        return resp.status, streams.events_of(await resp.read())


async def test_100_streams_started_before_sigterm_all_finish(fake_upstream, start_router):
    """1. 100 SSE streams start (40 events, 25 ms apart, ~1 s each)  2. SIGTERM with a 1 s window
    3. the window ends, the listener closes. Result: every stream ends with [DONE], exit 0."""
    r = await start_router(upstream=fake_upstream.url, shutdown_drain_secs=1)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        tasks = [asyncio.ensure_future(_stream(s, f"{r.url}/sse?n=40&iv=0.025")) for _ in range(100)]
        await wait_until(lambda: len(r.state.inflight) == 100, 5, "100 streams in flight")
        r.sigterm()
        results = await asyncio.gather(*tasks)
    assert all(status == 200 and events[-1] == "[DONE]" and len(events) == 41 for status, events in results)
    assert await r.exit_code() == 0
    assert fake_upstream.finished == 100 and fake_upstream.cancelled == 0


async def test_draining_keeps_serving_with_readyz_503_and_connection_close(fake_upstream, start_router, http):
    """1. a stream is in flight  2. SIGTERM (window 2 s)  3. during the window: probes, a new TCP
    connection, a proxied request  4. after the window: a new connection.
    Result: /readyz 503 draining on both listeners, /livez 200, the new connection is accepted and
    its request proxied with Connection: close; after the window new connections are refused."""
    r = await start_router(upstream=fake_upstream.url, shutdown_drain_secs=2)
    holder = asyncio.ensure_future(_stream(http, f"{r.url}/sse?n=60&iv=0.05"))
    await wait_until(lambda: len(r.state.inflight) == 1, 5, "1 in flight")
    r.sigterm()
    async with aiohttp.ClientSession() as fresh:  # a new TCP connection, not a pooled one
        for base in (r.url, r.admin):
            async with fresh.get(f"{base}/readyz") as resp:
                assert resp.status == 503
                body = await resp.json()
                assert body["status"] == "draining" and body["inflight"] == 1
                if base == r.url:
                    assert resp.headers["Connection"] == "close", "probes on the traffic port too"
            async with fresh.get(f"{base}/livez") as resp:
                assert resp.status == 200
        async with fresh.get(f"{r.url}/sse?n=2&iv=0") as resp:
            assert resp.status == 200
            assert resp.headers["Connection"] == "close"
            assert streams.events_of(await resp.read())[-1] == "[DONE]"
    assert r.state.phase.value == "draining"
    await wait_until(lambda: r.state.phase.value == "closing", 4, "closing after the window")
    await wait_until(lambda: _refused(r.router.port), 2, "listener closed")
    async with http.get(f"{r.admin}/readyz") as resp:
        assert resp.status == 503 and (await resp.json())["status"] == "closing"
    _status, events = await holder
    assert events[-1] == "[DONE]"
    assert await r.exit_code() == 0


def _refused(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        try:
            s.connect(("127.0.0.1", port))
        except ConnectionRefusedError:
            return True
        return False


async def test_pooled_keepalive_connection_is_closed_when_idle_at_closing(fake_upstream, start_router):
    """1. a client holds an idle keep-alive connection  2. closing begins while a stream runs.
    Result: the idle connection is closed at once (not when the process exits)."""
    r = await start_router(upstream=fake_upstream.url, shutdown_drain_secs=0)
    reader, writer = await asyncio.open_connection("127.0.0.1", r.router.port)
    writer.write(b"GET /livez HTTP/1.1\r\nHost: t\r\n\r\n")
    await writer.drain()
    await reader.readuntil(b'{"status": "alive"}')
    async with aiohttp.ClientSession() as s:
        holder = asyncio.ensure_future(_stream(s, f"{r.url}/sse?n=40&iv=0.05"))
        await wait_until(lambda: len(r.state.inflight) == 1, 5, "1 in flight")
        r.sigterm()
        assert await asyncio.wait_for(reader.read(100), 1.0) == b"", "idle connection closed"
        assert len(r.state.inflight) == 1 and r.state.phase.value == "closing"
        assert (await holder)[1][-1] == "[DONE]"
    writer.close()
    assert await r.exit_code() == 0


async def test_idle_router_exits_right_after_the_window(fake_upstream, start_router):
    r = await start_router(upstream=fake_upstream.url, shutdown_drain_secs=1)
    t0 = time.monotonic()
    r.sigterm()
    assert await r.exit_code(5) == 0
    elapsed = time.monotonic() - t0
    assert 1.0 <= elapsed < 1.8, f"exited after {elapsed:.2f}s for a 1 s window"


async def test_zero_window_skips_draining(fake_upstream, start_router):
    r = await start_router(upstream=fake_upstream.url, shutdown_drain_secs=0)
    with capture_logs() as logs:
        r.sigterm()
        assert await r.exit_code(2) == 0
    assert [e["event"] for e in logs if e["event"].startswith("drain.")] == ["drain.closing", "drain.complete"]


async def test_deadline_aborts_the_rest_counts_and_exits_1(fake_upstream, start_router, http):
    """1. 3 endless streams  2. SIGTERM with window 1 s, grace 3 s (deadline t0 + 1 s).
    Result: at the deadline all 3 are aborted, counted in metrics and the log, exit 1."""
    r = await start_router(upstream=fake_upstream.url, shutdown_drain_secs=1, termination_grace_secs=3)
    tasks = [asyncio.ensure_future(_stream(http, f"{r.url}/sse?n=100000&iv=0.05")) for _ in range(3)]
    await wait_until(lambda: len(r.state.inflight) == 3, 5, "3 in flight")
    registry = r.router.metrics.registry
    assert registry.get_sample_value("drain_router_drain_deadline_timestamp_seconds") == 0
    with capture_logs() as logs:
        t0 = time.monotonic()
        wall = time.time()
        r.sigterm()
        # Exported from SIGTERM on, so a scrape before the abort sees the deadline coming.
        announced = registry.get_sample_value("drain_router_drain_deadline_timestamp_seconds")
        code = await r.exit_code(6)
        elapsed = time.monotonic() - t0
    assert code == 1
    assert 1.0 <= elapsed < 2.0
    assert announced is not None and wall + 1.0 - 0.5 <= announced <= wall + 1.0 + 0.5
    [deadline] = [e for e in logs if e["event"] == "drain.deadline"]
    assert deadline["aborted"] == 3 and deadline["inflight"] == 3 and deadline["exit_code"] == 1
    assert r.router.aborted == 3
    assert len(r.state.inflight) == 0
    samples = outcomes_in(r.router.metrics.registry)
    assert samples["deadline_aborted"] == 3
    for t in tasks:
        with pytest.raises(aiohttp.ClientError):
            await t
    await wait_until(lambda: fake_upstream.cancelled == 3, 2, "upstream saw the aborts")


class _WatchedEvent(asyncio.Event):
    """An ``asyncio.Event`` that records when someone starts waiting on it."""

    def __init__(self) -> None:
        super().__init__()
        self.awaited = asyncio.Event()

    async def wait(self) -> Literal[True]:
        self.awaited.set()
        return await super().wait()


async def test_drain_wait_answers_only_after_the_drain(fake_upstream, start_router, http):
    """1. preStop calls /admin/drain-wait before any SIGTERM  2. a stream runs  3. SIGTERM (1 s
    window). Result: drain-wait is still pending while draining and closing, and answers
    {"drained": true} only once the last stream finished."""
    r = await start_router(upstream=fake_upstream.url, shutdown_drain_secs=1)
    r.state.drain_finished = finished = _WatchedEvent()
    stream = asyncio.ensure_future(_stream(http, f"{r.url}/sse?n=30&iv=0.05"))  # ~1.5 s
    await wait_until(lambda: len(r.state.inflight) == 1, 5, "1 in flight")
    async with aiohttp.ClientSession() as admin:
        wait = asyncio.ensure_future(admin.get(f"{r.admin}/admin/drain-wait?timeout=20"))
        await wait_until(lambda: finished.awaited.is_set() or wait.done(), 5, "drain-wait to be held")
        assert not wait.done(), "drain-wait answered before any SIGTERM"
        assert r.state.phase.value == "serving"
        r.sigterm()
        await wait_until(lambda: r.state.phase.value == "closing", 3, "phase closing")
        assert not wait.done(), "drain-wait answered before the drain finished"
        resp = await asyncio.wait_for(wait, 5)
        assert stream.done() and (await stream)[1][-1] == "[DONE]"
        assert resp.status == 200
        assert (await resp.json())["drained"] is True
    assert await r.exit_code() == 0


async def test_drain_wait_times_out_with_drained_false(fake_upstream, start_router, http):
    r = await start_router(upstream=fake_upstream.url)
    t0 = time.monotonic()
    async with http.get(f"{r.admin}/admin/drain-wait?timeout=0.3") as resp:
        assert resp.status == 200
        assert (await resp.json())["drained"] is False
    assert time.monotonic() - t0 >= 0.3
    async with http.get(f"{r.admin}/admin/drain-wait?timeout=-1") as resp:
        assert resp.status == 400


async def test_second_sigterm_expedites_to_closing(fake_upstream, start_router, http):
    r = await start_router(upstream=fake_upstream.url, shutdown_drain_secs=30)
    stream = asyncio.ensure_future(_stream(http, f"{r.url}/sse?n=10&iv=0.05"))
    await wait_until(lambda: len(r.state.inflight) == 1, 5, "1 in flight")
    r.sigterm()
    assert r.state.phase.value == "draining"
    r.sigterm()
    assert r.state.phase.value == "closing"
    assert (await stream)[1][-1] == "[DONE]", "in-flight still finishes"
    assert await r.exit_code(3) == 0


async def test_sigterm_while_closing_is_logged_and_ignored(fake_upstream, start_router, http):
    r = await start_router(upstream=fake_upstream.url, shutdown_drain_secs=0)
    stream = asyncio.ensure_future(_stream(http, f"{r.url}/sse?n=10&iv=0.05"))
    await wait_until(lambda: len(r.state.inflight) == 1, 5, "1 in flight")
    r.sigterm()
    with capture_logs() as logs:
        r.sigterm()
    [warning] = logs
    assert warning["event"] == "drain.signal_ignored" and warning["log_level"] == "warning"
    assert "SIGKILL forces" in warning["message"]
    assert (await stream)[1][-1] == "[DONE]"
    assert await r.exit_code(3) == 0


async def test_second_sigint_aborts_at_once_exit_1(fake_upstream, start_router, http):
    r = await start_router(upstream=fake_upstream.url, shutdown_drain_secs=30)
    stream = asyncio.ensure_future(_stream(http, f"{r.url}/sse?n=100000&iv=0.05"))
    await wait_until(lambda: len(r.state.inflight) == 1, 5, "1 in flight")
    r.router.handle_exit(2)
    assert r.state.phase.value == "closing"
    r.router.handle_exit(2)
    assert await r.exit_code(2) == 1
    with pytest.raises(aiohttp.ClientError):
        await stream


async def test_drain_log_events_carry_the_timeline(fake_upstream, start_router, http):
    r = await start_router(upstream=fake_upstream.url, shutdown_drain_secs=1, termination_grace_secs=20)
    stream = asyncio.ensure_future(_stream(http, f"{r.url}/sse?n=30&iv=0.05"))
    await wait_until(lambda: len(r.state.inflight) == 1, 5, "1 in flight")
    with capture_logs() as logs:
        r.sigterm()
        await stream
        assert await r.exit_code() == 0
    events = {e["event"]: e for e in logs if e["event"].startswith("drain.")}
    assert list(events) == ["drain.start", "drain.closing", "drain.complete"]
    start = events["drain.start"]
    assert start["deadline"] == pytest.approx(start["t0"] + 18)
    assert start["inflight"] == 1 and start["shutdown_drain_secs"] == 1
    assert events["drain.complete"]["served_during_drain"] == 1
    assert events["drain.complete"]["started_during_drain"] == 0
    assert events["drain.complete"]["exit_code"] == 0
    assert [events[n]["state"] for n in events] == ["draining", "closing", "exited"]


async def test_one_decision_through_closing_to_exited_logs_each_state(fake_upstream, start_router, http):
    r = await start_router(upstream=fake_upstream.url, shutdown_drain_secs=1)
    with capture_logs() as logs:
        r.sigterm()
        async with http.get(f"{r.url}/sse?n=1&iv=0") as resp:  # arrives during the window
            await resp.read()
        assert await r.exit_code() == 0
    states = {e["event"]: e["state"] for e in logs if e["event"].startswith("drain.")}
    assert states == {"drain.start": "draining", "drain.closing": "closing", "drain.complete": "exited"}
    complete = next(e for e in logs if e["event"] == "drain.complete")
    assert complete["started_during_drain"] == 1 and complete["served_during_drain"] == 1


async def test_upstream_health_gates_readiness(fake_upstream, start_router, http):
    fake_upstream.healthy = False
    r = await start_router(upstream=fake_upstream.url, upstream_health_path="/health", upstream_health_interval_secs=1)
    async with http.get(f"{r.admin}/readyz") as resp:
        assert resp.status == 503 and (await resp.json())["status"] == "starting"
    fake_upstream.healthy = True
    await wait_until(lambda: r.state.phase.value == "serving", 3, "phase serving")
    async with http.get(f"{r.admin}/readyz") as resp:
        assert resp.status == 200
    fake_upstream.healthy = False
    await wait_until(lambda: r.state.upstream_up is False, 10, "the upstream seen down (3 failed polls, 1 s apart)")
    async with http.get(f"{r.url}/readyz") as resp:
        assert resp.status == 503 and (await resp.json())["status"] == "upstream_unavailable"


async def test_sigterm_while_starting_exits_without_a_window(fake_upstream, start_router):
    fake_upstream.healthy = False
    r = await start_router(upstream=fake_upstream.url, upstream_health_path="/health", shutdown_drain_secs=30)
    assert r.state.phase.value == "starting"
    t0 = time.monotonic()
    r.sigterm()
    assert await r.exit_code(3) == 0
    assert time.monotonic() - t0 < 1.5
