"""The load generator: an aiohttp client that sees a stream the way an SSE client does, plus a wrk
wrapper for plain request/response load (where a C client measures the proxy, not Python).

Every function measures its own CPU use (``loadgen_core``: CPU seconds per wall second, 1.0 = one
core saturated), so a result that is client-bound says so.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench import stats

WRK_REPORT_LUA = """
done = function(summary, latency, requests)
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"errors_connect":%d,"errors_read":%d,'
    .. '"errors_write":%d,"errors_status":%d,"errors_timeout":%d,"lat_p50_us":%d,"lat_p90_us":%d,'
    .. '"lat_p99_us":%d,"lat_max_us":%d}\\n',
    summary.requests, summary.duration, summary.bytes, summary.errors.connect, summary.errors.read,
    summary.errors.write, summary.errors.status, summary.errors.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
"""

WRK_UPLOAD_LUA = """
wrk.method = "POST"
wrk.body = string.rep("a", %d)
wrk.headers["Content-Type"] = "application/octet-stream"
"""


def cpu_self() -> float:
    """CPU seconds this process (an in-process load generator) has used."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_children() -> float:
    """CPU seconds the load tools this process ran (wrk, h2load) have used."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_tool(
    cmd: list[str], duration: float, cpus: set[int] | None
) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """Run a load tool (wrk, h2load) pinned to ``cpus`` for about ``duration`` s: its result, the
    wall seconds it took and the CPU seconds it used."""
    cpu0 = cpu_children()
    wall0 = time.perf_counter()
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=duration + 30,
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
    )
    return proc, time.perf_counter() - wall0, cpu_children() - cpu0


def session(**kwargs: Any) -> aiohttp.ClientSession:
    """A client session with no connection cap (aiohttp's default of 100 would cap concurrency)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, use_dns_cache=False),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        auto_decompress=False,
        **kwargs,
    )


# -- wrk ------------------------------------------------------------------------------------------


def wrk_available() -> bool:
    return shutil.which("wrk") is not None


def wrk(
    url: str,
    connections: int,
    duration: float,
    *,
    upload_bytes: int = 0,
    cpus: set[int] | None = None,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One wrk run (one thread, pinned like this process), each request with ``headers``. Returns
    rate, latency and errors."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as fh:
        if upload_bytes:
            fh.write(WRK_UPLOAD_LUA % upload_bytes)
        fh.write(WRK_REPORT_LUA)
        script = fh.name
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(duration))}s", "--timeout", "10s", "-s", script]
    cmd += [arg for name, value in (headers or {}).items() for arg in ("-H", f"{name}: {value}")] + [url]
    try:
        proc, wall, cpu = run_tool(cmd, duration, cpus)
    finally:
        os.unlink(script)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH_JSON ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    raw = json.loads(line.removeprefix("BENCH_JSON "))
    seconds = raw["duration_us"] / 1e6
    errors = sum(v for k, v in raw.items() if k.startswith("errors_"))
    return {
        "client": "wrk",
        "requests": raw["requests"],
        "rate": raw["requests"] / seconds,
        "mib_per_s": raw["requests"] * upload_bytes / seconds / 2**20 if upload_bytes else None,
        "lat_p50_ms": raw["lat_p50_us"] / 1000,
        "lat_p90_ms": raw["lat_p90_us"] / 1000,
        "lat_p99_ms": raw["lat_p99_us"] / 1000,
        "errors": errors,
        "seconds": seconds,
        "loadgen_core": cpu / wall,
    }


# -- aiohttp request/response (fallback when wrk is absent) -------------------------------------


async def requests(
    url: str, connections: int, duration: float, *, upload_bytes: int = 0, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """Closed loop: ``connections`` clients, each sending one request after another (with ``headers``)."""
    body = b"a" * upload_bytes if upload_bytes else None
    latencies: list[float] = []
    errors = 0
    cpu0, wall0 = cpu_self(), time.perf_counter()
    end_at = wall0 + duration
    async with session() as http:

        async def client() -> None:
            nonlocal errors
            while time.perf_counter() < end_at:
                t0 = time.perf_counter()
                try:
                    if body is None:
                        async with http.get(url, headers=headers) as resp:
                            await resp.read()
                    else:
                        async with http.post(url, data=body, headers=headers) as resp:
                            await resp.read()
                    ok = resp.status == 200
                except (aiohttp.ClientError, OSError):
                    ok = False
                if ok:
                    latencies.append(time.perf_counter() - t0)
                else:
                    errors += 1

        await asyncio.gather(*(client() for _ in range(connections)))
    wall = time.perf_counter() - wall0
    pct = stats.percentiles(latencies)
    return {
        "client": "aiohttp",
        "requests": len(latencies),
        "rate": len(latencies) / wall,
        "mib_per_s": len(latencies) * upload_bytes / wall / 2**20 if upload_bytes else None,
        "lat_p50_ms": pct["p50"] * 1000,
        "lat_p90_ms": pct["p90"] * 1000,
        "lat_p99_ms": pct["p99"] * 1000,
        "errors": errors,
        "seconds": wall,
        "loadgen_core": (cpu_self() - cpu0) / wall,
    }


# -- SSE streams ----------------------------------------------------------------------------------


@dataclass
class _SseTally:
    warm_at: float
    end_at: float
    expected_events: int
    ttfb: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    events_in_window: int = 0
    events_total: int = 0
    streams_done: int = 0
    streams_short: int = 0
    errors: int = 0
    first_error: str | None = None


SSE_HEADERS = {"Accept": "text/event-stream"}
JSON_SSE_HEADERS = {**SSE_HEADERS, "Content-Type": "application/json"}


async def _one_stream(http: aiohttp.ClientSession, url: str, tally: _SseTally, body: bytes | None) -> None:
    t0 = time.perf_counter()
    record = t0 >= tally.warm_at
    events = 0
    last = 0.0
    newline_tail = False
    if body is None:
        request = http.get(url, headers=SSE_HEADERS)
    else:
        request = http.post(url, data=body, headers=JSON_SSE_HEADERS)  # bytes: sent with a Content-Length
    try:
        async with request as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}")
            async for data in resp.content.iter_any():
                now = time.perf_counter()
                n = data.count(b"\n\n")
                if newline_tail and data[:1] == b"\n":
                    n += 1  # an event boundary split across two reads
                newline_tail = data[-1:] == b"\n"
                if not n:
                    continue
                if events == 0:
                    if record:
                        tally.ttfb.append(now - t0)
                elif now >= tally.warm_at:
                    tally.gaps.append(now - last)
                if now >= tally.warm_at and events:
                    tally.gaps.extend([0.0] * (n - 1))  # events that arrived in the same read
                if tally.warm_at <= now < tally.end_at:
                    tally.events_in_window += n
                events += n
                tally.events_total += n
                last = now
    except (TimeoutError, aiohttp.ClientError, OSError, RuntimeError) as exc:
        tally.errors += 1
        tally.first_error = tally.first_error or f"{type(exc).__name__}: {exc}"
        await asyncio.sleep(0.05)  # do not spin on a refusing target
        return
    if events >= tally.expected_events:
        tally.streams_done += 1
    else:
        tally.streams_short += 1


async def sse(
    url: str,
    concurrency: int,
    duration: float,
    *,
    expected_events: int,
    stagger: float,
    warmup: float,
    stream_seconds: float,
    body: bytes | None = None,
) -> dict[str, Any]:
    """Closed loop of ``concurrency`` clients streaming one completion after another: each a ``GET``,
    or with ``body`` a ``POST`` of it (JSON, as an OpenAI client sends its request).

    Clients start spread over ``stagger`` seconds; samples count from ``warmup`` on, for ``duration``
    seconds; streams begun by then are let finish. Returns event rate in the window, time to first
    event (TTFB) and inter-event gap percentiles as the client sees them.
    """
    cpu0, wall0 = cpu_self(), time.perf_counter()
    tally = _SseTally(warm_at=wall0 + warmup, end_at=wall0 + warmup + duration, expected_events=expected_events)
    async with session() as http:

        async def client() -> None:
            await asyncio.sleep(random.random() * stagger)
            while time.perf_counter() < tally.end_at:
                await _one_stream(http, url, tally, body)

        tasks = [asyncio.ensure_future(client()) for _ in range(concurrency)]
        _, pending = await asyncio.wait(tasks, timeout=warmup + duration + stream_seconds + 10)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
            tally.errors += len(pending)
            tally.first_error = tally.first_error or f"{len(pending)} streams still open at the cap"
    wall = time.perf_counter() - wall0
    ttfb = stats.percentiles(tally.ttfb)
    gaps = stats.percentiles(tally.gaps)
    return {
        "client": "aiohttp",
        "concurrency": concurrency,
        "events_per_s": tally.events_in_window / duration,
        "streams_per_s": tally.events_in_window / duration / expected_events,
        "events_total": tally.events_total,
        "streams_done": tally.streams_done,
        "streams_short": tally.streams_short,
        "ttfb_p50_ms": ttfb["p50"] * 1000,
        "ttfb_p99_ms": ttfb["p99"] * 1000,
        "gap_p50_ms": gaps["p50"] * 1000,
        "gap_p99_ms": gaps["p99"] * 1000,
        "gap_p999_ms": gaps["p999"] * 1000,
        "gap_max_ms": gaps["max"] * 1000,
        "samples_ttfb": len(tally.ttfb),
        "samples_gap": len(tally.gaps),
        "errors": tally.errors,
        "first_error": tally.first_error,
        "seconds": wall,
        "loadgen_core": (cpu_self() - cpu0) / wall,
    }


# -- held idle streams ----------------------------------------------------------------------------


async def hold(
    url: str,
    steps: list[int],
    rss_kib: Callable[[], int],
    *,
    parallel_connects: int = 200,
    settle: float = 0.5,
    step_timeout: float = 60.0,
) -> dict[str, Any]:
    """Open idle streams (headers + first event, then silence) up to each count in ``steps``, and
    after each step record the target's RSS. Returns KiB per held stream at each step."""
    release = asyncio.Event()
    gate = asyncio.Semaphore(parallel_connects)
    opened = 0
    failed = 0
    first_error: str | None = None
    tasks: list[asyncio.Task[None]] = []
    cpu0, wall0 = cpu_self(), time.perf_counter()
    out: dict[str, Any] = {"steps": []}
    async with session() as http:

        async def one() -> None:
            nonlocal opened, failed, first_error
            async with gate:
                try:
                    resp = await http.get(url)
                    await resp.content.readany()
                except (aiohttp.ClientError, OSError) as exc:
                    failed += 1
                    first_error = first_error or f"{type(exc).__name__}: {exc}"
                    return
                opened += 1
            try:
                await release.wait()
            finally:
                resp.close()

        await asyncio.sleep(settle)
        base = rss_kib()
        out["rss_base_kib"] = base
        for step in steps:
            t0 = time.perf_counter()
            tasks += [asyncio.ensure_future(one()) for _ in range(step - len(tasks))]
            while opened + failed < step and time.perf_counter() - t0 < step_timeout:
                await asyncio.sleep(0.05)
            open_secs = time.perf_counter() - t0
            await asyncio.sleep(settle)
            rss = rss_kib()
            out["steps"].append(
                {
                    "target_streams": step,
                    "held": opened,
                    "failed": failed,
                    "open_seconds": open_secs,
                    "rss_kib": rss,
                    "kib_per_stream": (rss - base) / opened if opened else None,
                }
            )
        release.set()
        await asyncio.wait(tasks, timeout=30)
    out["first_error"] = first_error
    out["loadgen_core"] = (cpu_self() - cpu0) / (time.perf_counter() - wall0)
    return out


# -- WebSocket sessions ---------------------------------------------------------------------------


async def ws_handshake(url: str) -> int | None:
    """One WebSocket handshake: 101 when the target forwards the upgrade, else the status it
    answered, ``None`` for no answer."""
    async with session() as http:
        try:
            async with http.ws_connect(url, timeout=aiohttp.ClientWSTimeout(ws_close=5)) as ws:
                await ws.close()
        except aiohttp.WSServerHandshakeError as exc:
            return exc.status
        except (TimeoutError, aiohttp.ClientError, OSError):
            return None
    return 101


async def ws_echo(url: str, sessions: int, duration: float, *, message_bytes: int, warmup: float) -> dict[str, Any]:
    """Closed loop on ``sessions`` WebSocket sessions: each sends a text message of
    ``message_bytes`` and waits for its echo, again and again. A message is one frame through the
    proxy, so a round trip is two; counted in the window after ``warmup``."""
    payload = "m" * message_bytes
    rtts: list[float] = []
    in_window = 0
    total = 0
    errors = 0
    first_error: str | None = None
    cpu0, wall0 = cpu_self(), time.perf_counter()
    warm_at, end_at = wall0 + warmup, wall0 + warmup + duration
    async with session() as http:

        async def client() -> None:
            nonlocal in_window, total, errors, first_error
            try:
                async with http.ws_connect(url, timeout=aiohttp.ClientWSTimeout(ws_close=5)) as ws:
                    while (t0 := time.perf_counter()) < end_at:
                        await ws.send_str(payload)
                        msg = await ws.receive(timeout=10)
                        if msg.type is not aiohttp.WSMsgType.TEXT or len(msg.data) != message_bytes:
                            raise RuntimeError(f"unexpected {msg.type.name} frame")
                        now = time.perf_counter()
                        total += 2
                        if warm_at <= t0 and now < end_at:
                            in_window += 2
                            rtts.append(now - t0)
            except (TimeoutError, aiohttp.ClientError, OSError, RuntimeError) as exc:
                errors += 1
                first_error = first_error or f"{type(exc).__name__}: {exc}"

        await asyncio.gather(*(client() for _ in range(sessions)))
    wall = time.perf_counter() - wall0
    pct = stats.percentiles(rtts)
    return {
        "client": "aiohttp",
        "sessions": sessions,
        "message_bytes": message_bytes,
        "messages_per_s": in_window / duration,
        "messages_total": total,
        "rtt_p50_ms": pct["p50"] * 1000,
        "rtt_p99_ms": pct["p99"] * 1000,
        "errors": errors,
        "first_error": first_error,
        "seconds": wall,
        "loadgen_core": (cpu_self() - cpu0) / wall,
    }


async def ws_hold(
    url: str,
    count: int,
    rss_kib: Callable[[], int],
    *,
    parallel_connects: int = 200,
    settle: float = 0.5,
    timeout: float = 120.0,
) -> dict[str, Any]:
    """Open ``count`` WebSocket sessions that then stay idle, and record the target's RSS before and
    after. Returns KiB per open session."""
    release = asyncio.Event()
    gate = asyncio.Semaphore(parallel_connects)
    opened = 0
    failed = 0
    first_error: str | None = None
    cpu0, wall0 = cpu_self(), time.perf_counter()
    async with session() as http:

        async def one() -> None:
            nonlocal opened, failed, first_error
            async with gate:
                try:
                    ws = await http.ws_connect(url, timeout=aiohttp.ClientWSTimeout(ws_close=5), autoping=True)
                except (aiohttp.ClientError, OSError) as exc:
                    failed += 1
                    first_error = first_error or f"{type(exc).__name__}: {exc}"
                    return
                opened += 1
            try:
                await release.wait()
            finally:
                await ws.close()

        await asyncio.sleep(settle)
        base = rss_kib()
        t0 = time.perf_counter()
        tasks = [asyncio.ensure_future(one()) for _ in range(count)]
        while opened + failed < count and time.perf_counter() - t0 < timeout:
            await asyncio.sleep(0.05)
        open_secs = time.perf_counter() - t0
        await asyncio.sleep(settle)
        rss = rss_kib()
        release.set()
        await asyncio.wait(tasks, timeout=30)
    return {
        "sessions_asked": count,
        "sessions_open": opened,
        "sessions_failed": failed,
        "first_error": first_error,
        "open_seconds": open_secs,
        "rss_base_kib": base,
        "rss_kib": rss,
        "kib_per_session": (rss - base) / opened if opened else None,
        "errors": failed,
        "loadgen_core": (cpu_self() - cpu0) / (time.perf_counter() - wall0),
    }
