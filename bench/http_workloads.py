"""The HTTP workloads of the bench, each round against every target: small GETs, SSE streams (back to
back, in one upstream write, paced at each concurrency of the plan), 1 MiB uploads and idle held
streams (a fresh process per round); and, against the targets of :data:`targets.FOLLOWED_TARGETS`
only, streamed completions the front follows (``sse_followed``)."""

from __future__ import annotations

import asyncio
import json
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


#: The prompt of a followed completion: a short instruction, about the size of a chat turn.
FOLLOWED_PROMPT = "Write one short sentence about load balancers, then stop. " * 4


def followed_body(max_tokens: int) -> bytes:
    """A streamed OpenAI completion request, as a client sends it: what ``drain-router front`` keeps
    and follows (``stream: true``, a text prompt, nothing that rules continuing out)."""
    request = {"model": "bench", "prompt": FOLLOWED_PROMPT, "stream": True, "max_tokens": max_tokens}
    return json.dumps(request).encode()


async def sse_followed(bench: Harness, name: str, round_no: int) -> None:
    """The burst's streams (same concurrency, events back to back), each a ``POST
    /v1/completions`` with a JSON body asking for as many tokens as it gets events: the front keeps
    the body and follows every event (one ``json.loads`` each, whole events only); the router relays
    the same request as any other. Against :data:`targets.FOLLOWED_TARGETS` only: another proxy
    relays a ``POST`` stream as it does ``sse_burst``'s ``GET``."""
    plan = bench.plan
    body = followed_body(plan.burst_chunks)
    for target in bench.targets:
        if target.name not in targets.FOLLOWED_TARGETS:
            continue
        await bench.measure(
            round_no,
            name,
            target,
            "events_total",
            lambda t=target: bench.sse(t, plan.burst_concurrency, plan.burst_chunks, 0, body=body),
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
    Workload("sse_followed", HTTP, sse_followed),
    # One record per concurrency of the plan: sse_paced_16, sse_paced_256, ...
    Workload("sse_paced", HTTP, sse_paced, suffixed=True, records=_paced_records),
    Workload("upload_1mib", HTTP, upload),
    Workload("idle_hold", HTTP, idle_hold),
)
