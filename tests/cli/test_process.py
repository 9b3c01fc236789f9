"""``drain-router serve`` as a real process receiving real signals."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from drain_router_dev import streams
from drain_router_dev.process import wait_until
from tests.process import RouterProcess, held_entry


@pytest.fixture
async def spawn() -> AsyncIterator[Callable[..., Awaitable[RouterProcess]]]:
    procs: list[RouterProcess] = []

    async def start(*args: str, **options: Any) -> RouterProcess:
        proc = await RouterProcess.start("--port", "0", "--admin-port", "0", *args, **options)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        await proc.kill()


async def _stream(url: str) -> list[str]:
    async with aiohttp.ClientSession() as s, s.get(url) as resp:
        assert resp.status == 200
        return streams.events_of(await resp.read())


async def test_clean_drain_exits_0_with_streams_completed(fake_upstream, spawn):
    """1. 5 streams (~1.5 s each) through a real router process  2. real SIGTERM, window 1 s.
    Result: readyz 503 while draining, every stream ends with [DONE], exit status 0."""
    p = await spawn("--upstream", fake_upstream.url, "--shutdown-drain-secs", "1", "--termination-grace-secs", "30")
    await p.wait_event("startup.listening")
    streams = [asyncio.ensure_future(_stream(f"http://127.0.0.1:{p.port}/sse?n=30&iv=0.05")) for _ in range(5)]
    await wait_until(lambda: fake_upstream.started == 5, 5, "5 started upstream")
    p.signal(signal.SIGTERM)
    await p.wait_event("drain.start")
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{p.admin_port}/readyz") as resp:
        assert resp.status == 503
    results = await asyncio.gather(*streams)
    assert all(events[-1] == "[DONE]" and len(events) == 31 for events in results)
    assert await p.wait() == 0
    assert [n for n in p.names() if n.startswith("drain.")] == ["drain.start", "drain.closing", "drain.complete"]


async def test_deadline_abort_exits_1(fake_upstream, spawn):
    p = await spawn("--upstream", fake_upstream.url, "--shutdown-drain-secs", "1", "--termination-grace-secs", "3")
    await p.wait_event("startup.listening")
    stream = asyncio.ensure_future(_stream(f"http://127.0.0.1:{p.port}/sse?n=100000&iv=0.05"))
    await wait_until(lambda: fake_upstream.started == 1, 5, "1 started upstream")
    t0 = time.monotonic()
    p.signal(signal.SIGTERM)
    assert await p.wait(10) == 1
    assert 1.0 <= time.monotonic() - t0 < 3.0, "deadline at t0 + grace - 2 s"
    deadline = await p.wait_event("drain.deadline")
    assert deadline["aborted"] == 1
    with pytest.raises(aiohttp.ClientError):
        await stream


def test_config_error_exits_2_with_one_message():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "drain_router",
            "serve",
            "--upstream",
            "http://127.0.0.1:1",
            "--shutdown-drain-secs",
            "18000",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "--shutdown-drain-secs" in result.stderr and "18000" in result.stderr
    assert "at most 1800" in result.stderr


async def test_sigterm_during_startup_is_honoured(fake_upstream, spawn):
    """1. the router is still starting: loading aiohttp, before the event loop and the bind; or
    bound but waiting for an unhealthy upstream  2. SIGTERM.
    Result: it exits 0 promptly (no 30 s window: it never said ready), not killed by the signal."""
    fake_upstream.healthy = False
    args = ("--upstream", fake_upstream.url, "--upstream-health-path", "/health", "--shutdown-drain-secs", "30")
    p = await spawn(*args, entry=held_entry("drain_router.runtime.lifecycle"))
    await p.wait_stopped()  # as serve starts importing aiohttp and uvloop: no event loop, nothing bound
    p.signal(signal.SIGTERM)  # pending while it is stopped, delivered as it resumes
    p.signal(signal.SIGCONT)
    assert await p.wait(10) == 0
    assert "startup.listening" not in p.names(), "a signal before the bind means no bind at all"
    assert [n for n in p.names() if n.startswith("drain.")] == ["drain.closing", "drain.complete"]
    p2 = await spawn(*args)
    await p2.wait_event("startup.listening")
    p2.signal(signal.SIGTERM)  # while starting: listening, upstream not healthy yet
    assert await p2.wait(10) == 0, "exits well before the 30 s window: it never said ready"
    assert [n for n in p2.names() if n.startswith("drain.")] == ["drain.closing", "drain.complete"]


async def test_second_sigterm_expedites_the_window(fake_upstream, spawn):
    p = await spawn("--upstream", fake_upstream.url, "--shutdown-drain-secs", "60")
    await p.wait_event("startup.listening")
    stream = asyncio.ensure_future(_stream(f"http://127.0.0.1:{p.port}/sse?n=20&iv=0.05"))
    await wait_until(lambda: fake_upstream.started == 1, 5, "1 started upstream")
    p.signal(signal.SIGTERM)
    await p.wait_event("drain.start")
    t0 = time.monotonic()
    p.signal(signal.SIGTERM)
    closing = await p.wait_event("drain.closing")
    assert closing["reason"] == "second_sigterm"
    assert (await stream)[-1] == "[DONE]"
    assert await p.wait(10) == 0
    assert time.monotonic() - t0 < 5, "did not wait out the 60 s window"


async def test_sigint_twice_aborts_and_exits_1(fake_upstream, spawn):
    p = await spawn("--upstream", fake_upstream.url, "--shutdown-drain-secs", "60")
    await p.wait_event("startup.listening")
    stream = asyncio.ensure_future(_stream(f"http://127.0.0.1:{p.port}/sse?n=100000&iv=0.05"))
    await wait_until(lambda: fake_upstream.started == 1, 5, "1 started upstream")
    p.signal(signal.SIGINT)
    await p.wait_event("drain.closing")
    p.signal(signal.SIGINT)
    assert await p.wait(5) == 1
    with pytest.raises(aiohttp.ClientError):
        await stream


async def test_startup_logs_rlimit_and_advisory(fake_upstream, spawn):
    p = await spawn("--upstream", fake_upstream.url)
    rlimit = await p.wait_event("startup.rlimit")
    assert rlimit["nofile_soft"] == rlimit["nofile_hard"] or rlimit["nofile_soft"] >= rlimit["nofile_soft_before"]
    advisory = await p.wait_event("startup.advisory")
    assert advisory["code"] == "DRAIN_CONSUMES_GRACE"
    await p.wait_event("state.serving")
    p.signal(signal.SIGTERM)
    await p.wait_event("drain.start")  # two signals sent back to back may arrive as one
    p.signal(signal.SIGTERM)
    assert await p.wait() == 0


async def test_port_in_use_exits_2_naming_the_ports(fake_upstream):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = await RouterProcess.start("--upstream", fake_upstream.url, "--port", str(port), "--admin-port", "0")
        try:
            assert await p.wait(15) == 2
            failed = await p.wait_event("startup.bind_failed")
            assert failed["port"] == port and "--port" in failed["remedy"]
        finally:
            await p.kill()
