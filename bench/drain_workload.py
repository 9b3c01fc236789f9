"""The drain workload of the bench, each round against every target with a graceful-stop signal (the
plan's ``drain_targets`` only, when it names some): a fresh process with paced streams open gets its
drain signal; the cell is the time to readiness 503 and from the last stream's end to the exit."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import Any

import aiohttp

from bench import loadgen, targets
from bench.harness import Harness, Workload
from bench.http_workloads import HTTP


async def drain(bench: Harness, name: str, round_no: int) -> None:
    plan = bench.plan
    for target in bench.targets:
        wanted = plan.drain_targets is None or target.name in plan.drain_targets
        if target.drain_signal is not None and wanted:
            await _drain(bench, name, target, round_no)


async def _drain(bench: Harness, name: str, target: targets.Target, round_no: int) -> None:
    fresh = type(target)(target.name, target.label, drain_signal=target.drain_signal)
    if fresh.name == "router":
        fresh.extra_args = ["--shutdown-drain-secs", str(bench.plan.drain_window_secs)]
    fresh.start(bench.ctx, instance=f"-drain-r{round_no}")
    try:
        await bench.measure(round_no, name, fresh, None, lambda: _measure(bench, fresh))
    finally:
        fresh.stop()


async def _measure(bench: Harness, target: targets.Target) -> dict[str, Any]:
    """1. N paced streams open 2. poll readiness 3. drain signal at t0 4. readiness 503 at t1
    5. every stream runs to its end 6. the process exits. Result: t1 - t0 and exit - last end."""
    plan = bench.plan
    proc = target.proc
    assert proc is not None and target.drain_signal is not None
    exited: dict[str, Any] = {}

    def wait_exit() -> None:
        exited["rc"] = proc.wait()
        exited["at"] = time.perf_counter()

    watcher = threading.Thread(target=wait_exit, daemon=True)
    watcher.start()
    url = f"{target.url}/v1/completions?chunks={plan.drain_chunks}&interval_ms={plan.drain_interval_ms:g}"
    opened = 0
    all_open = asyncio.Event()
    sent_at: float | None = None
    not_ready_at: float | None = None

    async def stream(http: Any) -> tuple[float, int]:
        nonlocal opened
        events = 0
        async with http.get(url) as resp:
            async for data in resp.content.iter_any():
                if not events:
                    opened += 1
                    if opened == plan.drain_streams:
                        all_open.set()
                events += data.count(b"\n\n")
        return time.perf_counter(), events

    async def poll(ready_url: str) -> None:
        nonlocal not_ready_at
        async with loadgen.session() as probe:
            while True:
                try:
                    async with probe.get(ready_url) as resp:
                        await resp.read()
                        status: int | None = resp.status
                except (OSError, aiohttp.ClientError):
                    status = None
                if sent_at is not None and status != 200:
                    not_ready_at = time.perf_counter()
                    return
                await asyncio.sleep(0.001)

    ready_url = target.readiness_url()
    async with loadgen.session() as http:
        tasks = [asyncio.ensure_future(stream(http)) for _ in range(plan.drain_streams)]
        await asyncio.wait_for(all_open.wait(), 10)
        poller = asyncio.ensure_future(poll(ready_url)) if ready_url else None
        await asyncio.sleep(0.1)
        sent_at = time.perf_counter()
        os.kill(proc.pid, target.drain_signal)
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        if poller:
            try:
                await asyncio.wait_for(poller, 5)
            except TimeoutError:
                pass
    finished = [o for o in outcomes if isinstance(o, tuple) and o[1] >= plan.drain_chunks + 1]
    last_end = max((o[0] for o in outcomes if isinstance(o, tuple)), default=None)
    await asyncio.to_thread(watcher.join, plan.drain_window_secs + 20)
    exit_at = exited.get("at")
    return {
        "signal": signal.Signals(target.drain_signal).name,
        "streams": plan.drain_streams,
        "streams_complete": len(finished),
        "readyz_503_ms": (not_ready_at - sent_at) * 1000 if not_ready_at and ready_url else None,
        "last_stream_end_ms": (last_end - sent_at) * 1000 if last_end else None,
        "exit_after_last_stream_ms": (exit_at - last_end) * 1000 if exit_at and last_end else None,
        "signal_to_exit_ms": (exit_at - sent_at) * 1000 if exit_at else None,
        "exit_code": exited.get("rc"),
        "errors": sum(1 for o in outcomes if isinstance(o, BaseException)),
    }


WORKLOADS = (Workload("drain", HTTP, drain),)
