"""The HTTP workloads of the bench, each round against every target: small GETs, SSE streams (back to
back, in one upstream write, paced at each concurrency of the plan), 1 MiB uploads and idle held
streams (a fresh process per round)."""

from __future__ import annotations

import asyncio
from typing import Any

from bench import loadgen, targets
from bench.harness import Group, Harness, Plan, Workload, fresh_rss

HTTP = Group("http", "HTTP")


async def small_get(bench: Harness, name: str, round_no: int) -> None:
    for target in bench.targets:
        await bench.measure(round_no, name, target, "requests", lambda t=target: bench.small_get(t))


async def sse_burst(bench: Harness, name: str, round_no: int) -> None:
    plan = bench.plan
    for target in bench.targets:
        await bench.measure(
            round_no,
            name,
            target,
            "events_total",
            lambda t=target: bench.sse(t, plan.burst_concurrency, plan.burst_chunks, 0),
        )


async def sse_oneread(bench: Harness, name: str, round_no: int) -> None:
    plan = bench.plan
    for target in bench.targets:
        await bench.measure(
            round_no,
            name,
            target,
            "events_total",
            lambda t=target: bench.sse(t, plan.burst_concurrency, plan.burst_chunks, 0, oneread=True),
        )


async def sse_paced(bench: Harness, name: str, round_no: int) -> None:
    plan = bench.plan
    for concurrency in plan.paced_concurrency:
        for target in bench.targets:
            await bench.measure(
                round_no,
                f"{name}_{concurrency}",
                target,
                "events_total",
                lambda t=target, c=concurrency: bench.sse(t, c, plan.paced_chunks, plan.paced_interval_ms),
            )


async def upload(bench: Harness, name: str, round_no: int) -> None:
    for target in bench.targets:
        await bench.measure(round_no, name, target, "requests", lambda t=target: _upload(bench, t))


async def _upload(bench: Harness, target: targets.Target) -> dict[str, Any]:
    plan = bench.plan
    url = target.url + "/upload"
    size = plan.upload_bytes
    if plan.use_wrk and loadgen.wrk_available():
        return await asyncio.to_thread(
            loadgen.wrk,
            url,
            plan.upload_connections,
            plan.seconds,
            upload_bytes=size,
            cpus=bench.loadgen_cpus,
        )
    return await loadgen.requests(url, plan.upload_connections, plan.seconds, upload_bytes=size)


async def idle_hold(bench: Harness, name: str, round_no: int) -> None:
    for target in bench.targets:
        if target.name != "direct":
            await _hold(bench, name, target, round_no)


async def _hold(bench: Harness, name: str, target: targets.Target, round_no: int) -> None:
    """Fresh instance per round, so the per-stream figure is not flattered by memory a previous
    workload left allocated."""
    fresh = type(target)(target.name, target.label, drain_signal=target.drain_signal)
    steps = [min(step, bench.max_held) for step in bench.plan.hold_steps]
    fresh.start(bench.ctx, instance=f"-hold-r{round_no}")
    try:
        url = fresh.url + "/v1/completions?hold=1"
        await bench.measure(
            round_no,
            name,
            fresh,
            None,
            lambda: loadgen.hold(url, steps, fresh_rss(fresh), settle=bench.plan.hold_settle_secs),
        )
    finally:
        fresh.stop()


def _paced_records(name: str, plan: Plan) -> list[str]:
    return [f"{name}_{c}" for c in plan.paced_concurrency]


WORKLOADS = (
    Workload("small_get", HTTP, small_get),
    Workload("sse_burst", HTTP, sse_burst),
    Workload("sse_oneread", HTTP, sse_oneread),
    # One record per concurrency of the plan: sse_paced_16, sse_paced_256, ...
    Workload("sse_paced", HTTP, sse_paced, suffixed=True, records=_paced_records),
    Workload("upload_1mib", HTTP, upload),
    Workload("idle_hold", HTTP, idle_hold),
)
